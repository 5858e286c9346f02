/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The userfaultfd patch (kernel/patches/uffd-remove-done/) from user space, without the
 * project's library: UFFD_FEATURE_EVENT_REMOVE_DONE is offered, and every UFFD_EVENT_REMOVE is
 * followed by a UFFD_EVENT_REMOVE_DONE of the same range, sent by the remover after its zap, so
 * that when the monitor has read it the pages are gone (pagemap: not present), for
 * MADV_DONTNEED (anonymous) and MADV_REMOVE (shmem). Between the two events, UFFDIO_ZEROPAGE
 * into the range fails with EAGAIN (mmap_changing stays raised until the end). Without the
 * feature requested, a REMOVE has no end (the stock behaviour, checked too).
 *
 * Prints UMN-RESULT lines (impl "patched"); run only on the patched guest kernel.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"

#ifndef UFFD_FEATURE_EVENT_REMOVE_DONE
#define UFFD_FEATURE_EVENT_REMOVE_DONE (1ULL << 30)
#endif
#ifndef UFFD_EVENT_REMOVE_DONE
#define UFFD_EVENT_REMOVE_DONE 0x17
#endif

#include "check.h"

#define PAGES 8
static size_t page;

static int uffd_open(uint64_t features)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK); /* poll needs it */
	CHECK(fd >= 0);
	struct uffdio_api api = { .api = UFFD_API, .features = features };
	if (ioctl(fd, UFFDIO_API, &api) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void watch(int fd, char *p, size_t len)
{
	struct uffdio_register r = {
		.range = { .start = (uintptr_t)p, .len = len },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	CHECK(ioctl(fd, UFFDIO_REGISTER, &r) == 0);
}

static struct uffd_msg next_msg(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	struct uffd_msg m;
	CHECK(poll(&pfd, 1, 10000) == 1);
	CHECK(read(fd, &m, sizeof m) == sizeof m);
	return m;
}

static int present(char *p)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);
	uint64_t e;
	CHECK(fd >= 0);
	CHECK(pread(fd, &e, 8, (off_t)((uintptr_t)p / page * 8)) == 8);
	close(fd);
	return (int)(e >> 63 & 1);
}

struct job {
	char *p;
	size_t len;
	int advice;
	int ret;
};

static void *remover(void *arg)
{
	struct job *j = arg;
	j->ret = madvise(j->p, j->len, j->advice);
	return NULL;
}

static void offered(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK); /* poll needs it */
	CHECK(fd >= 0);
	struct uffdio_api api = { .api = UFFD_API, .features = 0 };
	CHECK(ioctl(fd, UFFDIO_API, &api) == 0);
	CHECK(api.features & UFFD_FEATURE_EVENT_REMOVE_DONE);
	close(fd);
}

/* One madvise of the whole mapping by another thread; the events as the monitor sees them. */
static void remove_then_done(char *p, size_t len, int advice)
{
	int fd = uffd_open(UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMOVE_DONE);
	CHECK(fd >= 0);
	memset(p, 1, len);
	watch(fd, p, len);
	struct job j = { .p = p, .len = len, .advice = advice };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, remover, &j) == 0);
	struct uffd_msg m = next_msg(fd);
	CHECK(m.event == UFFD_EVENT_REMOVE);
	CHECK(m.arg.remove.start == (uintptr_t)p && m.arg.remove.end == (uintptr_t)p + len);
	/* The zap is in progress (or still to come): nothing may be put into the range. */
	struct uffdio_zeropage z = { .range = { .start = (uintptr_t)p, .len = page } };
	int zr = ioctl(fd, UFFDIO_ZEROPAGE, &z);
	CHECK(zr == -1 && errno == EAGAIN);
	m = next_msg(fd);
	CHECK(m.event == UFFD_EVENT_REMOVE_DONE);
	CHECK(m.arg.remove.start == (uintptr_t)p && m.arg.remove.end == (uintptr_t)p + len);
	/* The end was sent after the zap: every page is gone now, before madvise returns. */
	for (size_t i = 0; i < len / page; i++)
		CHECK(!present(p + i * page));
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(j.ret == 0);
	close(fd);
}

static void test_offered(void)
{
	offered();
}

static void test_dontneed_ends_after_the_zap(void)
{
	char *p = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	CHECK(p != MAP_FAILED);
	remove_then_done(p, PAGES * page, MADV_DONTNEED);
}

static void test_remove_shmem_ends_after_the_punch(void)
{
	int mfd = memfd_create("umn", MFD_CLOEXEC);
	CHECK(mfd >= 0);
	CHECK(ftruncate(mfd, (off_t)(PAGES * page)) == 0);
	char *p = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	CHECK(p != MAP_FAILED);
	remove_then_done(p, PAGES * page, MADV_REMOVE);
}

/* Without the feature: one REMOVE and nothing after it (the stock ABI is unchanged). */
static void test_stock_abi_has_no_end(void)
{
	int fd = uffd_open(UFFD_FEATURE_EVENT_REMOVE);
	CHECK(fd >= 0);
	char *p = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	CHECK(p != MAP_FAILED);
	memset(p, 1, PAGES * page);
	watch(fd, p, PAGES * page);
	struct job j = { .p = p, .len = PAGES * page, .advice = MADV_DONTNEED };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, remover, &j) == 0);
	struct uffd_msg m = next_msg(fd);
	CHECK(m.event == UFFD_EVENT_REMOVE);
	CHECK(pthread_join(t, NULL) == 0);
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 100) == 0);
	close(fd);
}

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	harness_run("uffd_remove_done", "offered", test_offered, 30);
	harness_run("uffd_remove_done", "dontneed_ends_after_the_zap",
		    test_dontneed_ends_after_the_zap, 30);
	harness_run("uffd_remove_done", "remove_shmem_ends_after_the_punch",
		    test_remove_shmem_ends_after_the_punch, 30);
	harness_run("uffd_remove_done", "stock_abi_has_no_end", test_stock_abi_has_no_end, 30);
	return harness_failed;
}

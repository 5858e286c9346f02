/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The REMOVE stress, written against the 2010 ABI only, so it runs against the module and
 * against the preload: one thread keeps dropping (madvise DONTNEED) and re-touching 16 pages;
 * the main thread keeps registering one of them, pinning it (an io_uring fixed buffer: the
 * pinned page can not be freed and reused), and then checking it the way Open MPI did
 * (counter == last LAST, else read the events). Oracle: /proc/self/pagemap. Once the page
 * mapped at the address is a different frame from the pinned one, the pin is stale; a check
 * made after that which still calls the registration valid is a stale hit.
 *
 * A registration made after a madvise began but before its zap pins the frame about to be
 * dropped: the module invalidates it at invalidate_range_end; userfaultfd's REMOVE has no end.
 *
 * Prints one UMN-RESULT line (PASS when no stale hit) and a UMN-STRESS line with the counts.
 * Usage: remove_stress [seconds]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "ummunotify.h"

#define BUFS 16
#include "check.h"

static size_t page;
static char *bufs;
static atomic_int stop;
static atomic_long drops;
static int pagemap_fd;

static uint64_t pfn_of(void *addr)
{
	uint64_t e;
	off_t off = (off_t)((uintptr_t)addr / page * 8);
	CHECK(pread(pagemap_fd, &e, 8, off) == 8);
	if (!(e >> 63 & 1))
		return 0; /* not present (being zapped, or not yet re-touched) */
	return e & ((1ULL << 55) - 1);
}

static void *dropper(void *arg)
{
	(void)arg;
	unsigned stamp = 0;
	while (!atomic_load(&stop)) {
		for (int i = 0; i < BUFS; i++) {
			CHECK(madvise(bufs + i * page, page, MADV_DONTNEED) == 0);
			bufs[i * page] = (char)++stamp; /* a new frame */
			atomic_fetch_add(&drops, 1);
		}
	}
	return NULL;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *impl = getenv("UMN_IMPL") ? getenv("UMN_IMPL") : "unknown";
	double secs = argc > 1 ? atof(argv[1]) : 5;
	page = (size_t)sysconf(_SC_PAGESIZE);
	pagemap_fd = open("/proc/self/pagemap", O_RDONLY);
	CHECK(pagemap_fd >= 0);
	int fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
	CHECK(fd >= 0);
	volatile __u64 *counter = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(counter != MAP_FAILED);
	struct io_uring_params params;
	memset(&params, 0, sizeof params);
	int ring = (int)syscall(__NR_io_uring_setup, 4, &params);
	CHECK(ring >= 0); /* the pin is the oracle: without it frames could be reused */

	bufs = mmap(NULL, BUFS * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(bufs != MAP_FAILED);
	memset(bufs, 1, BUFS * page);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, dropper, NULL) == 0);

	__u64 last = *counter, cookie = 0;
	long checks = 0, stale = 0, changed = 0, caught = 0, iters = 0;
	struct ummunotify_event ev[128];
	double end = now() + secs;
	while (now() < end) {
		char *b = bufs + (iters++ % BUFS) * page;
		__u64 mine = ++cookie;
		struct ummunotify_register_ioctl r = {
			.start = (uintptr_t)b, .end = (uintptr_t)(b + page), .user_cookie = mine};
		CHECK(ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r) == 0);
		struct iovec iov = {b, page};
		CHECK(syscall(__NR_io_uring_register, ring, IORING_REGISTER_BUFFERS, &iov, 1) == 0);
		uint64_t pinned = pfn_of(b);
		int invalid = 0;
		double give_up = now() + 0.05;
		while (pinned && !invalid && now() < give_up) {
			uint64_t cur = pfn_of(b);
			/* The check, made after seeing the frame change. */
			if (*counter != last) {
				for (;;) {
					ssize_t n = read(fd, ev, sizeof ev);
					if (n < 0 && errno == EAGAIN)
						break;
					CHECK(n > 0);
					for (ssize_t i = 0; i < n / 32; i++) {
						if (ev[i].type == UMMUNOTIFY_EVENT_TYPE_LAST)
							last = ev[i].user_cookie_counter;
						else if (ev[i].user_cookie_counter == mine)
							invalid = 1;
					}
				}
			}
			checks++;
			if (cur && cur != pinned) {
				changed++;
				if (invalid)
					caught++;
				else
					stale++;
				break;
			}
		}
		CHECK(syscall(__NR_io_uring_register, ring, IORING_UNREGISTER_BUFFERS, NULL, 0) == 0);
		CHECK(ioctl(fd, UMMUNOTIFY_UNREGISTER_REGION, &mine) == 0);
	}
	atomic_store(&stop, 1);
	pthread_join(t, NULL);
	printf("UMN-STRESS %s remove_stress registrations=%ld checks=%ld frame_changes=%ld "
	       "caught=%ld stale=%ld drops=%ld seconds=%.1f\n",
	       impl, iters, checks, changed, caught, stale, atomic_load(&drops), secs);
	printf("UMN-RESULT %s remove_stress/madvise_vs_register %s%s\n", impl,
	       stale ? "FAIL" : "PASS", stale ? " stale hits" : "");
	return stale ? 1 : 0;
}

/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The module's teardown paths, for the debug guest (kernel/debug.config: lockdep, kmemleak,
 * KASAN): the last close of a descriptor while another thread is blocked in read() or poll()
 * on it, or while other threads invalidate its regions; a process that exits with a thread
 * blocked in read() and regions registered; a forked child that exits holding the parent's
 * descriptor and mappings. Each test checks what user space sees; what the kernel's checkers
 * see is judged from dmesg and kmemleak (kernel/compare.py --debug). Module only: the preload
 * is not what these paths test. Each test runs in its own child; see harness.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ummunotify.h"
#include "harness.h"

#include "check.h"

static size_t page;

static int open_dev(void)
{
	int fd = open("/dev/ummunotify", O_RDONLY);

	if (fd < 0 && (errno == ENODEV || errno == ENOENT)) {
		printf("SKIP: open(/dev/ummunotify): %s\n", strerror(errno));
		exit(77);
	}
	CHECK(fd >= 0);
	return fd;
}

static char *map(size_t pages)
{
	char *p = mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);

	CHECK(p != MAP_FAILED);
	memset(p, 7, pages * page);
	return p;
}

static int reg(int fd, void *start, void *end, __u64 cookie)
{
	struct ummunotify_register_ioctl r = {
		.start = (uintptr_t)start, .end = (uintptr_t)end, .user_cookie = cookie};

	return ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r);
}

struct blocked {
	int fd;
	int syscall_nr;		/* what the thread blocks in */
	volatile pid_t tid;
	ssize_t ret;
	int err;
	struct ummunotify_event ev[4];
};

static void *block_in_read(void *arg)
{
	struct blocked *b = arg;

	b->tid = (pid_t)syscall(SYS_gettid);
	b->ret = read(b->fd, b->ev, sizeof(b->ev));
	b->err = errno;
	return NULL;
}

static void *block_in_poll(void *arg)
{
	struct blocked *b = arg;
	struct pollfd pfd = { .fd = b->fd, .events = POLLIN };

	b->tid = (pid_t)syscall(SYS_gettid);
	/* The poll system call itself (what wait_blocked looks for), not glibc's choice. */
	b->ret = syscall(SYS_poll, &pfd, 1, 20000);
	b->err = errno;
	return NULL;
}

/* Waits (up to 10 s) until the thread is asleep in the system call it was started for. */
static void wait_blocked(struct blocked *b)
{
	char path[64], buf[64];

	for (int i = 0; i < 10000; i++) {
		if (b->tid) {
			snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)b->tid);
			int f = open(path, O_RDONLY);
			ssize_t n = f >= 0 ? read(f, buf, sizeof(buf) - 1) : -1;

			if (f >= 0)
				close(f);
			if (n > 0) {
				buf[n] = 0;
				if (atoi(buf) == b->syscall_nr && buf[0] != 'r')
					return;
			}
		}
		usleep(1000);
	}
	CHECK(!"the thread never blocked");
}

/* close() while a thread is blocked in read(): the read keeps the file, and still gets the
 * event of an munmap done after the close; the file is released when that read returns.
 */
static void test_close_while_blocked_in_read(void)
{
	struct blocked b = { .fd = open_dev(), .syscall_nr = SYS_read };
	char *p = map(1);
	pthread_t t;

	CHECK(reg(b.fd, p, p + page, 11) == 0);
	CHECK(pthread_create(&t, NULL, block_in_read, &b) == 0);
	wait_blocked(&b);
	CHECK(close(b.fd) == 0);
	CHECK(munmap(p, page) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(b.ret == 64 && b.ev[0].user_cookie_counter == 11 &&
	      b.ev[1].type == UMMUNOTIFY_EVENT_TYPE_LAST);
}

/* The same with poll(): poll holds its own reference while it waits. */
static void test_close_while_blocked_in_poll(void)
{
	struct blocked b = { .fd = open_dev(), .syscall_nr = SYS_poll };
	char *p = map(1);
	pthread_t t;

	CHECK(reg(b.fd, p, p + page, 12) == 0);
	CHECK(pthread_create(&t, NULL, block_in_poll, &b) == 0);
	wait_blocked(&b);
	CHECK(close(b.fd) == 0);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	/* Woken by the event (the file lived on in poll's own reference): 1 descriptor ready,
	 * POLLIN or, as it was closed meanwhile, POLLNVAL. 0 would be the 20 s timeout.
	 */
	CHECK(b.ret == 1);
	munmap(p, page);
}

struct churn {
	char *p;
	size_t pages;
	volatile int stop;
};

static void *invalidate_loop(void *arg)
{
	struct churn *c = arg;

	while (!c->stop) {
		for (size_t i = 0; i < c->pages; i++) {
			c->p[i * page] = 1;
			madvise(c->p + i * page, page, MADV_DONTNEED);
		}
	}
	return NULL;
}

/* The last close of descriptors with regions while two threads invalidate them: the notifier
 * is unregistered under a stream of invalidate_range_start/_end. 200 rounds.
 */
static void test_close_during_invalidations(void)
{
	struct churn c = { .p = map(16), .pages = 16 };
	pthread_t t[2];

	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&t[i], NULL, invalidate_loop, &c) == 0);
	for (int round = 0; round < 200; round++) {
		int fd = open_dev();

		for (size_t i = 0; i < c.pages; i++)
			CHECK(reg(fd, c.p + i * page, c.p + (i + 1) * page, i + 1) == 0);
		CHECK(close(fd) == 0);
	}
	c.stop = 1;
	for (int i = 0; i < 2; i++)
		CHECK(pthread_join(t[i], NULL) == 0);
	munmap(c.p, c.pages * page);
}

/* A process exits with regions registered, a counter mapping and a thread blocked in read():
 * the mm goes (the notifier's release) before the file does.
 */
static void test_exit_while_blocked(void)
{
	for (int round = 0; round < 20; round++) {
		pid_t pid = fork();

		CHECK(pid >= 0);
		if (pid == 0) {
			struct blocked b = { .fd = open_dev(), .syscall_nr = SYS_read };
			char *p = map(4);
			pthread_t t;

			CHECK(mmap(NULL, page, PROT_READ, MAP_SHARED, b.fd, 0) != MAP_FAILED);
			CHECK(reg(b.fd, p, p + 4 * page, 1) == 0);
			CHECK(reg(b.fd, p + page, p + 2 * page, 2) == 0);
			CHECK(pthread_create(&t, NULL, block_in_read, &b) == 0);
			wait_blocked(&b);
			_exit(0);
		}
		int status;

		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
}

/* A forked child holds the parent's descriptor and (copied) mappings and exits while the
 * parent keeps using them: the child's use is refused (EIO), the parent's events still come.
 */
static void test_fork_child_exits_first(void)
{
	int fd = open_dev();
	char *p = map(2);
	struct ummunotify_event ev[4];
	__u64 cookie = 21;

	CHECK(reg(fd, p, p + 2 * page, cookie) == 0);
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		if (read(fd, ev, sizeof(ev)) != -1 || errno != EIO)
			_exit(2);
		munmap(p, 2 * page);
		close(fd);
		_exit(0);
	}
	int status;

	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* The child's munmap was of its own mm: nothing for the parent's regions but COW's. */
	CHECK(munmap(p, page) == 0);
	CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
	ssize_t r = read(fd, ev, sizeof(ev));

	CHECK(r >= 64 && ev[0].user_cookie_counter == cookie);
	CHECK(close(fd) == 0);
	munmap(p + page, page);
}

#define T(fn) harness_run("lifecycle", #fn, fn, 120)

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	T(test_close_while_blocked_in_read);
	T(test_close_while_blocked_in_poll);
	T(test_close_during_invalidations);
	T(test_exit_while_blocked);
	T(test_fork_child_exits_first);
	return harness_failed ? 1 : 0;
}

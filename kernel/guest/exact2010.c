/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * Exact-value checks of the 2010 /dev/ummunotify ABI that abi2010.c leaves loose: the counter's
 * value after each kind of call (0 at open, +1 per MMU notification that hit a registered
 * region, nothing for unregistered memory), the HINT range, unregister dropping a queued event,
 * and the module's extension (per-region validity words, ioctl 4). Run in the guest against the
 * module and against the user-space preload (kernel/expected-divergences.txt lists where they
 * differ on purpose). Each test runs in its own child; see harness.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ummunotify.h"
#include "harness.h"

#include "check.h"

static size_t page;
static int fd;
static volatile __u64 *counter;

static void open_dev(void)
{
	fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
	if (fd < 0 && (errno == ENODEV || errno == ENOENT || errno == EACCES)) {
		printf("SKIP: open(/dev/ummunotify): %s\n", strerror(errno));
		exit(77);
	}
	CHECK(fd >= 0);
	counter = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(counter != MAP_FAILED);
}

static char *map(size_t pages)
{
	char *p = mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	CHECK(p != MAP_FAILED);
	memset(p, 7, pages * page);
	return p;
}

static int reg(void *start, void *end, __u64 cookie)
{
	struct ummunotify_register_ioctl r = {
		.start = (uintptr_t)start, .end = (uintptr_t)end, .user_cookie = cookie};
	return ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r);
}

static int unreg(__u64 cookie)
{
	return ioctl(fd, UMMUNOTIFY_UNREGISTER_REGION, &cookie);
}

/* One read: returns the number of records, which land in ev. */
static int read_events(struct ummunotify_event *ev, int cap)
{
	ssize_t r = read(fd, ev, (size_t)cap * sizeof *ev);
	if (r < 0)
		return -1;
	CHECK(r % 32 == 0);
	return (int)(r / 32);
}

static void test_counter_zero_at_open(void)
{
	open_dev();
	CHECK(*counter == 0);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == -1 && errno == EAGAIN);
}

/* The 2010 patch's own test program, with exact values. */
static void test_munmap_registered_exactly_one(void)
{
	open_dev();
	char *p = map(3);
	CHECK(reg(p, p + 3 * page, 1) == 0);
	CHECK(*counter == 0);
	CHECK(munmap(p + page, page) == 0);
	CHECK(*counter == 1);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == 2);
	CHECK(ev[0].type == UMMUNOTIFY_EVENT_TYPE_INVAL && ev[0].user_cookie_counter == 1);
	CHECK(ev[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
	CHECK(ev[0].hint_start == (uintptr_t)(p + page) && ev[0].hint_end == (uintptr_t)(p + 2 * page));
	CHECK(ev[1].type == UMMUNOTIFY_EVENT_TYPE_LAST && ev[1].user_cookie_counter == 1);
	CHECK(unreg(1) == 0);
	CHECK(munmap(p, page) == 0);
	CHECK(*counter == 1); /* nothing registered was hit */
	CHECK(read_events(ev, 4) == -1 && errno == EAGAIN);
}

static void test_unregistered_calls_do_not_count(void)
{
	open_dev();
	char *p = map(1), *q = map(2);
	CHECK(reg(p, p + page, 1) == 0);
	CHECK(madvise(q, page, MADV_DONTNEED) == 0);
	CHECK(munmap(q, 2 * page) == 0);
	char *r = map(1);
	CHECK(mmap(r, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == r);
	CHECK(munmap(r, page) == 0);
	CHECK(*counter == 0);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == -1 && errno == EAGAIN);
}

/* Three VMAs under one region (the middle page's protection differs). */
static char *map_three_vmas(void)
{
	char *p = map(3);
	CHECK(mprotect(p + page, page, PROT_READ) == 0);
	return p;
}

static void test_madvise_over_three_vmas_is_three(void)
{
	open_dev();
	char *p = map_three_vmas();
	CHECK(reg(p, p + 3 * page, 1) == 0);
	CHECK(madvise(p, 3 * page, MADV_DONTNEED) == 0);
	CHECK(*counter == 3);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == 2);
	CHECK(ev[0].user_cookie_counter == 1 && ev[0].flags == 0); /* hit three times: no HINT */
	CHECK(ev[0].hint_start == (uintptr_t)p && ev[0].hint_end == (uintptr_t)(p + 3 * page));
	CHECK(ev[1].type == UMMUNOTIFY_EVENT_TYPE_LAST && ev[1].user_cookie_counter == 3);
}

static void test_munmap_over_three_vmas_is_one(void)
{
	open_dev();
	char *p = map_three_vmas();
	CHECK(reg(p, p + 3 * page, 1) == 0);
	CHECK(munmap(p, 3 * page) == 0);
	CHECK(*counter == 1);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == 2);
	CHECK(ev[0].user_cookie_counter == 1 && ev[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
	CHECK(ev[0].hint_start == (uintptr_t)p && ev[0].hint_end == (uintptr_t)(p + 3 * page));
}

static void test_map_fixed_over_registered_is_one(void)
{
	open_dev();
	char *p = map(2);
	CHECK(reg(p, p + 2 * page, 1) == 0);
	CHECK(mmap(p, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p);
	CHECK(*counter == 1);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == 2);
	CHECK(ev[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
	CHECK(ev[0].hint_start == (uintptr_t)p && ev[0].hint_end == (uintptr_t)(p + page));
}

static void test_untouched_madvise_is_one(void)
{
	open_dev();
	char *p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	CHECK(reg(p, p + page, 1) == 0);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0); /* no page was ever present */
	CHECK(*counter == 1);
}

static void test_rearm_after_read(void)
{
	open_dev();
	char *p = map(1);
	CHECK(reg(p, p + page, 1) == 0);
	struct ummunotify_event ev[4];
	for (__u64 i = 1; i <= 3; i++) {
		CHECK(madvise(p, page, MADV_DONTNEED) == 0);
		CHECK(*counter == i);
		CHECK(read_events(ev, 4) == 2);
		CHECK(ev[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT && ev[1].user_cookie_counter == i);
	}
}

static void test_unregister_drops_queued_event(void)
{
	open_dev();
	char *p = map(1);
	CHECK(reg(p, p + page, 1) == 0);
	CHECK(reg(p, p + page, 2) == 0);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0);
	CHECK(*counter == 1);
	CHECK(unreg(1) == 0);
	struct ummunotify_event ev[4];
	CHECK(read_events(ev, 4) == 2);
	CHECK(ev[0].user_cookie_counter == 2 && ev[1].type == UMMUNOTIFY_EVENT_TYPE_LAST);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0);
	CHECK(unreg(2) == 0);
	CHECK(read_events(ev, 4) == -1 && errno == EAGAIN);
	CHECK(*counter == 2);
}

static void test_cookie_reusable_after_unregister(void)
{
	open_dev();
	char *p = map(1);
	CHECK(reg(p, p + page, 5) == 0);
	CHECK(reg(p, p + page, 5) == -1 && errno == EINVAL);
	CHECK(unreg(5) == 0);
	CHECK(reg(p, p + page, 5) == 0);
	CHECK(reg(p + page, p, 6) == -1 && errno == EINVAL); /* end before start */
}

/* 2010: "registration copies the range without checking that it is mapped". */
static void test_unmapped_range_accepted(void)
{
	open_dev();
	char *p = map(2);
	CHECK(munmap(p, 2 * page) == 0);
	CHECK(reg(p, p + 2 * page, 1) == 0);
	CHECK(*counter == 0);
	CHECK(mmap(p, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		   -1, 0) == p);
	CHECK(*counter == 0); /* nothing was there to invalidate */
	p[0] = 1;
	CHECK(munmap(p, 2 * page) == 0);
	CHECK(*counter == 1);
}

static void test_one_notification_many_regions_is_one(void)
{
	open_dev();
	char *p = map(4);
	for (__u64 c = 0; c < 4; c++)
		CHECK(reg(p + c * page, p + (c + 1) * page, 100 + c) == 0);
	CHECK(munmap(p, 4 * page) == 0);
	CHECK(*counter == 1);
	struct ummunotify_event ev[8];
	CHECK(read_events(ev, 8) == 5);
	CHECK(ev[4].type == UMMUNOTIFY_EVENT_TYPE_LAST && ev[4].user_cookie_counter == 1);
}

/* ---- the module's extension: per-region validity words ---- */

static volatile __u64 *map_slots(void)
{
	volatile __u64 *s = mmap(NULL, page, PROT_READ, MAP_SHARED, fd, UMMUNOTIFY_SLOTS_OFFSET);
	CHECK(s != MAP_FAILED);
	return s;
}

static void test_validity_word(void)
{
	open_dev();
	char *p = map(2);
	struct ummunotify_register_slot_ioctl a = {
		.start = (uintptr_t)p, .end = (uintptr_t)(p + page), .user_cookie = 1};
	struct ummunotify_register_slot_ioctl b = {
		.start = (uintptr_t)(p + page), .end = (uintptr_t)(p + 2 * page), .user_cookie = 2};
	CHECK(ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, &a) == 0);
	CHECK(ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, &b) == 0);
	CHECK(a.slot != b.slot && a.slot < page / 8 && b.slot < page / 8);
	volatile __u64 *s = map_slots();
	CHECK(s[a.slot] == a.generation && s[b.slot] == b.generation);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0);
	CHECK(s[a.slot] != a.generation); /* visible when madvise returns */
	CHECK(s[b.slot] == b.generation); /* the other region is untouched */
	CHECK(*counter == 1);
	/* Unregistering also changes the word: a stale holder of the slot never matches. */
	__u64 gen_b = b.generation;
	CHECK(unreg(2) == 0);
	CHECK(s[b.slot] != gen_b);
	/* A forked child's view never matches any generation; its descriptor is dead. */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		CHECK(s[a.slot] == ~0ULL && *counter >> 63 == 1);
		CHECK(ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, &a) == -1 && errno == EIO);
		_exit(0);
	}
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The slot area mapped before any region exists (mmap runs under mmap_lock: the module must
   not register its MMU notifier from there). */
static void test_validity_word_mapped_first(void)
{
	open_dev();
	volatile __u64 *s = map_slots();
	char *p = map(1);
	struct ummunotify_register_slot_ioctl a = {
		.start = (uintptr_t)p, .end = (uintptr_t)(p + page), .user_cookie = 1};
	CHECK(ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, &a) == 0);
	CHECK(s[a.slot] == a.generation);
	CHECK(munmap(p, page) == 0);
	CHECK(s[a.slot] != a.generation && *counter == 1);
}

static void test_region_limit(void)
{
	/* The module's default limit is 131072 regions per descriptor; the one past it is ENOSPC
	   and leaves the state as it was. */
	open_dev();
	char *p = map(1);
	__u64 c;
	for (c = 0; c < 131072; c++)
		CHECK(reg(p, p + page, c) == 0);
	CHECK(reg(p, p + page, c) == -1 && errno == ENOSPC);
	CHECK(unreg(0) == 0);
	CHECK(reg(p, p + page, c) == 0);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0 && *counter == 1);
}

#define T(fn) harness_run("exact2010", #fn, fn, 120)

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	T(test_counter_zero_at_open);
	T(test_munmap_registered_exactly_one);
	T(test_unregistered_calls_do_not_count);
	T(test_madvise_over_three_vmas_is_three);
	T(test_munmap_over_three_vmas_is_one);
	T(test_map_fixed_over_registered_is_one);
	T(test_untouched_madvise_is_one);
	T(test_rearm_after_read);
	T(test_unregister_drops_queued_event);
	T(test_cookie_reusable_after_unregister);
	T(test_unmapped_range_accepted);
	T(test_one_notification_many_regions_is_one);
	T(test_validity_word);
	T(test_validity_word_mapped_first);
	T(test_region_limit);
	return 0;
}

/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The limit, measured: what the 2010 API costs through /dev/ummunotify, run once against the
 * module and once under LD_PRELOAD=libummunotify-compat.so (userfaultfd), in the same guest.
 * Each operation's median is printed with the median of its baseline measured in the same run,
 * as one line (the "ns" fields are TSC ticks: see ns() below)
 *     UMN-BENCH <impl> <operation> ns=<median> base=<baseline> base_ns=<median>
 * The guest is emulated (QEMU TCG): compare ratios, not nanoseconds.
 * Usage: bench <impl-name>
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "ummunotify.h"

#include "check.h"

#define N 301
#define STORM 100000

static const char *impl;
static size_t page;
static int fd = -1;
static volatile __u64 *counter;
static __u64 cookie = 1;

/* Time in TSC ticks: the tiny guest kernel has no fine clocksource under TCG (its
   CLOCK_MONOTONIC moves in jiffies), and only ratios are reported anyway. */
static uint64_t ns(void)
{
	return __rdtsc();
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp);
	return v[n / 2];
}

static void report(const char *op, uint64_t v, const char *base, uint64_t base_ns)
{
	printf("UMN-BENCH %s %s ns=%llu base=%s base_ns=%llu\n", impl, op, (unsigned long long)v,
	       base, (unsigned long long)base_ns);
	fflush(stdout);
}

static char *touched_page(void)
{
	char *p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	p[0] = 1;
	return p;
}

static int reg(void *start, void *end, __u64 c)
{
	struct ummunotify_register_ioctl r = {
		.start = (uintptr_t)start, .end = (uintptr_t)end, .user_cookie = c};
	return ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r);
}

static void unreg(__u64 c)
{
	CHECK(ioctl(fd, UMMUNOTIFY_UNREGISTER_REGION, &c) == 0);
}

static long drain(void)
{
	static struct ummunotify_event ev[128];
	long n = 0;
	for (;;) {
		ssize_t r = read(fd, ev, sizeof ev);
		if (r < 0 && errno == EAGAIN)
			return n;
		CHECK(r > 0);
		n += r / 32;
	}
}

/* munmap of one touched page; registered: a region covers it. */
static uint64_t munmap_cost(int registered)
{
	uint64_t t[N];
	for (int i = 0; i < N; i++) {
		char *p = touched_page();
		__u64 c = cookie++;
		if (registered)
			CHECK(reg(p, p + page, c) == 0);
		uint64_t a = ns();
		CHECK(munmap(p, page) == 0);
		t[i] = ns() - a;
		if (registered) {
			drain();
			unreg(c);
		}
	}
	return median(t, N);
}

static uint64_t madvise_cost(int registered)
{
	uint64_t t[N];
	char *p = touched_page();
	__u64 c = cookie++;
	if (registered)
		CHECK(reg(p, p + page, c) == 0);
	for (int i = 0; i < N; i++) {
		p[0] = 1;
		uint64_t a = ns();
		CHECK(madvise(p, page, MADV_DONTNEED) == 0);
		t[i] = ns() - a;
		if (registered)
			drain();
	}
	if (registered)
		unreg(c);
	munmap(p, page);
	return median(t, N);
}

static volatile __u64 plain_word;

/* ns per 1000 checks (100,000 checks a run), median of 11 runs. */
static uint64_t check_cost(volatile __u64 *word)
{
	uint64_t t[11];
	__u64 want = *word;
	for (int r = 0; r < 11; r++) {
		long same = 0;
		uint64_t a = ns();
		for (int i = 0; i < 100000; i++)
			same += *word == want;
		t[r] = (ns() - a) / 100;
		CHECK(same == 100000);
	}
	return median(t, 11);
}

static uint64_t getpid_cost(void)
{
	uint64_t t[N];
	for (int i = 0; i < N; i++) {
		uint64_t a = ns();
		syscall(SYS_getpid);
		t[i] = ns() - a;
	}
	return median(t, N);
}

static uint64_t register_pair_cost(void)
{
	uint64_t t[N];
	char *p = touched_page();
	for (int i = 0; i < N; i++) {
		__u64 c = cookie++;
		uint64_t a = ns();
		CHECK(reg(p, p + page, c) == 0);
		unreg(c);
		t[i] = ns() - a;
	}
	munmap(p, page);
	return median(t, N);
}

static void storm(uint64_t base_munmap_ns)
{
	size_t len = (size_t)STORM * page;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	__u64 first = cookie;
	uint64_t a = ns();
	for (long i = 0; i < STORM; i++) {
		if (reg(p + i * page, p + (i + 1) * page, cookie++) != 0) {
			printf("UMN-BENCH %s storm_register_per_region error=errno%d@%ld\n", impl,
			       errno, i);
			for (__u64 c = first; c < cookie - 1; c++)
				unreg(c);
			munmap(p, len);
			return;
		}
	}
	uint64_t reg_ns = (ns() - a) / STORM;
	a = ns();
	CHECK(munmap(p, len) == 0);
	uint64_t unmap_ns = ns() - a;
	a = ns();
	long events = drain();
	uint64_t drain_ns = (ns() - a) / (events ? (uint64_t)events : 1);
	CHECK(events == STORM + 1); /* one INVAL per region, then LAST */
	a = ns();
	for (__u64 c = first; c < cookie; c++)
		unreg(c);
	uint64_t unreg_ns = (ns() - a) / STORM;
	report("storm_register_per_region", reg_ns, "getpid", getpid_cost());
	report("storm_munmap_100000_regions", unmap_ns, "munmap_100000_pages_plain", base_munmap_ns);
	report("storm_read_per_event", drain_ns, "getpid", getpid_cost());
	report("storm_unregister_per_region", unreg_ns, "getpid", getpid_cost());
}

static uint64_t munmap_big_plain(void)
{
	size_t len = (size_t)STORM * page;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	uint64_t a = ns();
	CHECK(munmap(p, len) == 0);
	return ns() - a;
}

int main(int argc, char **argv)
{
	impl = argc > 1 ? argv[1] : "unknown";
	page = (size_t)sysconf(_SC_PAGESIZE);
	/* Baselines: nothing open, nothing registered; after one warm-up pass (the first
	   mappings of a fresh process also pay for page tables). */
	munmap_cost(0);
	madvise_cost(0);
	uint64_t b_munmap = munmap_cost(0), b_madvise = madvise_cost(0);
	uint64_t b_check = check_cost(&plain_word), b_getpid = getpid_cost();
	uint64_t b_big = munmap_big_plain();

	fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
	CHECK(fd >= 0);
	counter = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(counter != MAP_FAILED);
	/* A region elsewhere, so the notifier is live for the unregistered cases. */
	char *far = touched_page();
	CHECK(reg(far, far + page, cookie++) == 0);

	report("munmap_unregistered", munmap_cost(0), "munmap_plain", b_munmap);
	report("munmap_registered", munmap_cost(1), "munmap_plain", b_munmap);
	report("madvise_unregistered", madvise_cost(0), "madvise_plain", b_madvise);
	report("madvise_registered", madvise_cost(1), "madvise_plain", b_madvise);
	report("counter_check_x1000", check_cost(counter), "load_plain_x1000", b_check);
	report("register_unregister_pair", register_pair_cost(), "getpid", b_getpid);

	/* The module's per-region validity word (the preload has no such ioctl). */
	struct ummunotify_register_slot_ioctl s = {
		.start = (uintptr_t)far, .end = (uintptr_t)(far + page), .user_cookie = cookie++};
	if (ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, &s) == 0) {
		volatile __u64 *slots =
			mmap(NULL, page, PROT_READ, MAP_SHARED, fd, UMMUNOTIFY_SLOTS_OFFSET);
		CHECK(slots != MAP_FAILED);
		report("validity_word_check_x1000", check_cost(&slots[s.slot]), "load_plain_x1000",
		       b_check);
		unreg(s.user_cookie);
	} else {
		printf("UMN-BENCH %s validity_word_check_x1000 error=errno%d\n", impl, errno);
	}
	storm(b_big);
	return 0;
}

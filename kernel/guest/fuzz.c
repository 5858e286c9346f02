/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * A random syscall fuzzer for /dev/ummunotify, for the debug guest (KASAN, lockdep, kmemleak:
 * they judge; kernel/compare.py --debug fails on any report). Seeded and bounded in time:
 *
 *     fuzz SECONDS [SEED]        (SEED defaults to the clock; it is printed first)
 *
 * Run as root: it lowers max_regions_per_user for the run (so the per-user ENOSPC path is hit)
 * and forks the fuzzing process as uid 65534 (the local user the module must withstand). That
 * process runs THREADS threads, each doing random operations with random and near-valid
 * arguments on a shared table of descriptors: the module's ioctls (and random ioctl numbers),
 * read() with odd sizes and bad or half-mapped buffers, blocking and not (a signal interrupts
 * the blocking ones), poll(), fcntl (O_NONBLOCK, O_ASYNC), mmap of the counter page and the slot
 * area with good and bad lengths, offsets and protections, munmap of them, fork (the child makes
 * a few calls on the inherited descriptors and mappings and on one of its own, checks what a
 * foreign mm must see, and exits), close and reopen, and munmap/mmap/madvise/mprotect of the
 * registered memory (an arena of its own). Invariants it checks on the way: the owner's counter
 * never has bit 63 set; a forked child reads bit 63 in it and all ones in the slot area; a
 * child never hangs. Afterwards the supervisor checks the per-user count came back to zero: a
 * new process of the same uid registers the whole limit. Threads interleave as the scheduler
 * decides, so one seed gives the same operation streams, not the same run.
 *
 * Prints UMN-FUZZ lines and UMN-RESULT module fuzz/run PASS|FAIL (harness.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ummunotify.h"
#include "harness.h"

#include "check.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PARAM "/sys/module/ummunotify/parameters/max_regions_per_user"
#define NOBODY 65534
#define THREADS 4
#define NFDS 6
#define ARENA_PAGES 64
#define SCRATCH (64 << 10)
#define KEEP 6
#define FUZZ_LIMIT 2000		/* max_regions_per_user during the run */
#define ORPHAN_COUNTER (1ULL << 63)

static unsigned int secs;
static unsigned long long seed;
static size_t page;
static char *arena;
static pthread_rwlock_t arena_lock = PTHREAD_RWLOCK_INITIALIZER;
static _Atomic int fds[NFDS];
static _Atomic int stop;
static _Atomic unsigned long ops[32];
static _Atomic unsigned long sigio, enospc, forks;
static _Atomic int failed;

enum {
	OP_REGISTER, OP_REGISTER_SLOT, OP_REGISTER_MANY, OP_UNREGISTER, OP_EXCHANGE, OP_IOCTL_RANDOM,
	OP_READ, OP_POLL, OP_FCNTL, OP_MMAP, OP_MUNMAP, OP_ARENA, OP_FORK, OP_REOPEN, OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
	"register", "register_slot", "register_many", "unregister", "exchange", "ioctl_random",
	"read", "poll", "fcntl", "mmap", "munmap", "arena", "fork", "reopen"};
/* Relative weights. */
static const unsigned int op_weight[OP_COUNT] = {
	20, 10, 3, 12, 2, 8, 12, 6, 4, 8, 6, 10, 1, 2};

struct mapping {
	char *addr;
	size_t len;
	int slots;		/* 0: the counter page, 1: the slot area */
};

struct worker {
	pthread_t thread;
	unsigned long long rng;
	char *scratch;		/* SCRATCH bytes, then a PROT_NONE guard page */
	struct mapping keep[KEEP];
	_Atomic int done;
};

static struct worker workers[THREADS];

static unsigned long long rnd(struct worker *w)
{
	/* xorshift64* */
	w->rng ^= w->rng >> 12;
	w->rng ^= w->rng << 25;
	w->rng ^= w->rng >> 27;
	return w->rng * 0x2545F4914F6CDD1DULL;
}

static unsigned int below(struct worker *w, unsigned int n)
{
	return (unsigned int)(rnd(w) % n);
}

static void fail(const char *what)
{
	/* write(2): async-signal-safe, usable in a forked child. */
	if (write(2, what, strlen(what)) < 0)
		return;
	failed = 1;
}

static int pick_fd(struct worker *w)
{
	return fds[below(w, NFDS)];
}

/* A pointer argument: mostly a good one, sometimes one the kernel must refuse. */
static void *pick_ptr(struct worker *w, void *good)
{
	switch (below(w, 12)) {
	case 0:
		return NULL;
	case 1:
		return (void *)1;
	case 2:
		return (void *)0xffff888000000000ULL;	/* the kernel's direct map */
	case 3:
		return arena + below(w, ARENA_PAGES) * page;	/* maybe PROT_NONE or DONTNEED */
	case 4:
		return w->scratch + SCRATCH - 8;	/* straddles the guard page */
	default:
		return good;
	}
}

/* An address range: mostly pages of the arena, sometimes anything. */
static void pick_range(struct worker *w, __u64 *start, __u64 *end)
{
	__u64 a = (uintptr_t)arena;

	switch (below(w, 10)) {
	case 0:
		*start = rnd(w);
		*end = rnd(w);
		return;
	case 1:
		*start = a + below(w, ARENA_PAGES * 4096);
		*end = *start + below(w, 3);	/* empty, one byte, two */
		return;
	case 2:
		*start = 0;
		*end = ~0ULL;
		return;
	case 3:
		*start = 0xffff800000000000ULL;
		*end = *start + page;
		return;
	default: {
		unsigned int p = below(w, ARENA_PAGES), n = 1 + below(w, 8);

		*start = a + p * page;
		*end = a + (p + n) * page;
	}
	}
}

static __u64 pick_cookie(struct worker *w)
{
	return below(w, 8) ? below(w, 1024) : rnd(w);
}

static void do_register(struct worker *w, int fd, int slot)
{
	struct ummunotify_register_slot_ioctl rs = {0};
	struct ummunotify_register_ioctl r = {0};
	int ret;

	pick_range(w, &r.start, &r.end);
	r.user_cookie = pick_cookie(w);
	if (!below(w, 20))
		r.flags = (__u32)rnd(w);
	if (!below(w, 20))
		r.reserved = (__u32)rnd(w);
	if (slot) {
		rs.start = r.start;
		rs.end = r.end;
		rs.user_cookie = r.user_cookie;
		rs.flags = r.flags;
		ret = ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, pick_ptr(w, &rs));
	} else {
		ret = ioctl(fd, UMMUNOTIFY_REGISTER_REGION, pick_ptr(w, &r));
	}
	if (ret < 0 && errno == ENOSPC)
		enospc++;
}

static void do_register_many(struct worker *w, int fd)
{
	__u64 base = 1024 + below(w, 64) * 64;

	for (int i = 0; i < 64; i++) {
		struct ummunotify_register_ioctl r = {
			.start = (uintptr_t)arena + (i % ARENA_PAGES) * page,
			.end = (uintptr_t)arena + (i % ARENA_PAGES + 1) * page,
			.user_cookie = base + i};

		if (ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r) < 0 && errno == ENOSPC) {
			enospc++;
			break;
		}
	}
}

static void do_ioctl_random(struct worker *w, int fd)
{
	unsigned long cmd;

	if (below(w, 2))
		cmd = _IOC(below(w, 4), UMMUNOTIFY_MAGIC, below(w, 8), below(w, 64));
	else
		cmd = (unsigned int)rnd(w);
	memset(w->scratch, (int)below(w, 256), 64);
	ioctl(fd, cmd, pick_ptr(w, w->scratch));
}

static void do_read(struct worker *w, int fd)
{
	static const size_t sizes[] = {0, 1, 31, 32, 33, 64, 96, 4096, 8192, 65536};
	size_t len = sizes[below(w, sizeof(sizes) / sizeof(sizes[0]))];
	char *buf = pick_ptr(w, w->scratch);

	if (buf == w->scratch && len > SCRATCH)
		len = SCRATCH;
	if (buf == w->scratch + SCRATCH - 8 && !below(w, 2))
		buf = w->scratch + SCRATCH - 64;	/* two records fit, the rest faults */
	read(fd, buf, len);
}

static void do_poll(struct worker *w)
{
	struct pollfd p[NFDS];

	for (int i = 0; i < NFDS; i++)
		p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
	poll(p, NFDS, below(w, 3) ? 0 : 5);
}

static void do_fcntl(struct worker *w, int fd)
{
	static const int flags[] = {0, O_NONBLOCK, O_ASYNC, O_NONBLOCK | O_ASYNC};

	if (below(w, 4) == 0)
		fcntl(fd, F_SETOWN, getpid());
	else
		fcntl(fd, F_SETFL, flags[below(w, 4)]);
}

/* Reads a mapping made by this process: bit 63 must be clear (it is the orphan value). */
static void check_own(struct mapping *m)
{
	if (!m->slots) {
		__u64 c = *(volatile __u64 *)m->addr;

		if (c & ORPHAN_COUNTER)
			fail("UMN-FUZZ invariant: the owner's counter has bit 63 set\n");
	} else {
		__u64 v = ((volatile __u64 *)m->addr)[0];

		if (v >> 63)
			fail("UMN-FUZZ invariant: the owner's slot word reached 1 << 63\n");
	}
}

static void do_mmap(struct worker *w, int fd)
{
	static const size_t lens[] = {4096, 1, 8192, 0, 1 << 20, (1 << 20) + 4096, 65536};
	static const int prots[] = {PROT_READ, PROT_READ, PROT_READ, PROT_READ | PROT_WRITE,
				    PROT_NONE, PROT_READ | PROT_EXEC};
	off_t off;
	size_t len = lens[below(w, sizeof(lens) / sizeof(lens[0]))];
	int prot = prots[below(w, sizeof(prots) / sizeof(prots[0]))];
	int flags = below(w, 5) ? MAP_SHARED : MAP_PRIVATE;
	int slot = -1;

	switch (below(w, 6)) {
	case 0:
	case 1:
		off = 0;
		break;
	case 2:
	case 3:
		off = (off_t)UMMUNOTIFY_SLOTS_OFFSET;
		break;
	case 4:
		off = (off_t)UMMUNOTIFY_SLOTS_OFFSET + (off_t)page * below(w, 4);
		break;
	default:
		off = (off_t)(rnd(w) & ~(page - 1) & ((1ULL << 40) - 1));
	}
	for (int i = 0; i < KEEP; i++)
		if (!w->keep[i].addr)
			slot = i;
	if (slot < 0)
		return;
	/* No new mapping may land in a hole of the arena another thread is refilling. */
	pthread_rwlock_rdlock(&arena_lock);
	char *p = mmap(NULL, len, prot, flags, fd, off);

	pthread_rwlock_unlock(&arena_lock);
	if (p == MAP_FAILED)
		return;
	if (prot & PROT_WRITE)
		fail("UMN-FUZZ invariant: a writable mapping of the device was accepted\n");
	if (!mprotect(p, len, PROT_READ | PROT_WRITE))
		fail("UMN-FUZZ invariant: mprotect made a device mapping writable\n");
	/* Later reads need PROT_READ (VM_MAYREAD stays on a PROT_NONE mapping). */
	if (!(prot & PROT_READ) && mprotect(p, len, PROT_READ)) {
		munmap(p, len);
		return;
	}
	w->keep[slot] = (struct mapping){.addr = p, .len = len, .slots = off != 0};
	check_own(&w->keep[slot]);
}

static void do_munmap(struct worker *w)
{
	struct mapping *m = &w->keep[below(w, KEEP)];

	if (!m->addr)
		return;
	if (below(w, 2))
		check_own(m);
	munmap(m->addr, m->len);
	m->addr = NULL;
}

/* Changes the registered memory: the MMU notifier's work. */
static void do_arena(struct worker *w)
{
	unsigned int p = below(w, ARENA_PAGES), n = 1 + below(w, 8);
	char *a;
	size_t len;

	if (p + n > ARENA_PAGES)
		n = ARENA_PAGES - p;
	a = arena + p * page;
	len = n * page;
	switch (below(w, 6)) {
	case 0:	/* munmap then mmap again: a hole for a moment, no mapping may land in it */
		pthread_rwlock_wrlock(&arena_lock);
		munmap(a, len);
		if (mmap(a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
			 0) != a)
			fail("UMN-FUZZ: could not refill the arena\n");
		pthread_rwlock_unlock(&arena_lock);
		break;
	case 1:	/* replaced in one call */
		mmap(a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		break;
	case 2:
		madvise(a, len, MADV_DONTNEED);
		break;
	case 3:
		mprotect(a, len, below(w, 2) ? PROT_NONE : PROT_READ | PROT_WRITE);
		break;
	default:	/* fault pages in (no plain store: the page may be PROT_NONE) */
		madvise(a, len, MADV_POPULATE_WRITE);
	}
}

/* The forked child: its mm is not the opener's; it must see EIO, the orphan pages, no hang. */
static void child(struct worker *w)
{
	struct ummunotify_register_ioctl r = {
		.start = (uintptr_t)arena, .end = (uintptr_t)arena + 4 * page, .user_cookie = 1};
	char buf[256];
	int fd = pick_fd(w);

	if (ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r) == 0)
		fail("UMN-FUZZ invariant: a forked child registered on the parent's descriptor\n");
	if (read(fd, buf, sizeof(buf)) >= 0)
		fail("UMN-FUZZ invariant: a forked child read the parent's descriptor\n");
	for (int i = 0; i < KEEP; i++) {
		struct mapping *m = &w->keep[i];

		if (!m->addr)
			continue;
		if (!m->slots && *(volatile __u64 *)m->addr != ORPHAN_COUNTER)
			fail("UMN-FUZZ invariant: a forked child saw a live counter\n");
		if (m->slots && *(volatile __u64 *)m->addr != ~0ULL)
			fail("UMN-FUZZ invariant: a forked child saw a live slot word\n");
	}
	/* One of its own: register, change the memory, read the event, exit with it open. */
	fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
	if (fd >= 0) {
		ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r);
		madvise(arena, 4 * page, MADV_DONTNEED);
		read(fd, buf, sizeof(buf));
		if (below(w, 2))
			munmap(arena, ARENA_PAGES * page);
	}
	_exit(failed ? 3 : 0);
}

static void do_fork(struct worker *w)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return;
	if (pid == 0)
		child(w);
	forks++;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail("UMN-FUZZ invariant: a forked child failed (see above) or died\n");
}

static void do_reopen(struct worker *w)
{
	unsigned int i = below(w, NFDS);
	int old = fds[i];
	int fd = open("/dev/ummunotify", below(w, 8) ? O_RDONLY | (below(w, 2) ? O_NONBLOCK : 0)
						     : O_RDWR);

	if (fd >= 0) {
		if (atomic_compare_exchange_strong(&fds[i], &old, fd))
			close(old);
		else
			close(fd);
	}
}

static void pick_op(struct worker *w)
{
	unsigned int total = 0, x;
	int op, fd = pick_fd(w);

	for (op = 0; op < OP_COUNT; op++)
		total += op_weight[op];
	x = below(w, total);
	for (op = 0; x >= op_weight[op]; op++)
		x -= op_weight[op];
	ops[op]++;
	switch (op) {
	case OP_REGISTER:
		do_register(w, fd, 0);
		break;
	case OP_REGISTER_SLOT:
		do_register(w, fd, 1);
		break;
	case OP_REGISTER_MANY:
		do_register_many(w, fd);
		break;
	case OP_UNREGISTER: {
		__u64 cookie = below(w, 2) ? pick_cookie(w) : 1024 + below(w, 4096);

		ioctl(fd, UMMUNOTIFY_UNREGISTER_REGION, pick_ptr(w, &cookie));
		break;
	}
	case OP_EXCHANGE: {
		__u32 mask = (__u32)rnd(w);

		ioctl(fd, UMMUNOTIFY_EXCHANGE_FEATURES, pick_ptr(w, &mask));
		break;
	}
	case OP_IOCTL_RANDOM:
		do_ioctl_random(w, fd);
		break;
	case OP_READ:
		do_read(w, fd);
		break;
	case OP_POLL:
		do_poll(w);
		break;
	case OP_FCNTL:
		do_fcntl(w, fd);
		break;
	case OP_MMAP:
		do_mmap(w, fd);
		break;
	case OP_MUNMAP:
		do_munmap(w);
		break;
	case OP_ARENA:
		do_arena(w);
		break;
	case OP_FORK:
		do_fork(w);
		break;
	case OP_REOPEN:
		do_reopen(w);
		break;
	}
}

static void *work(void *arg)
{
	struct worker *w = arg;

	while (!stop)
		pick_op(w);
	w->done = 1;
	return NULL;
}

static void on_sigusr1(int sig)
{
	(void)sig;
}

static void on_sigio(int sig)
{
	(void)sig;
	sigio++;
}

/* The fuzzing process (uid 65534). */
static int fuzz(void)
{
	struct sigaction sa = {.sa_handler = on_sigusr1};
	struct timespec tick = {0, 20 * 1000 * 1000};
	time_t end = time(NULL) + secs;

	sigaction(SIGUSR1, &sa, NULL);	/* no SA_RESTART: a blocked read() returns EINTR */
	sa.sa_handler = on_sigio;
	sigaction(SIGIO, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	arena = mmap(NULL, ARENA_PAGES * page, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(arena != MAP_FAILED);
	for (int i = 0; i < NFDS; i++) {
		fds[i] = open("/dev/ummunotify", O_RDONLY | (i % 2 ? O_NONBLOCK : 0));
		CHECK(fds[i] >= 0);
	}
	for (int i = 0; i < THREADS; i++) {
		struct worker *w = &workers[i];

		w->rng = (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (unsigned long long)(i + 1);
		w->scratch = mmap(NULL, SCRATCH + page, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(w->scratch != MAP_FAILED);
		CHECK(mprotect(w->scratch + SCRATCH, page, PROT_NONE) == 0);
		CHECK(pthread_create(&w->thread, NULL, work, w) == 0);
	}
	/* Interrupt blocked reads now and then; at the end, until every worker is out. */
	for (;;) {
		int alive = 0;

		if (time(NULL) >= end)
			stop = 1;
		for (int i = 0; i < THREADS; i++) {
			if (!workers[i].done) {
				alive++;
				pthread_kill(workers[i].thread, SIGUSR1);
			}
		}
		if (stop && !alive)
			break;
		nanosleep(&tick, NULL);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(workers[i].thread, NULL);
	printf("UMN-FUZZ ops:");
	for (int op = 0; op < OP_COUNT; op++)
		printf(" %s=%lu", op_names[op], (unsigned long)ops[op]);
	printf(" enospc=%lu sigio=%lu forks=%lu\n", (unsigned long)enospc,
	       (unsigned long)sigio, (unsigned long)forks);
	fflush(stdout);
	for (int i = 0; i < NFDS; i++)
		close(fds[i]);
	return failed ? 1 : 0;
}

static char saved_limit[32];

static void write_param(const char *text)
{
	int fd = open(PARAM, O_WRONLY);

	CHECK(fd >= 0);
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
}

static void become_nobody(void)
{
	CHECK(setresgid(NOBODY, NOBODY, NOBODY) == 0);
	CHECK(setresuid(NOBODY, NOBODY, NOBODY) == 0);
}

static void test_run(void)
{
	char text[32];
	int status, fd;
	pid_t pid;

	fd = open(PARAM, O_RDONLY);
	CHECK(fd >= 0);
	CHECK(read(fd, saved_limit, sizeof(saved_limit) - 1) > 0);
	close(fd);
	snprintf(text, sizeof(text), "%d\n", FUZZ_LIMIT);
	write_param(text);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		become_nobody();
		exit(fuzz());
	}
	CHECK(waitpid(pid, &status, 0) == pid);
	/* The per-user count is back to zero: a new process of that uid gets the whole limit. */
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		become_nobody();
		fd = open("/dev/ummunotify", O_RDONLY);
		CHECK(fd >= 0);
		for (__u64 i = 0; i < FUZZ_LIMIT; i++) {
			struct ummunotify_register_ioctl r = {
				.start = 0x10000000ull + i * page,
				.end = 0x10000000ull + (i + 1) * page, .user_cookie = i};

			CHECK(ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r) == 0);
		}
		exit(0);
	}
	int st2;

	CHECK(waitpid(pid, &st2, 0) == pid);
	write_param(saved_limit);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: fuzz SECONDS [SEED]\n");
		return 2;
	}
	page = (size_t)sysconf(_SC_PAGESIZE);
	secs = (unsigned int)strtoul(argv[1], NULL, 10);
	seed = argc > 2 ? strtoull(argv[2], NULL, 0) : (unsigned long long)time(NULL);
	printf("UMN-FUZZ seed=%llu seconds=%u threads=%d (again: fuzz %u %llu)\n", seed, secs,
	       THREADS, secs, seed);
	fflush(stdout);
	harness_run("fuzz", "run", test_run, secs + 300);
	return harness_failed ? 1 : 0;
}

/* miss_parts [LEN]: where a userfaultfd cache miss's time goes, call by call (issue 41), in TSC
 * ticks per call, medians over rounds of N calls, all in this process:
 *
 *   getppid           a syscall that does nothing (the emulator's cost of a kernel entry)
 *   sigmask_pair      blocking every signal and restoring the mask (the notifier's index lock)
 *   register_split    UFFDIO_REGISTER (write-protect mode) of LEN inside a larger mapping: the
 *                     kernel splits the VMA at both ends, as a cache miss's watch does
 *   register_again    the same ranges again, watched already: the call without a split
 *   mprotect_split    mprotect of LEN inside a larger mapping: the same splits without userfaultfd
 *   msync             msync(0) of the range (the "still mapped" check before issue 41's probe)
 *   continue          UFFDIO_CONTINUE (the probe: EINVAL on private anonymous memory)
 *   zeropage          UFFDIO_ZEROPAGE of its first page (the probe's second call, WP_ASYNC only)
 *   unregister_merge  UFFDIO_UNREGISTER, which merges the VMAs again (an eviction's unwatch)
 *   miss_uffd, miss_kernel  a cache miss with a no-op registrar (ummunotify_cache_get + put of a
 *                     fresh LEN mapping, no-op registrar) on the userfaultfd backend and on the
 *                     module (0 where /dev/ummunotify is missing)
 *
 * One RXE-PARTS line; kernel/rxe/verdict.py prints it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>
#include "ummunotify.h"

#define N 32
#define ROUNDS 21

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t med(uint64_t *v)
{
	qsort(v, ROUNDS, sizeof *v, cmp);
	return v[ROUNDS / 2];
}

static int reg_fn(void *c, size_t s, size_t l, uint64_t *k)
{
	(void)c;
	(void)l;
	*k = s;
	return 0;
}

static int dereg_fn(void *c, size_t s, size_t l, uint64_t k)
{
	(void)c;
	(void)s;
	(void)l;
	(void)k;
	return 0;
}

static char *map_populated(void *at, size_t len)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | (at ? MAP_FIXED : 0);
	char *p = mmap(at, len, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	return p;
}
/* The i-th odd LEN slot of the arena: every watched range has unwatched neighbours. */
static uint64_t at(char *arena, int i, size_t len)
{
	return (uintptr_t)arena + (uint64_t)(2 * i + 1) * len;
}

/* UFFDIO_REGISTER (WP) of each of the N pages of arena: ticks per call. */
static uint64_t register_each(int uffd, char *arena, size_t len)
{
	uint64_t t0 = __rdtsc();
	for (int i = 0; i < N; i++) {
		struct uffdio_register rg = {.range = {at(arena, i, len), len},
					     .mode = UFFDIO_REGISTER_MODE_WP};
		if (ioctl(uffd, UFFDIO_REGISTER, &rg)) {
			perror("UFFDIO_REGISTER");
			exit(1);
		}
	}
	return (__rdtsc() - t0) / N;
}

static uint64_t cache_miss(const char *backend, size_t len)
{
	setenv("UMN_BACKEND", backend, 1);
	ummunotify_registrar reg = {.register_fn = reg_fn, .deregister_fn = dereg_fn};
	ummunotify_cache_config cfg = {.size = sizeof cfg};
	ummunotify_cache_config_default(&cfg);
	cfg.max_regions = 1 << 16;
	cfg.merge_adjacent = false;
	ummunotify_cache *pool;
	if (ummunotify_cache_new(&reg, &cfg, &pool))
		return 0; /* no such backend here */
	char *b[N];
	for (int i = 0; i < N; i++)
		b[i] = map_populated(NULL, len);
	uint64_t t[ROUNDS];
	for (int r = 0; r < ROUNDS; r++) {
		ummunotify_cache_handle h;
		uint64_t t0 = __rdtsc();
		for (int i = 0; i < N; i++) {
			if (ummunotify_cache_get(pool, (uintptr_t)b[i], len, &h)) {
				fprintf(stderr, "ummunotify_cache_get\n");
				exit(1);
			}
			ummunotify_cache_put(&h);
		}
		t[r] = (__rdtsc() - t0) / N;
		for (int i = 0; i < N; i++)
			map_populated(b[i], len);
		ummunotify_cache_flush(pool);
	}
	ummunotify_cache_free(pool);
	for (int i = 0; i < N; i++)
		munmap(b[i], len);
	return med(t);
}

int main(int argc, char **argv)
{
	size_t len = argc > 1 ? strtoul(argv[1], 0, 0) : 4096;
	const long pg = 4096;
	uint64_t t[9][ROUNDS];
	int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = {.api = UFFD_API};
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("userfaultfd");
		return 1;
	}
	/* No events asked: nothing waits for a reader on munmap. */
	char *arena = map_populated(NULL, 2 * N * len);
	sigset_t all, old;
	sigfillset(&all);
	for (int r = 0; r < ROUNDS; r++) {
		uint64_t t0 = __rdtsc();
		for (int i = 0; i < N; i++)
			syscall(SYS_getppid);
		t[0][r] = (__rdtsc() - t0) / N;
		t0 = __rdtsc();
		for (int i = 0; i < N; i++) {
			pthread_sigmask(SIG_BLOCK, &all, &old);
			pthread_sigmask(SIG_SETMASK, &old, NULL);
		}
		t[1][r] = (__rdtsc() - t0) / N;
		/* The first pass splits each page's VMA off; the second registers what is its own. */
		t[2][r] = register_each(uffd, arena, len);
		t[3][r] = register_each(uffd, arena, len);
		t0 = __rdtsc();
		for (int i = 0; i < N; i++)
			msync((void *)at(arena, i, len), len, 0);
		t[4][r] = (__rdtsc() - t0) / N;
		t0 = __rdtsc();
		for (int i = 0; i < N; i++) {
			struct uffdio_continue c = {.range = {at(arena, i, len), len},
						    .mode = UFFDIO_CONTINUE_MODE_DONTWAKE};
			if (ioctl(uffd, UFFDIO_CONTINUE, &c) == 0 || errno != EINVAL) {
				perror("UFFDIO_CONTINUE (EINVAL expected)");
				return 1;
			}
		}
		t[5][r] = (__rdtsc() - t0) / N;
		t0 = __rdtsc();
		for (int i = 0; i < N; i++) {
			struct uffdio_zeropage z = {.range = {at(arena, i, len), pg},
						    .mode = UFFDIO_ZEROPAGE_MODE_DONTWAKE};
			ioctl(uffd, UFFDIO_ZEROPAGE, &z);
		}
		t[6][r] = (__rdtsc() - t0) / N;
		t0 = __rdtsc();
		for (int i = 0; i < N; i++) {
			struct uffdio_range u = {at(arena, i, len), len};
			if (ioctl(uffd, UFFDIO_UNREGISTER, &u)) {
				perror("UFFDIO_UNREGISTER");
				return 1;
			}
		}
		t[7][r] = (__rdtsc() - t0) / N;
		t0 = __rdtsc();
		for (int i = 0; i < N; i++)
			if (mprotect((void *)at(arena, i, len), len, PROT_READ)) {
				perror("mprotect");
				return 1;
			}
		t[8][r] = (__rdtsc() - t0) / N;
		if (mprotect(arena, 2 * N * len, PROT_READ | PROT_WRITE)) {
			perror("mprotect");
			return 1;
		}
	}
	const char *names[] = {"getppid",  "sigmask_pair", "register_split",   "register_again",
			       "msync",    "continue",     "zeropage",         "unregister_merge",
			       "mprotect_split"};
	printf("RXE-PARTS len=%zu", len);
	for (int k = 0; k < 9; k++) printf(" %s=%llu", names[k], (unsigned long long)med(t[k]));
	printf(" miss_uffd=%llu", (unsigned long long)cache_miss("uffd", len));
	printf(" miss_kernel=%llu\n", (unsigned long long)cache_miss("kernel", len));
	return 0;
}

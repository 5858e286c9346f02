/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The project's C library (libummunotify.so, userfaultfd underneath) in the guest kernel: a
 * notifier starts, a registered page's munmap is visible to the O(1) check and to the global
 * counter when munmap returns, and an unregistered page's is not. Prints UMN-RESULT lines
 * under the implementation name "capi" (kernel/compare.py requires them to pass).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ummunotify.h>

#include "harness.h"

static char last_error[512];
#define CHECK(c)                                                                           \
	do {                                                                               \
		if (!(c)) {                                                                \
			ummunotify_last_error(last_error, sizeof last_error);              \
			fprintf(stderr, "%s:%d: CHECK failed: %s (errno 0: %s)\n", __FILE__,  \
				__LINE__, #c, last_error);                                 \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static void test_notifier_sees_munmap(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	ummunotify_notifier *n = NULL;
	CHECK(ummunotify_notifier_new(&n) == UMMUNOTIFY_OK);
	char *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	memset(p, 1, 2 * page);
	ummunotify_region a, b;
	CHECK(ummunotify_notifier_register(n, (size_t)p, (size_t)p + page, 1, &a) == UMMUNOTIFY_OK);
	char *q = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(q != MAP_FAILED);
	q[0] = 1;
	uint64_t g;
	CHECK(ummunotify_notifier_generation(n, &g) == UMMUNOTIFY_OK);
	CHECK(munmap(q, page) == 0); /* not registered */
	CHECK(ummunotify_notifier_is_valid(n, a));
	CHECK(ummunotify_notifier_register(n, (size_t)p + page, (size_t)p + 2 * page, 2, &b) ==
	      UMMUNOTIFY_OK);
	CHECK(munmap(p, page) == 0);
	CHECK(!ummunotify_notifier_is_valid(n, a)); /* visible when munmap returns */
	CHECK(ummunotify_notifier_is_valid(n, b));
	CHECK(ummunotify_notifier_unregister(n, 1) == UMMUNOTIFY_OK);
	ummunotify_notifier_free(n);
}

int main(void)
{
	harness_run("capi", "test_notifier_sees_munmap", test_notifier_sees_munmap, 120);
	return 0;
}

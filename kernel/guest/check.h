/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * CHECK(c): the guest programs' assertion. On failure it prints the file, line, expression and
 * errno to stderr and exits 1 (inside harness.h's runner that fails the one test: its child
 * exits, and the runner reports the expression).
 */
#ifndef UMN_GUEST_CHECK_H
#define UMN_GUEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                            \
	do {                                                                                \
		if (!(c)) {                                                                 \
			fprintf(stderr, "%s:%d: CHECK failed: %s (errno %d: %s)\n", __FILE__, \
				__LINE__, #c, errno, strerror(errno));                      \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

#endif

/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The project's 2010-ABI test program (crates/ummunotify-compat/tests/c/abi2010.c, included
 * unchanged) with each of its test functions run on its own by the guest harness, so one
 * failed check is reported and the remaining tests still run. Build with
 *     gcc -I crates/ummunotify-compat/tests/c -I kernel/guest kernel/guest/abi2010-suite.c
 */
#define main abi2010_main
#include "abi2010.c"
#undef main
#include "harness.h"

#define T(fn) harness_run("abi2010", #fn, fn, 120)

/* The whole program as well, so a test added to abi2010.c and not listed below still runs. */
static void whole_program(void)
{
	exit(abi2010_main());
}

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	T(test_open_flags);
	T(test_ioctls);
	T(test_events);
	T(test_page_per_read);
	T(test_blocking_and_flags);
	T(test_fork);
	T(test_threads);
	T(test_unmapped_ranges);
	T(test_raw_mmap_into_a_hole_is_unseen);
	T(test_rearm_while_unmapped);
	T(test_remap_and_unmap_again);
	T(whole_program);
	return 0;
}

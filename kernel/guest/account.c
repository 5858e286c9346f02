/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * What a user asks of the module is charged to that user (issue 40), for the debug guest (its
 * kernel has SLUB and the memory controller; the stock guest's SLOB can not account kmem):
 *  - per_user_limit: as uid 65534 (nobody), regions over several open files stop at the
 *    module's max_regions_per_user with ENOSPC, state unchanged; another uid and root still
 *    register; an unregistration and a close give their regions back.
 *  - memcg_charge: a process of uid 65534 in a memory cgroup of its own registers regions and
 *    maps the slot area: the cgroup's slab and vmalloc counters rise by at least what that
 *    costs, and fall when it closes its descriptor. Prints the figures (cgroup and
 *    /proc/meminfo) as a UMN-ACCOUNT line.
 * Runs as root (it sets the module parameter and makes the cgroup); each test in its own child
 * (harness.h).
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
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ummunotify.h"
#include "harness.h"

#include "check.h"

#define PARAM "/sys/module/ummunotify/parameters/max_regions_per_user"
#define CG_ROOT "/sys/fs/cgroup"
#define CG CG_ROOT "/umn-account"
#define NOBODY 65534
#define OTHER 65533

static size_t page;
static char saved_limit[32];
static pid_t limit_setter;	/* the children inherit the atexit handler: only it restores */

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

/* Regions may cover any range, mapped or not: one page each at a distinct address. */
static int reg(int fd, __u64 cookie)
{
	struct ummunotify_register_ioctl r = {
		.start = 0x10000000ull + cookie * page, .end = 0x10000000ull + (cookie + 1) * page,
		.user_cookie = cookie};

	return ioctl(fd, UMMUNOTIFY_REGISTER_REGION, &r);
}

static int reg_slot(int fd, __u64 cookie)
{
	struct ummunotify_register_slot_ioctl r = {
		.start = 0x10000000ull + cookie * page, .end = 0x10000000ull + (cookie + 1) * page,
		.user_cookie = cookie};

	return ioctl(fd, UMMUNOTIFY_REGISTER_REGION_SLOT, &r);
}

static int unreg(int fd, __u64 cookie)
{
	return ioctl(fd, UMMUNOTIFY_UNREGISTER_REGION, &cookie);
}

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY);

	CHECK(fd >= 0);
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	CHECK(close(fd) == 0);
}

static void read_file(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	CHECK(fd >= 0);
	n = read(fd, buf, len - 1);
	CHECK(n >= 0);
	buf[n] = 0;
	close(fd);
}

static void restore_limit(void)
{
	if (*saved_limit && getpid() == limit_setter)
		write_file(PARAM, saved_limit);
}

static void set_limit(unsigned int limit)
{
	char text[32];

	/* The module before issue 40 has no per-user limit: this test fails here on it. */
	CHECK(access(PARAM, W_OK) == 0);
	read_file(PARAM, saved_limit, sizeof(saved_limit));
	limit_setter = getpid();
	atexit(restore_limit);
	snprintf(text, sizeof(text), "%u\n", limit);
	write_file(PARAM, text);
}

static void become(uid_t uid)
{
	CHECK(setresgid(uid, uid, uid) == 0);
	CHECK(setresuid(uid, uid, uid) == 0);
}

static void wait_ok(pid_t pid)
{
	int status;

	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Registers n regions from cookie `first` on; all must succeed. */
static void fill(int fd, __u64 first, unsigned int n)
{
	for (unsigned int i = 0; i < n; i++)
		CHECK(reg(fd, first + i) == 0);
}

#define LIMIT 300

/* A child as another user: it registers up to the limit of its own, then one more. */
static void other_user_registers(uid_t uid)
{
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		become(uid);
		int fd = open_dev();

		fill(fd, 1, LIMIT);
		CHECK(reg(fd, LIMIT + 1) == -1 && errno == ENOSPC);
		exit(0);
	}
	wait_ok(pid);
}

static void test_per_user_limit(void)
{
	int go[2], full[2];
	char c;

	set_limit(LIMIT);
	CHECK(pipe(go) == 0 && pipe(full) == 0);
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		int fds[3];

		become(NOBODY);
		for (int i = 0; i < 3; i++)
			fds[i] = open_dev();
		/* 100 + 100 + 100 over three files: the user's limit, no file's. */
		for (int i = 0; i < 3; i++)
			fill(fds[i], 1000 * (i + 1), LIMIT / 3);
		CHECK(reg(fds[0], 1) == -1 && errno == ENOSPC);
		CHECK(reg(fds[2], 1) == -1 && errno == ENOSPC);
		CHECK(reg_slot(fds[1], 1) == -1 && errno == ENOSPC);
		/* State unchanged: the refused cookie is not there. */
		CHECK(unreg(fds[0], 1) == -1 && errno == EINVAL);
		CHECK(write(full[1], "f", 1) == 1);
		CHECK(read(go[0], &c, 1) == 1);
		/* An unregistration gives one back, to any of the user's files. */
		CHECK(unreg(fds[1], 2000) == 0);
		CHECK(reg(fds[0], 1) == 0);
		CHECK(reg(fds[0], 2) == -1 && errno == ENOSPC);
		/* A close gives the file's back. */
		CHECK(close(fds[2]) == 0);
		fill(fds[0], 5000, LIMIT / 3);
		CHECK(reg(fds[0], 2) == -1 && errno == ENOSPC);
		CHECK(close(fds[0]) == 0 && close(fds[1]) == 0);
		/* Everything closed: the whole limit again, in one file. */
		int fd = open_dev();

		fill(fd, 1, LIMIT);
		CHECK(reg(fd, LIMIT + 1) == -1 && errno == ENOSPC);
		exit(0);
	}
	CHECK(read(full[0], &c, 1) == 1);
	/* While nobody is at its limit: another uid, and root, each have a limit of their own. */
	other_user_registers(OTHER);
	other_user_registers(0);
	CHECK(write(go[1], "g", 1) == 1);
	wait_ok(pid);
	/* harness.h ends a passing test with _exit(): no atexit handler runs then. */
	restore_limit();
}

/* A "key value" line's value in a file such as memory.stat or /proc/meminfo. */
static long long stat_of(const char *path, const char *key)
{
	char buf[8192];
	size_t klen = strlen(key);

	read_file(path, buf, sizeof(buf));
	for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		if (!strncmp(line, key, klen) && (line[klen] == ' ' || line[klen] == ':')) {
			char *v = line + klen + 1;

			while (*v == ' ')
				v++;
			return atoll(v);
		}
	}
	fprintf(stderr, "no %s in %s\n", key, path);
	CHECK(0);
	return 0;
}

static long long number_in(const char *path)
{
	char buf[64];

	read_file(path, buf, sizeof(buf));
	return atoll(buf);
}

struct sample {
	long long slab, vmalloc, current, sunreclaim_kb;
};

static struct sample sample(void)
{
	/* memory.stat is flushed on a threshold of updates and every 2 s: wait for the latter. */
	sleep(3);
	struct sample s = {
		.slab = stat_of(CG "/memory.stat", "slab_unreclaimable"),
		.vmalloc = stat_of(CG "/memory.stat", "vmalloc"),
		.current = number_in(CG "/memory.current"),
		.sunreclaim_kb = stat_of("/proc/meminfo", "SUnreclaim"),
	};
	return s;
}

#define REGIONS 20000
/* Far below what a region costs (its interval-tree node, cookie node, lists and bounds). */
#define REGION_BYTES_AT_LEAST 64

static void test_memcg_charge(void)
{
	int go[2], done[2];
	char c;

	mkdir(CG_ROOT, 0755);
	if (mount("none", CG_ROOT, "cgroup2", 0, NULL) != 0 && errno != EBUSY) {
		printf("SKIP: no cgroup2 (%s): the kernel has no CONFIG_MEMCG\n", strerror(errno));
		exit(77);
	}
	char controllers[256];

	read_file(CG_ROOT "/cgroup.controllers", controllers, sizeof(controllers));
	if (!strstr(controllers, "memory")) {
		printf("SKIP: no memory controller in cgroup2\n");
		exit(77);
	}
	write_file(CG_ROOT "/cgroup.subtree_control", "+memory");
	rmdir(CG);
	CHECK(mkdir(CG, 0755) == 0);
	CHECK(pipe(go) == 0 && pipe(done) == 0);
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		char text[32];

		snprintf(text, sizeof(text), "%d\n", (int)getpid());
		write_file(CG "/cgroup.procs", text);
		become(NOBODY);
		CHECK(write(done[1], "r", 1) == 1);
		CHECK(read(go[0], &c, 1) == 1);
		int fd = open_dev();

		/* One slot registration: the slot area (max_regions words) is made and charged. */
		CHECK(reg_slot(fd, 0) == 0);
		fill(fd, 1, REGIONS - 1);
		CHECK(write(done[1], "d", 1) == 1);
		CHECK(read(go[0], &c, 1) == 1);
		CHECK(close(fd) == 0);
		CHECK(write(done[1], "c", 1) == 1);
		CHECK(read(go[0], &c, 1) == 1);
		exit(0);
	}
	CHECK(read(done[0], &c, 1) == 1);
	struct sample s0 = sample();

	CHECK(write(go[1], "g", 1) == 1);
	CHECK(read(done[0], &c, 1) == 1);
	struct sample s1 = sample();

	CHECK(write(go[1], "g", 1) == 1);
	CHECK(read(done[0], &c, 1) == 1);
	struct sample s2 = sample();

	CHECK(write(go[1], "g", 1) == 1);
	wait_ok(pid);
	printf("UMN-ACCOUNT regions=%d memcg: slab_unreclaimable %+lld B, vmalloc %+lld B, "
	       "memory.current %+lld B; after close slab %+lld B, vmalloc %+lld B; "
	       "/proc/meminfo SUnreclaim %+lld kB (after close %+lld kB)\n",
	       REGIONS, s1.slab - s0.slab, s1.vmalloc - s0.vmalloc, s1.current - s0.current,
	       s2.slab - s0.slab, s2.vmalloc - s0.vmalloc, s1.sunreclaim_kb - s0.sunreclaim_kb,
	       s2.sunreclaim_kb - s0.sunreclaim_kb);
	fflush(stdout);
	CHECK(rmdir(CG) == 0);
	/* The regions are charged to the registering user's cgroup ... */
	CHECK(s1.slab - s0.slab >= (long long)REGIONS * REGION_BYTES_AT_LEAST);
	/* ... and the slot area too (max_regions 8-byte words; at least the default's 1 MiB). */
	CHECK(s1.vmalloc - s0.vmalloc >= 1 << 20);
	CHECK(s1.current - s0.current >= (long long)REGIONS * REGION_BYTES_AT_LEAST + (1 << 20));
	/* ... and given back when the file is released. */
	CHECK(s2.slab - s0.slab < (s1.slab - s0.slab) / 4);
	CHECK(s2.vmalloc - s0.vmalloc < 1 << 20);
}

#define T(fn) harness_run("account", #fn, fn, 300)

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	T(test_per_user_limit);
	T(test_memcg_charge);
	return harness_failed ? 1 : 0;
}

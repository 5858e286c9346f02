/* The catalogue of mapping changes (crates/ummunotify-testkit/src/changes/), in C, for the C
 * programs of kernel/rxe/: the same kinds under the same names, the same memory (4 pages unless
 * the kind needs another shape), the same x == y refill. The Rust catalogue is the reference;
 * verdict.py requires both to report every kind.
 *
 *   struct change c;
 *   kind_setup(&c, "madv-dontneed");  // mapped, filled with KIND_OLD; register c.start..+c.len
 *   kind_apply(&c);                   // exactly one call of the kind
 *   kind_refill(&c);                  // new memory at the old address, filled with KIND_NEW
 *   kind_cleanup(&c);
 *
 * Each returns 0, KIND_LACKS when the kernel lacks what the kind needs (c.why says what), or -1
 * with c.why set.
 */
#ifndef UMN_RXE_KINDS_H
#define UMN_RXE_KINDS_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define KIND_OLD 'A'
#define KIND_NEW 'B'
#define KIND_LACKS 2

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define KIND_MADV_GUARD_INSTALL 102
#define KIND_MADV_GUARD_REMOVE 103
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

static const char *const KINDS[] = {
	"libc-munmap", "syscall-munmap", "mmap-fixed-over", "mremap-move", "mremap-shrink",
	"mremap-dontunmap", "madv-dontneed", "madv-free", "madv-dontneed-locked",
	"madv-remove-shmem", "brk-shrink", "process-madvise", "uring-madvise", "file-backed",
	"free-malloc-block", "partial-overlap", "untouched-neighbour", "shmdt",
	"madv-guard-install", "madv-collapse", "punch-hole", "ftruncate-shared",
};
#define NKINDS (sizeof KINDS / sizeof KINDS[0])

struct change {
	const char *kind;
	uintptr_t start; /* the range to register */
	size_t len;
	uintptr_t map;   /* the mapping the case made (0: none of its own) */
	size_t map_len;
	uintptr_t lost;  /* a span the change unmapped, mapped again by the refill */
	size_t lost_len;
	uintptr_t dest;  /* mremap destination */
	int fd;          /* memfd, file, pidfd */
	char path[64];
	void *block;     /* malloc block */
	uintptr_t brk_orig, brk_top;
	char why[256];
};

/* Whether the kind's change replaces the memory of the range (MADV_FREE is lazy; the control
 * case changes a neighbour only). */
static inline int kind_replaces(const char *k)
{
	return strcmp(k, "madv-free") && strcmp(k, "untouched-neighbour");
}

static inline size_t kind_page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

static inline int kind_fail(struct change *c, const char *what)
{
	int e = errno;
	snprintf(c->why, sizeof c->why, "%s: %s", what, strerror(e));
	return (e == EINVAL || e == ENOSYS || e == EOPNOTSUPP) ? KIND_LACKS : -1;
}

static inline int kind_hard_fail(struct change *c, const char *what)
{
	kind_fail(c, what);
	return -1;
}

static inline uintptr_t kind_map(uintptr_t at, size_t len, int prot)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0);
	void *p = mmap((void *)at, len, prot, flags, -1, 0);
	if (p == MAP_FAILED)
		return 0;
	if (at && (uintptr_t)p != at) {
		munmap(p, len);
		errno = EEXIST;
		return 0;
	}
	return (uintptr_t)p;
}

/* IORING_OP_MADVISE through a ring of one entry (raw syscalls: no liburing needed). */
static inline int kind_uring_madvise(uintptr_t addr, size_t len, int advice)
{
	struct io_uring_params p;
	memset(&p, 0, sizeof p);
	int fd = (int)syscall(SYS_io_uring_setup, 1, &p);
	if (fd < 0)
		return -1;
	size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	size_t cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if (p.features & IORING_FEAT_SINGLE_MMAP)
		sq_sz = cq_sz = sq_sz > cq_sz ? sq_sz : cq_sz;
	char *sq = mmap(NULL, sq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
			IORING_OFF_SQ_RING);
	char *cq = (p.features & IORING_FEAT_SINGLE_MMAP)
			   ? sq
			   : mmap(NULL, cq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
				  IORING_OFF_CQ_RING);
	struct io_uring_sqe *sqes = mmap(NULL, p.sq_entries * sizeof *sqes, PROT_READ | PROT_WRITE,
					 MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
	int rc = -1;
	if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED)
		goto out;
	memset(&sqes[0], 0, sizeof sqes[0]);
	sqes[0].opcode = IORING_OP_MADVISE;
	sqes[0].addr = addr;
	sqes[0].len = (uint32_t)len;
	sqes[0].fadvise_advice = (uint32_t)advice;
	unsigned *tail = (unsigned *)(sq + p.sq_off.tail);
	unsigned *mask = (unsigned *)(sq + p.sq_off.ring_mask);
	unsigned *array = (unsigned *)(sq + p.sq_off.array);
	array[*tail & *mask] = 0;
	__atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
	if (syscall(SYS_io_uring_enter, fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
		goto out;
	unsigned *head = (unsigned *)(cq + p.cq_off.head);
	struct io_uring_cqe *cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
	unsigned cmask = *(unsigned *)(cq + p.cq_off.ring_mask);
	int res = cqes[*head & cmask].res;
	__atomic_store_n(head, *head + 1, __ATOMIC_RELEASE);
	if (res < 0)
		errno = -res;
	else
		rc = 0;
out:
	if (sqes != MAP_FAILED)
		munmap(sqes, p.sq_entries * sizeof *sqes);
	if (cq != MAP_FAILED && cq != sq)
		munmap(cq, cq_sz);
	if (sq != MAP_FAILED)
		munmap(sq, sq_sz);
	int e = errno;
	close(fd);
	errno = e;
	return rc;
}

static inline int kind_memfd(struct change *c, size_t len)
{
	c->fd = memfd_create("umn-rxe", MFD_CLOEXEC);
	if (c->fd < 0)
		return kind_fail(c, "memfd_create");
	if (ftruncate(c->fd, (off_t)len))
		return kind_hard_fail(c, "ftruncate");
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
	if (p == MAP_FAILED)
		return kind_hard_fail(c, "mmap(memfd)");
	c->map = c->start = (uintptr_t)p;
	c->map_len = c->len = len;
	return 0;
}

static inline int kind_setup(struct change *c, const char *kind)
{
	size_t pg = kind_page(), four = 4 * pg;
	memset(c, 0, sizeof *c);
	c->kind = kind;
	c->fd = -1;
	const char *k = kind;
	if (!strcmp(k, "mremap-shrink")) {
		if (!(c->map = c->start = kind_map(0, 8 * pg, PROT_READ | PROT_WRITE)))
			return kind_hard_fail(c, "mmap");
		c->map_len = c->len = 8 * pg;
	} else if (!strcmp(k, "partial-overlap") || !strcmp(k, "untouched-neighbour")) {
		if (!(c->map = kind_map(0, 12 * pg, PROT_READ | PROT_WRITE)))
			return kind_hard_fail(c, "mmap");
		c->map_len = 12 * pg;
		c->start = c->map + 2 * pg;
		c->len = four;
	} else if (!strcmp(k, "madv-remove-shmem") || !strcmp(k, "punch-hole") ||
		   !strcmp(k, "ftruncate-shared")) {
		int rc = kind_memfd(c, four);
		if (rc)
			return rc;
	} else if (!strcmp(k, "shmdt")) {
		int id = shmget(IPC_PRIVATE, four, IPC_CREAT | 0600);
		if (id < 0)
			return kind_fail(c, "shmget");
		void *p = shmat(id, NULL, 0);
		shmctl(id, IPC_RMID, NULL);
		if (p == (void *)-1)
			return kind_hard_fail(c, "shmat");
		c->start = (uintptr_t)p;
		c->len = four;
	} else if (!strcmp(k, "madv-collapse")) {
		size_t huge = 2u << 20;
		uintptr_t raw = kind_map(0, 2 * huge, PROT_READ | PROT_WRITE);
		if (!raw)
			return kind_hard_fail(c, "mmap");
		uintptr_t base = (raw + huge - 1) & ~(huge - 1);
		if (base > raw)
			munmap((void *)raw, base - raw);
		munmap((void *)(base + huge), raw + 2 * huge - base - huge);
		c->map = c->start = base;
		c->map_len = c->len = huge;
	} else if (!strcmp(k, "file-backed")) {
		strcpy(c->path, "/tmp/umn-rxe-map-XXXXXX");
		c->fd = mkstemp(c->path);
		if (c->fd < 0)
			return kind_hard_fail(c, "mkstemp");
		if (ftruncate(c->fd, (off_t)four))
			return kind_hard_fail(c, "ftruncate");
		void *p = mmap(NULL, four, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
		if (p == MAP_FAILED)
			return kind_hard_fail(c, "mmap(file)");
		c->map = c->start = (uintptr_t)p;
		c->map_len = c->len = four;
	} else if (!strcmp(k, "free-malloc-block")) {
		/* A fixed threshold (glibc's dynamic one rises with large frees): malloc mmaps the
		 * block and free unmaps it. */
		mallopt(M_MMAP_THRESHOLD, 128 << 10);
		c->block = malloc(40u << 20);
		if (!c->block)
			return kind_hard_fail(c, "malloc");
		c->start = (((uintptr_t)c->block + pg - 1) / pg + 1) * pg;
		c->len = four;
	} else if (!strcmp(k, "brk-shrink")) {
		/* Room at the top of malloc's heap for what the program allocates meanwhile, so
		 * that malloc never extends the heap above the pages the case moves. */
		mallopt(M_TRIM_THRESHOLD, 0x7fffffff);
		mallopt(M_MMAP_THRESHOLD, 32 << 20);
		void *volatile room = malloc(16u << 20);
		free(room);
		mallopt(M_MMAP_THRESHOLD, 128 << 10);
		c->brk_orig = (uintptr_t)sbrk(0);
		c->start = (c->brk_orig + pg - 1) & ~(pg - 1);
		if (sbrk((intptr_t)(c->start - c->brk_orig + four)) == (void *)-1)
			return kind_hard_fail(c, "sbrk");
		c->brk_top = c->start + four;
		c->len = four;
	} else {
		if (!(c->map = c->start = kind_map(0, four, PROT_READ | PROT_WRITE)))
			return kind_hard_fail(c, "mmap");
		c->map_len = c->len = four;
	}
	if (c->map)
		memset((void *)c->map, KIND_OLD, c->map_len);
	else
		memset((void *)c->start, KIND_OLD, c->len);
	if (!strcmp(k, "mremap-move") || !strcmp(k, "mremap-dontunmap")) {
		if (!(c->dest = kind_map(0, c->len, PROT_NONE)))
			return kind_hard_fail(c, "mmap(dest)");
	} else if (!strcmp(k, "madv-dontneed-locked")) {
		if (mlock((void *)c->start, c->len))
			return kind_hard_fail(c, "mlock");
	} else if (!strcmp(k, "process-madvise")) {
		c->fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
		if (c->fd < 0)
			return kind_fail(c, "pidfd_open");
	}
	return 0;
}

static inline int kind_madvise(struct change *c, int advice, const char *name)
{
	if (madvise((void *)c->start, c->len, advice))
		return kind_fail(c, name);
	return 0;
}

static inline void kind_lost(struct change *c, uintptr_t at, size_t len)
{
	c->lost = at;
	c->lost_len = len;
}

static inline int kind_apply(struct change *c)
{
	const char *k = c->kind;
	size_t pg = kind_page();
	void *p = (void *)c->start;
	if (!strcmp(k, "libc-munmap") || !strcmp(k, "file-backed")) {
		if (munmap(p, c->len))
			return kind_hard_fail(c, "munmap");
		kind_lost(c, c->start, c->len);
	} else if (!strcmp(k, "syscall-munmap")) {
		if (syscall(SYS_munmap, c->start, c->len))
			return kind_hard_fail(c, "syscall(SYS_munmap)");
		kind_lost(c, c->start, c->len);
	} else if (!strcmp(k, "mmap-fixed-over")) {
		if (mmap(p, c->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
			 0) == MAP_FAILED)
			return kind_hard_fail(c, "mmap(MAP_FIXED)");
	} else if (!strcmp(k, "mremap-move") || !strcmp(k, "mremap-dontunmap")) {
		int dontunmap = !strcmp(k, "mremap-dontunmap");
		int flags = MREMAP_MAYMOVE | MREMAP_FIXED | (dontunmap ? MREMAP_DONTUNMAP : 0);
		if (mremap(p, c->len, c->len, flags, (void *)c->dest) == MAP_FAILED)
			return dontunmap ? kind_fail(c, "mremap(DONTUNMAP)") : kind_hard_fail(c, "mremap");
		if (!dontunmap)
			kind_lost(c, c->start, c->len);
	} else if (!strcmp(k, "mremap-shrink")) {
		if (mremap(p, c->len, 4 * pg, 0) == MAP_FAILED)
			return kind_hard_fail(c, "mremap(shrink)");
		kind_lost(c, c->start + 4 * pg, c->len - 4 * pg);
		c->map_len = 4 * pg;
	} else if (!strcmp(k, "madv-dontneed")) {
		return kind_madvise(c, MADV_DONTNEED, "madvise(MADV_DONTNEED)");
	} else if (!strcmp(k, "madv-free")) {
		return kind_madvise(c, MADV_FREE, "madvise(MADV_FREE)");
	} else if (!strcmp(k, "madv-dontneed-locked")) {
		return kind_madvise(c, MADV_DONTNEED_LOCKED, "madvise(MADV_DONTNEED_LOCKED)");
	} else if (!strcmp(k, "madv-remove-shmem")) {
		return kind_madvise(c, MADV_REMOVE, "madvise(MADV_REMOVE)");
	} else if (!strcmp(k, "madv-guard-install")) {
		return kind_madvise(c, KIND_MADV_GUARD_INSTALL, "madvise(MADV_GUARD_INSTALL)");
	} else if (!strcmp(k, "madv-collapse")) {
		return kind_madvise(c, MADV_COLLAPSE, "madvise(MADV_COLLAPSE)");
	} else if (!strcmp(k, "brk-shrink")) {
		if ((uintptr_t)sbrk(0) != c->brk_top)
			return kind_hard_fail(c, "the program break moved behind the case's back");
		if (sbrk(-(intptr_t)c->len) == (void *)-1)
			return kind_hard_fail(c, "sbrk(shrink)");
		c->brk_top -= c->len;
	} else if (!strcmp(k, "process-madvise")) {
		struct iovec iov = {.iov_base = p, .iov_len = c->len};
		if (syscall(SYS_process_madvise, c->fd, &iov, 1, MADV_DONTNEED, 0) < 0)
			return kind_fail(c, "process_madvise(MADV_DONTNEED)");
	} else if (!strcmp(k, "uring-madvise")) {
		if (kind_uring_madvise(c->start, c->len, MADV_DONTNEED))
			return kind_fail(c, "IORING_OP_MADVISE");
	} else if (!strcmp(k, "free-malloc-block")) {
		free(c->block);
		c->block = NULL;
		kind_lost(c, c->start, c->len);
	} else if (!strcmp(k, "partial-overlap") || !strcmp(k, "untouched-neighbour")) {
		uintptr_t cut = !strcmp(k, "partial-overlap") ? c->map + 4 * pg : c->map + 6 * pg;
		size_t len = !strcmp(k, "partial-overlap") ? 6 * pg : 2 * pg;
		if (munmap((void *)cut, len))
			return kind_hard_fail(c, "munmap");
		kind_lost(c, cut, len);
	} else if (!strcmp(k, "shmdt")) {
		if (shmdt(p))
			return kind_hard_fail(c, "shmdt");
		kind_lost(c, c->start, c->len);
	} else if (!strcmp(k, "punch-hole")) {
		if (fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)c->len))
			return kind_fail(c, "fallocate(PUNCH_HOLE)");
	} else if (!strcmp(k, "ftruncate-shared")) {
		if (ftruncate(c->fd, 0))
			return kind_hard_fail(c, "ftruncate(0)");
	} else {
		snprintf(c->why, sizeof c->why, "unknown kind %s", k);
		return -1;
	}
	return 0;
}

static inline int kind_refill(struct change *c)
{
	const char *k = c->kind;
	if (!strcmp(k, "madv-guard-install") &&
	    madvise((void *)c->start, c->len, KIND_MADV_GUARD_REMOVE))
		return kind_hard_fail(c, "madvise(MADV_GUARD_REMOVE)");
	if (!strcmp(k, "ftruncate-shared") && ftruncate(c->fd, (off_t)c->len))
		return kind_hard_fail(c, "ftruncate");
	if (!strcmp(k, "brk-shrink")) {
		if ((uintptr_t)sbrk(0) != c->brk_top || sbrk((intptr_t)c->len) == (void *)-1)
			return kind_hard_fail(c, "sbrk(grow again)");
		c->brk_top += c->len;
	}
	if (c->lost_len) {
		if (!kind_map(c->lost, c->lost_len, PROT_READ | PROT_WRITE)) {
			char what[96];
			snprintf(what, sizeof what, "mmap at the old address %#lx", (unsigned long)c->lost);
			return kind_hard_fail(c, what);
		}
		memset((void *)c->lost, KIND_NEW, c->lost_len);
		/* The refilled span is ours to unmap at cleanup, with the case's mapping. */
		if (!c->map) {
			c->map = c->lost;
			c->map_len = c->lost_len;
		} else if (c->lost == c->map + c->map_len) {
			c->map_len += c->lost_len;
		} else if (c->lost + c->lost_len > c->map + c->map_len) {
			c->map_len = c->lost + c->lost_len - c->map;
		}
		c->lost_len = 0;
	}
	memset((void *)c->start, KIND_NEW, c->len);
	return 0;
}

static inline void kind_cleanup(struct change *c)
{
	if (c->map && c->map_len && strcmp(c->kind, "brk-shrink"))
		munmap((void *)c->map, c->map_len);
	if (!strcmp(c->kind, "shmdt") && !c->map && c->start)
		shmdt((void *)c->start);
	if (c->dest)
		munmap((void *)c->dest, c->len);
	if (c->block)
		free(c->block);
	if (!strcmp(c->kind, "brk-shrink") && c->brk_top && (uintptr_t)sbrk(0) == c->brk_top)
		sbrk(-(intptr_t)(c->brk_top - c->brk_orig));
	if (c->fd >= 0)
		close(c->fd);
	if (c->path[0])
		unlink(c->path);
	memset(c, 0, sizeof *c);
	c->fd = -1;
}

#endif

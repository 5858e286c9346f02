/* x == y rounds for the C counter checks (issue 20): each round arms a registration over fresh
   memory, takes the caller's "before" snapshot, changes the memory by one kind, and asks right
   after the call returned whether the check sees the change. A check that still says
   "unchanged" is a missed invalidation. Used by the 2010 preload's stress (compat, the mmap-ed
   counter) and by the C library's (its generation word and unchanged_since).

   The kinds: munmap by libc and by raw syscall, free() of a registered malloc block (glibc
   unmaps a chunk above its mmap threshold), realloc that moves such a block, madvise(DONTNEED)
   by raw syscall and by libc, mmap(MAP_FIXED) over the range. After each change the round maps
   memory at the same address again where it can (x == y). */
#ifndef UMN_XY_CHURN_H
#define UMN_XY_CHURN_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

enum xy_kind {
    XY_LIBC_MUNMAP,
    XY_RAW_MUNMAP,
    XY_FREE,
    XY_REALLOC_MOVES,
    XY_RAW_MADVISE,
    XY_LIBC_MADVISE,
    XY_MAP_FIXED_OVER,
    XY_KINDS
};

static const char *const xy_names[XY_KINDS] = {
    "libc-munmap", "raw-munmap", "free", "realloc-moves", "raw-madvise", "libc-madvise",
    "map-fixed-over",
};

/* What the program under test checks: arm a registration of [p, p + len) under `cookie`, take
   the snapshot, say whether the check sees a change since it, disarm. */
struct xy_ops {
    void *ctx;
    void (*arm)(void *ctx, char *p, size_t len, uint64_t cookie);
    uint64_t (*snapshot)(void *ctx);
    int (*changed)(void *ctx, uint64_t before);
    void (*disarm)(void *ctx, uint64_t cookie);
};

struct xy_tally {
    _Atomic uint64_t rounds[XY_KINDS];
    _Atomic uint64_t missed[XY_KINDS];
};

/* Whether `kind` is made by a raw syscall (the hooks backend can not see it). */
static inline int xy_raw(enum xy_kind kind) {
    return kind == XY_RAW_MUNMAP || kind == XY_RAW_MADVISE;
}

/* Whether all of [p, p + len) is mapped now. */
static inline int xy_mapped(const char *p, size_t len) {
    return msync((void *)p, len, MS_ASYNC) == 0;
}

static inline char *xy_map(size_t len) {
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        abort();
    memset(p, 0x5a, len);
    return p;
}

/* One round of `kind`; returns 0 if the round could not make its change (a realloc that grew
   in place, an allocator that keeps a freed block mapped), else 1, counting a missed check in
   `t`. */
static inline int xy_round(const struct xy_ops *ops, struct xy_tally *t, enum xy_kind kind,
                           uint64_t cookie) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = 4 * page;
    char *p;
    uint64_t before;
    int seen;
    switch (kind) {
    case XY_FREE:
    case XY_REALLOC_MOVES: {
        /* Above glibc's mmap threshold (xy_init): a mapping of its own. */
        size_t big = 64 * page;
        char *b = malloc(big);
        if (!b)
            abort();
        memset(b, 1, big);
        char *start = (char *)(((uintptr_t)b + page - 1) & ~(uintptr_t)(page - 1));
        ops->arm(ops->ctx, start, 16 * page, cookie);
        before = ops->snapshot(ops->ctx);
        if (kind == XY_FREE) {
            free(b);
            seen = ops->changed(ops->ctx, before);
            /* An allocator that keeps the block mapped (a sanitizer's quarantine, jemalloc)
               changed nothing: not judged. */
            if (xy_mapped(start, 16 * page))
                seen = -1;
        } else {
            /* A page mapped right after the chunk keeps mremap from growing in place. */
            char *end = (char *)(((uintptr_t)b + big + page - 1) & ~(uintptr_t)(page - 1));
            char *wall = mmap(end, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS |
                              MAP_FIXED_NOREPLACE, -1, 0);
            char *nb = realloc(b, 4 * big);
            if (!nb)
                abort();
            seen = nb != b ? ops->changed(ops->ctx, before) : -1;
            if (xy_mapped(start, 16 * page))
                seen = -1; /* copied and kept mapped, not moved: nothing changed */
            free(nb);
            if (wall != MAP_FAILED)
                munmap(wall, page);
        }
        break;
    }
    default:
        p = xy_map(len);
        ops->arm(ops->ctx, p, len, cookie);
        before = ops->snapshot(ops->ctx);
        switch (kind) {
        case XY_LIBC_MUNMAP:
            munmap(p, len);
            break;
        case XY_RAW_MUNMAP:
            syscall(SYS_munmap, p, len);
            break;
        case XY_RAW_MADVISE:
            syscall(SYS_madvise, p, len, MADV_DONTNEED);
            break;
        case XY_LIBC_MADVISE:
            madvise(p, len, MADV_DONTNEED);
            break;
        case XY_MAP_FIXED_OVER:
            mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            break;
        default:
            abort();
        }
        seen = ops->changed(ops->ctx, before);
        if (kind == XY_LIBC_MUNMAP || kind == XY_RAW_MUNMAP) {
            /* x == y: new memory at the same address, if nobody took it meanwhile. */
            char *y = mmap(p, len, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (y != MAP_FAILED)
                munmap(y, len);
        } else {
            munmap(p, len);
        }
    }
    ops->disarm(ops->ctx, cookie);
    if (seen < 0)
        return 0;
    atomic_fetch_add(&t->rounds[kind], 1);
    if (!seen)
        atomic_fetch_add(&t->missed[kind], 1);
    return 1;
}

/* Whether malloc is glibc's (not a preloaded allocator's or a sanitizer's): only glibc's free
   and realloc are sure to unmap and move a block above its mmap threshold, so the free and
   realloc kinds are required to have run only then (elsewhere their rounds are judged when the
   allocator did unmap). */
static inline int xy_glibc_malloc(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    return libc != NULL && dlsym(RTLD_DEFAULT, "malloc") == dlsym(libc, "malloc");
}

/* Whether `kind` is made by the allocator. */
static inline int xy_allocator(enum xy_kind kind) {
    return kind == XY_FREE || kind == XY_REALLOC_MOVES;
}

/* glibc's mmap threshold fixed at 128 KiB (no dynamic raise after a free), so the blocks of
   the free and realloc rounds always get mappings of their own. */
static inline void xy_init(void) {
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
}

static void xy_on_prof(int sig) {
    (void)sig;
}

/* SIGPROF every 100 µs of the process's CPU time (10 kHz), as a sampling profiler. */
static inline void xy_start_profiler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = xy_on_prof;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_PROF, &it, NULL);
}

static inline void xy_stop_profiler(void) {
    struct itimerval off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_PROF, &off, NULL);
}

#endif

/* Tiny test helpers shared by the C test programs (run by tests/c_programs.rs). */
#ifndef UMN_CHECK_H
#define UMN_CHECK_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ummunotify.h"

/* Exit code the Rust harness reads as "skipped: userfaultfd unavailable here". */
#define SKIP_EXIT 77

static int checks_run;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        checks_run++;                                                                \
        if (!(cond)) {                                                               \
            char why_[512];                                                          \
            ummunotify_last_error(why_, sizeof why_);                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, why_);                                          \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define CHECK_RC(call, want)                                                              \
    do {                                                                                  \
        ummunotify_result rc_ = (call);                                                   \
        checks_run++;                                                                     \
        if (rc_ != (want)) {                                                              \
            char why_[512];                                                               \
            ummunotify_last_error(why_, sizeof why_);                                     \
            fprintf(stderr, "%s:%d: %s returned %u (%s), wanted %u (last error: %s)\n",    \
                    __FILE__, __LINE__, #call, (unsigned)rc_, ummunotify_strerror(rc_),   \
                    (unsigned)(want), why_);                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* Creates a notifier or exits with SKIP_EXIT, naming why. */
static inline ummunotify_notifier *new_notifier_or_skip(void) {
    ummunotify_notifier *n = NULL;
    ummunotify_result rc = ummunotify_notifier_new(&n);
    if (rc == UMMUNOTIFY_ERR_UNSUPPORTED) {
        char why[1024];
        ummunotify_last_error(why, sizeof why);
        printf("SKIP: %s\n", why);
        exit(SKIP_EXIT);
    }
    CHECK_RC(rc, UMMUNOTIFY_OK);
    CHECK(n != NULL);
    return n;
}

static inline void *map_pages(size_t pages) {
    void *p = mmap(NULL, pages * (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    memset(p, 1, pages * (size_t)sysconf(_SC_PAGESIZE));
    return p;
}

static inline void done(const char *name) {
    printf("%s: %d checks passed\n", name, checks_run);
}

#endif

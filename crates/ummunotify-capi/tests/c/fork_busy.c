/* Fork from a busy multithreaded program (guarantee 6, issue 40): a child never hangs in fork()
   or after it, whatever the parent's threads held when it forked. Three threads map, register,
   unmap part, check, read events and unregister without pause on one notifier; the main thread
   forks (../../ummunotify-testkit/c/fork_busy.h: UMN_FORK_COUNT, UMN_FORK_SECS,
   UMN_FORK_DEADLINE_SECS). Each child: the inherited registration is invalid, every call on the
   inherited notifier returns UMMUNOTIFY_ERR_FORKED, freeing it returns at once, mmap/munmap
   work; every 16th child (UMN_FORK_OWN_EVERY) starts a notifier of its own, registers a page,
   unmaps it and sees the registration invalid (perf refuses a notifier in a forked child with
   UMMUNOTIFY_ERR_UNSUPPORTED, accepted there). Run on every backend by tests/c_programs.rs
   (UMN_BACKEND). */
#include <pthread.h>
#include <stdint.h>

#include "check.h"
#include "fork_busy.h"

#define THREADS 3

static ummunotify_notifier *n;
static ummunotify_region held;
static size_t page;
static long own_every;
static int perf; /* UMN_BACKEND=perf */

static void *busy(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    ummunotify_event ev[8];
    for (uint64_t i = 0; !atomic_load(&fork_busy_stop); i++) {
        char *q = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(q != MAP_FAILED);
        q[0] = 1;
        uint64_t cookie = (uint64_t)id << 48 | i;
        ummunotify_region r;
        CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)q, (uintptr_t)q + 2 * page, cookie, &r),
                 UMMUNOTIFY_OK);
        CHECK(munmap(q + page, page) == 0);
        size_t count;
        CHECK_RC(ummunotify_notifier_read_events(n, ev, 8, &count, NULL), UMMUNOTIFY_OK);
        (void)ummunotify_notifier_is_valid(n, r);
        CHECK_RC(ummunotify_notifier_unregister(n, cookie), UMMUNOTIFY_OK);
        CHECK(munmap(q, page) == 0);
        void *m = malloc(64 + i % 4096);
        free(m);
    }
    return NULL;
}

/* CHECK exits; in a child a failure must be an exit code the parent reports. */
#define CCHECK(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            char why_[512];                                                           \
            ummunotify_last_error(why_, sizeof why_);                                 \
            fprintf(stderr, "fork_busy child #%ld: %s (last error: %s)\n", i, #cond, why_); \
            return 2;                                                                 \
        }                                                                             \
    } while (0)

static int child(long i, void *ctx) {
    (void)ctx;
    CCHECK(!ummunotify_notifier_is_valid(n, held));
    uint64_t g;
    CCHECK(ummunotify_notifier_generation(n, &g) == UMMUNOTIFY_ERR_FORKED);
    char *q = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CCHECK(q != MAP_FAILED);
    CCHECK(ummunotify_notifier_register(n, (uintptr_t)q, (uintptr_t)q + page, 7, NULL) ==
           UMMUNOTIFY_ERR_FORKED);
    size_t count;
    ummunotify_event ev[1];
    CCHECK(ummunotify_notifier_read_events(n, ev, 1, &count, NULL) == UMMUNOTIFY_ERR_FORKED);
    CCHECK(munmap(q, page) == 0);
    ummunotify_notifier_free(n); /* must not wait for the parent's monitor */
    if (own_every > 0 && i % own_every == 0) {
        ummunotify_notifier *c = NULL;
        ummunotify_result rc = ummunotify_notifier_new(&c);
        /* perf refuses in a forked child (its tracepoint canary sees nothing there): a clear
           error, not a hang. */
        if (rc == UMMUNOTIFY_ERR_UNSUPPORTED && perf)
            return 0;
        CCHECK(rc == UMMUNOTIFY_OK);
        q = map_pages(1);
        ummunotify_region r;
        CCHECK(ummunotify_notifier_register(c, (uintptr_t)q, (uintptr_t)q + page, 1, &r) ==
               UMMUNOTIFY_OK);
        CCHECK(munmap(q, page) == 0);
        CCHECK(ummunotify_notifier_read_events(c, ev, 1, &count, NULL) == UMMUNOTIFY_OK);
        CCHECK(!ummunotify_notifier_is_valid(c, r));
        ummunotify_notifier_free(c);
    }
    return 0;
}

int main(void) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    own_every = fork_busy_env("UMN_FORK_OWN_EVERY", 16);
    perf = getenv("UMN_BACKEND") && strcmp(getenv("UMN_BACKEND"), "perf") == 0;
    n = new_notifier_or_skip();
    char *p = map_pages(1);
    CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)p, (uintptr_t)p + page, 1, &held),
             UMMUNOTIFY_OK);
    pthread_t t[THREADS];
    for (uintptr_t k = 0; k < THREADS; k++)
        CHECK(pthread_create(&t[k], NULL, busy, (void *)(k + 1)) == 0);
    fork_busy_run("fork_busy", child, NULL);
    for (int k = 0; k < THREADS; k++)
        CHECK(pthread_join(t[k], NULL) == 0);
    CHECK(ummunotify_notifier_is_valid(n, held));
    CHECK_RC(ummunotify_notifier_unregister(n, 1), UMMUNOTIFY_OK);
    ummunotify_notifier_free(n);
    munmap(p, page);
    done("fork_busy");
    return 0;
}

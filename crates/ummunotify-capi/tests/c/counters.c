/* The C library's checks under the churn of the 2010 stress (issue 20): three threads do
   x == y rounds of every kind (libc and raw munmap, free of a registered block, realloc that
   moves, raw and libc madvise(DONTNEED), mmap MAP_FIXED over), each with a region on one
   notifier; a fourth churns a second notifier of the same process (messages that hit none of the
   first one's regions, which the first one's counter gives back); SIGPROF at 10 kHz. After each
   call returned, both the header's inline check (`*counter == g`, with `g` from
   ummunotify_notifier_generation()) and ummunotify_notifier_unchanged_since(g) must say
   "changed", and the region must read invalid (ummunotify_notifier_is_valid). UMN_COUNTERS_SECS sets the seconds (default 3);
   raw-syscall kinds are skipped on the hooks backend. */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "check.h"
#include "xy_churn.h"

#define THREADS 3

struct side {
    const ummunotify_notifier *n;
    ummunotify_region region;
};

static struct side main_side, other_side;
static _Atomic int stop;
static struct xy_tally tally, inline_tally, other_tally;
static int raw_ok = 1;

static void arm(void *ctx, char *p, size_t len, uint64_t cookie) {
    struct side *s = ctx;
    CHECK_RC(ummunotify_notifier_register(s->n, (uintptr_t)p, (uintptr_t)p + len, cookie,
                                          &s->region),
             UMMUNOTIFY_OK);
}
static uint64_t snapshot(void *ctx) {
    struct side *s = ctx;
    uint64_t g;
    CHECK_RC(ummunotify_notifier_generation(s->n, &g), UMMUNOTIFY_OK);
    return g;
}
/* unchanged_since and the region's own check: both must see the change. */
static int changed(void *ctx, uint64_t before) {
    struct side *s = ctx;
    return !ummunotify_notifier_unchanged_since(s->n, before) &&
           !ummunotify_notifier_is_valid(s->n, s->region);
}
/* The header's inline check: one load of the counter word. */
static int changed_inline(void *ctx, uint64_t before) {
    struct side *s = ctx;
    return __atomic_load_n(ummunotify_notifier_counter(s->n), __ATOMIC_ACQUIRE) != before;
}
static int any(void *ctx, uint64_t before) {
    (void)ctx;
    (void)before;
    return 1;
}
static void disarm(void *ctx, uint64_t cookie) {
    struct side *s = ctx;
    CHECK_RC(ummunotify_notifier_unregister(s->n, cookie), UMMUNOTIFY_OK);
}

static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    struct side me = {main_side.n, {0}};
    struct xy_ops ops = {&me, arm, snapshot, changed, disarm};
    struct xy_ops inline_ops = {&me, arm, snapshot, changed_inline, disarm};
    for (uint64_t i = 0; !atomic_load(&stop); i++) {
        enum xy_kind k = (enum xy_kind)((i + id) % XY_KINDS);
        if (!raw_ok && xy_raw(k))
            continue;
        if (i / XY_KINDS % 2)
            xy_round(&inline_ops, &inline_tally, k, id << 40 | i);
        else
            xy_round(&ops, &tally, k, id << 40 | i);
    }
    return NULL;
}

static void *other(void *arg) {
    (void)arg;
    struct side me = {other_side.n, {0}};
    struct xy_ops ops = {&me, arm, snapshot, any, disarm};
    for (uint64_t i = 0; !atomic_load(&stop); i++)
        xy_round(&ops, &other_tally, XY_LIBC_MUNMAP, i);
    return NULL;
}

int main(void) {
    const char *secs_env = getenv("UMN_COUNTERS_SECS");
    int secs = secs_env ? atoi(secs_env) : 3;
    const char *backend = getenv("UMN_BACKEND");
    raw_ok = !(backend && strcmp(backend, "hooks") == 0);
    xy_init();
    ummunotify_notifier *a = new_notifier_or_skip();
    ummunotify_notifier *b = new_notifier_or_skip();
    main_side.n = a;
    other_side.n = b;
    xy_start_profiler();
    pthread_t t[THREADS + 1];
    for (uintptr_t i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + 1)) == 0);
    CHECK(pthread_create(&t[THREADS], NULL, other, NULL) == 0);
    struct timespec nap = {secs, 0};
    while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
    }
    atomic_store(&stop, 1);
    for (int i = 0; i <= THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    xy_stop_profiler();
    uint64_t rounds = 0, missed = 0;
    int glibc = xy_glibc_malloc();
    for (int k = 0; k < XY_KINDS; k++) {
        printf("counters %-15s rounds %7llu + %7llu inline, missed %llu + %llu inline\n",
               xy_names[k], (unsigned long long)tally.rounds[k],
               (unsigned long long)inline_tally.rounds[k], (unsigned long long)tally.missed[k],
               (unsigned long long)inline_tally.missed[k]);
        rounds += tally.rounds[k] + inline_tally.rounds[k];
        missed += tally.missed[k] + inline_tally.missed[k];
        /* Another allocator (ASan's quarantine, a preloaded one) may keep freed blocks mapped:
           those rounds change nothing and are not judged. */
        if (xy_allocator((enum xy_kind)k) && !glibc)
            continue;
        CHECK(!raw_ok && xy_raw((enum xy_kind)k) ? 1 : tally.rounds[k] + inline_tally.rounds[k] > 0);
    }
    printf("counters (%s): %llu rounds, %llu missed checks; the second notifier made %llu "
           "rounds\n",
           ummunotify_notifier_backend(a), (unsigned long long)rounds, (unsigned long long)missed,
           (unsigned long long)other_tally.rounds[XY_LIBC_MUNMAP]);
    CHECK(missed == 0);
    ummunotify_notifier_free(b);
    ummunotify_notifier_free(a);
    done("counters");
    return 0;
}

/* The calls the header lists as async-signal-safe, from a signal handler that interrupts the
   main thread anywhere in its own get/put/check loop (another thread sends the signals): the
   handler's checks give the right answers, its puts release handles, nothing deadlocks, and the
   cache frees cleanly afterwards (every handle the handler put is really released). */
#include <pthread.h>
#include <signal.h>

#include "check.h"

#define SIGNALS 2000
#define HELD 64

static ummunotify_notifier *n;
static ummunotify_cache *c;
static ummunotify_region live_region, dead_region;
static uint64_t gen;
static ummunotify_cache_handle held[HELD];
static volatile sig_atomic_t next_put, handled, wrong;

static int reg(void *ctx, uintptr_t start, size_t len, uint64_t *key) {
    (void)ctx;
    (void)len;
    *key = start;
    return 0;
}
static int dereg(void *ctx, uintptr_t start, size_t len, uint64_t key) {
    (void)ctx;
    (void)start;
    (void)len;
    (void)key;
    return 0;
}

static void on_signal(int sig) {
    (void)sig;
    const ummunotify_counter_word *counter = ummunotify_notifier_counter(n);
    if (!ummunotify_notifier_is_valid(n, live_region) ||
        ummunotify_notifier_is_valid(n, dead_region) ||
        !ummunotify_notifier_unchanged_since(n, gen) || *counter != gen ||
        ummunotify_notifier_fd(n) < 0 || ummunotify_notifier_counter_fd(n) < 0 ||
        ummunotify_strerror(UMMUNOTIFY_OK) == NULL || ummunotify_version() == NULL)
        wrong = wrong + 1;
    int i = next_put;
    if (i < HELD) {
        uintptr_t s;
        size_t l;
        ummunotify_cache_handle_range(&held[i], &s, &l);
        if (!ummunotify_cache_handle_is_valid(&held[i]) || ummunotify_cache_handle_key(&held[i]) != s ||
            l == 0)
            wrong = wrong + 1;
        ummunotify_cache_put(&held[i]);
        next_put = i + 1;
    }
    handled = handled + 1;
}

static pthread_t main_thread;
static void *sender(void *arg) {
    (void)arg;
    for (int i = 0; i < SIGNALS; i++) {
        pthread_kill(main_thread, SIGUSR1);
        while (handled <= i)
            sched_yield();
    }
    return NULL;
}

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    n = new_notifier_or_skip();
    ummunotify_registrar r = {.register_fn = reg, .deregister_fn = dereg};
    CHECK_RC(ummunotify_cache_new(&r, NULL, &c), UMMUNOTIFY_OK);
    char *live = map_pages(1), *dead = map_pages(1);
    CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)live, (uintptr_t)live + page, 1,
                                          &live_region),
             UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)dead, (uintptr_t)dead + page, 2,
                                          &dead_region),
             UMMUNOTIFY_OK);
    CHECK(munmap(dead, page) == 0);
    ummunotify_event ev[4];
    size_t count;
    CHECK_RC(ummunotify_notifier_read_events(n, ev, 4, &count, &gen), UMMUNOTIFY_OK);
    CHECK(count == 1 && gen != UMMUNOTIFY_GENERATION_NONE);

    char *buf = map_pages(HELD + 1);
    for (int i = 0; i < HELD; i++) /* a region per handle: misses first, then held */
        CHECK_RC(ummunotify_cache_get(c, (uintptr_t)buf + (size_t)i * page, page, &held[i]),
                 UMMUNOTIFY_OK);

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    main_thread = pthread_self();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sender, NULL) == 0);
    /* The main thread's own hits and checks, interrupted anywhere by the handler. */
    char *mine = buf + (size_t)HELD * page;
    while (handled < SIGNALS) {
        ummunotify_cache_handle h;
        CHECK_RC(ummunotify_cache_get(c, (uintptr_t)mine, 64, &h), UMMUNOTIFY_OK);
        CHECK(ummunotify_cache_handle_is_valid(&h));
        ummunotify_cache_put(&h);
        CHECK(ummunotify_notifier_is_valid(n, live_region));
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(wrong == 0);
    CHECK(next_put == HELD);
    /* Every handle was put (by the handler): the cache frees. */
    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_OK);
    ummunotify_notifier_free(n);
    munmap(live, page);
    munmap(buf, (HELD + 1) * page);
    done("signals");
    return 0;
}

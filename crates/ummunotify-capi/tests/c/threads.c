/* Many threads: concurrent register/unmap/check/read/unregister from C threads; every unmap is
   visible to the unmapping thread when munmap returns; then a clean free. */
#include <pthread.h>

#include "check.h"

#define THREADS 4
#define ROUNDS 200

static ummunotify_notifier *n;

static void *worker(void *arg) {
    uint64_t id = (uint64_t)(uintptr_t)arg;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < ROUNDS; i++) {
        char *p = map_pages(2);
        uint64_t cookie = id << 32 | (uint64_t)i;
        ummunotify_region r;
        CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)p, (uintptr_t)p + 2 * page, cookie,
                                              &r),
                 UMMUNOTIFY_OK);
        /* No assertion that `r` is valid here: another thread's unmap of these very addresses,
           dequeued by the monitor just before this mmap reused them, may still be applied after
           the registration (a conservative, spurious invalidation). */
        CHECK(munmap(p, 2 * page) == 0);
        CHECK(!ummunotify_notifier_is_valid(n, r));
        ummunotify_event ev[8];
        size_t count;
        CHECK_RC(ummunotify_notifier_read_events(n, ev, 8, &count, NULL), UMMUNOTIFY_OK);
        CHECK_RC(ummunotify_notifier_unregister(n, cookie), UMMUNOTIFY_OK);
    }
    return NULL;
}

int main(void) {
    n = new_notifier_or_skip();
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + 1)) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    ummunotify_notifier_stats st = {.size = sizeof st};
    CHECK_RC(ummunotify_notifier_get_stats(n, &st), UMMUNOTIFY_OK);
    CHECK(st.regions == 0);
    ummunotify_notifier_free(n);
    done("threads");
    return 0;
}

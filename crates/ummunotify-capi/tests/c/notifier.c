/* The notifier: register, O(1) checks, the counter fast path, events and hints, the poll fd. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/syscall.h>

#include "check.h"

static int readable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ummunotify_notifier *n = new_notifier_or_skip();
    const ummunotify_counter_word *counter = ummunotify_notifier_counter(n);
    int fd = ummunotify_notifier_fd(n);
    CHECK(counter != NULL && fd >= 0);

    char *p = map_pages(8);
    uintptr_t a = (uintptr_t)p;
    ummunotify_region whole, first, last;
    CHECK_RC(ummunotify_notifier_register(n, a, a + 8 * page, 100, &whole), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_register(n, a, a + page, 101, &first), UMMUNOTIFY_OK);
    /* Byte ranges need not be page aligned. */
    CHECK_RC(ummunotify_notifier_register(n, a + 7 * page + 10, a + 8 * page - 10, 102, &last),
             UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, whole));
    CHECK(ummunotify_notifier_is_valid(n, first));
    CHECK(ummunotify_notifier_is_valid(n, last));

    uint64_t g;
    CHECK_RC(ummunotify_notifier_generation(n, &g), UMMUNOTIFY_OK);
    CHECK(*counter == g);
    CHECK(ummunotify_notifier_unchanged_since(n, g));
    CHECK(!readable(fd));

    /* One change of page 3: only `whole` is hit, with a hint; visible when madvise returns. */
    CHECK(madvise(p + 3 * page, page, MADV_DONTNEED) == 0);
    CHECK(!ummunotify_notifier_is_valid(n, whole));
    CHECK(ummunotify_notifier_is_valid(n, first));
    CHECK(*counter != g);
    CHECK(!ummunotify_notifier_unchanged_since(n, g));
    CHECK(readable(fd));

    ummunotify_event ev[4];
    size_t count;
    uint64_t drained;
    CHECK_RC(ummunotify_notifier_read_events(n, ev, 4, &count, &drained), UMMUNOTIFY_OK);
    CHECK(count == 1);
    CHECK(ev[0].cookie == 100 && ev[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
    CHECK(ev[0].start == a + 3 * page && ev[0].end == a + 4 * page);
    CHECK(drained != UMMUNOTIFY_GENERATION_NONE && *counter == drained);
    CHECK(!readable(fd));
    /* The old token stays invalid; a fresh one is valid (the region re-armed). */
    CHECK(!ummunotify_notifier_is_valid(n, whole));
    CHECK_RC(ummunotify_notifier_region(n, 100, &whole), UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, whole));

    /* Two hits before reading: no hint, the whole region. A raw syscall is seen too. (Region 100
       has lost pages now: re-armed over the hole it stays invalid, but it is not deaf: it keeps
       watching its mapped pages, and reports their next change.) */
    CHECK(syscall(SYS_munmap, p + 5 * page, page) == 0);
    CHECK(!ummunotify_notifier_is_valid(n, whole));
    CHECK(madvise(p + 7 * page, page, MADV_DONTNEED) == 0);
    CHECK(!ummunotify_notifier_is_valid(n, last));
    CHECK_RC(ummunotify_notifier_read_events(n, ev, 4, &count, &drained), UMMUNOTIFY_OK);
    CHECK(count == 2);
    CHECK_RC(ummunotify_notifier_region(n, 102, &last), UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, last));
    int seen = 0;
    for (size_t i = 0; i < count; i++) {
        if (ev[i].cookie == 100) {
            CHECK(ev[i].flags == 0 && ev[i].start == a && ev[i].end == a + 8 * page);
            seen |= 1;
        } else if (ev[i].cookie == 102) {
            CHECK(ev[i].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
            CHECK(ev[i].start == a + 7 * page + 10 && ev[i].end == a + 8 * page - 10);
            seen |= 2;
        }
    }
    CHECK(seen == 3);
    CHECK(ummunotify_notifier_is_valid(n, first));

    /* Capacity 1: one event at a time, "not drained" until the last. */
    CHECK(munmap(p, page) == 0);                            /* hits 101 (and 100) */
    CHECK(madvise(p + 7 * page, page, MADV_DONTNEED) == 0); /* hits 102 (and 100) */
    int got = 0, reads = 0;
    do {
        CHECK_RC(ummunotify_notifier_read_events(n, ev, 1, &count, &drained), UMMUNOTIFY_OK);
        CHECK(count == 1 || drained != UMMUNOTIFY_GENERATION_NONE);
        if (count == 1 && ev[0].cookie == 101) got |= 1;
        if (count == 1 && ev[0].cookie == 102) got |= 2;
        CHECK(++reads < 10);
    } while (drained == UMMUNOTIFY_GENERATION_NONE);
    CHECK(got == 3 && reads >= 2);

    ummunotify_notifier_stats st = {.size = sizeof st};
    CHECK_RC(ummunotify_notifier_get_stats(n, &st), UMMUNOTIFY_OK);
    CHECK(st.regions == 3 && st.pending == 0 && st.events_read >= 5);

    /* The counter memfd maps to another live view of the same word. */
    const volatile uint64_t *view =
        mmap(NULL, 8, PROT_READ, MAP_SHARED, ummunotify_notifier_counter_fd(n), 0);
    CHECK(view != MAP_FAILED);
    CHECK(*view == *counter);

    /* Unregister discards; unmapping the rest changes nothing registered. */
    CHECK_RC(ummunotify_notifier_unregister(n, 100), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_unregister(n, 101), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_unregister(n, 102), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_generation(n, &g), UMMUNOTIFY_OK);
    munmap(p, 8 * page);
    CHECK_RC(ummunotify_notifier_read_events(n, ev, 4, &count, &drained), UMMUNOTIFY_OK);
    CHECK(count == 0);

    munmap((void *)view, 8);

    /* A token names its notifier: notifier A's token never reads valid on notifier B, even where
       B has a region in the same slot with the same serial (both fresh: slot 0, first serial). */
    ummunotify_notifier *na = new_notifier_or_skip(), *nb = new_notifier_or_skip();
    char *qa = map_pages(1), *qb = map_pages(1);
    ummunotify_region ra, rb;
    CHECK_RC(ummunotify_notifier_register(na, (uintptr_t)qa, (uintptr_t)qa + page, 1, &ra),
             UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_register(nb, (uintptr_t)qb, (uintptr_t)qb + page, 1, &rb),
             UMMUNOTIFY_OK);
    CHECK(ra.slot == rb.slot && ra.tag == rb.tag); /* the core's part of the tokens is equal */
    CHECK(ummunotify_notifier_is_valid(na, ra) && ummunotify_notifier_is_valid(nb, rb));
    CHECK(!ummunotify_notifier_is_valid(nb, ra));
    CHECK(!ummunotify_notifier_is_valid(na, rb));
    ummunotify_region zero = {0};
    CHECK(!ummunotify_notifier_is_valid(na, zero));
    ummunotify_notifier_free(na);
    ummunotify_notifier_free(nb);
    munmap(qa, page);
    munmap(qb, page);

    /* Holes, the 2010 rule (opt-in): register refuses a range that is not all mapped,
       register_any accepts it; filling the hole invalidates nothing, and once announced with
       ummunotify_notifier_mapped the new memory is watched. */
    char *h = map_pages(3);
    uintptr_t ha = (uintptr_t)h;
    CHECK(munmap(h + page, page) == 0);
    ummunotify_region rh;
    CHECK_RC(ummunotify_notifier_register(n, ha, ha + 3 * page, 200, NULL),
             UMMUNOTIFY_ERR_UNMAPPED);
    CHECK_RC(ummunotify_notifier_register_any(n, ha, ha + 3 * page, 200, &rh), UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, rh));
    CHECK(mmap(h + page, page, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == h + page);
    CHECK(ummunotify_notifier_is_valid(n, rh));
    CHECK_RC(ummunotify_notifier_mapped(n, ha + page, ha + 2 * page), UMMUNOTIFY_OK);
    CHECK(munmap(h + page, page) == 0);
    CHECK(!ummunotify_notifier_is_valid(n, rh));
    CHECK_RC(ummunotify_notifier_read_events(n, ev, 4, &count, &drained), UMMUNOTIFY_OK);
    CHECK(count == 1 && ev[0].cookie == 200 && ev[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
    CHECK(ev[0].start == ha + page && ev[0].end == ha + 2 * page);
    CHECK_RC(ummunotify_notifier_unregister(n, 200), UMMUNOTIFY_OK);
    munmap(h, 3 * page);

    /* Stats structs can grow: a missing size is refused, nothing written. */
    ummunotify_notifier_stats nosize = {.size = 0, .regions = 77};
    CHECK_RC(ummunotify_notifier_get_stats(n, &nosize), UMMUNOTIFY_ERR_INVALID_ARGUMENT);
    CHECK(nosize.regions == 77);

    ummunotify_notifier_free(n);
    done("notifier");
    return 0;
}

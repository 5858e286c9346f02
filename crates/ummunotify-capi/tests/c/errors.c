/* Error handling: NULL and bad arguments return documented codes, never crash. */
#include "check.h"

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    /* Names and messages. */
    CHECK(strcmp(ummunotify_strerror(UMMUNOTIFY_OK), "success") == 0);
    CHECK(strlen(ummunotify_strerror(UMMUNOTIFY_ERR_DUPLICATE_COOKIE)) > 0);
    CHECK(strcmp(ummunotify_strerror(123456), "unknown ummunotify_result code") == 0);
    CHECK(ummunotify_version() != NULL && strlen(ummunotify_version()) > 0);
    CHECK(UMMUNOTIFY_ERR_NULL_ARGUMENT > 4095); /* above every errno */

    /* NULL handles and out-pointers. */
    CHECK_RC(ummunotify_notifier_new(NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK(ummunotify_last_error(NULL, 0) > 0);
    char small[8];
    size_t full = ummunotify_last_error(small, sizeof small);
    CHECK(full > sizeof small - 1 && strlen(small) == sizeof small - 1);
    ummunotify_notifier_free(NULL);
    CHECK_RC(ummunotify_notifier_register(NULL, 0, 1, 1, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_unregister(NULL, 1), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_region(NULL, 1, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    ummunotify_region zero = {0};
    CHECK(!ummunotify_notifier_is_valid(NULL, zero));
    CHECK_RC(ummunotify_notifier_generation(NULL, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK(!ummunotify_notifier_unchanged_since(NULL, 0));
    CHECK(ummunotify_notifier_counter(NULL) == NULL);
    CHECK(ummunotify_notifier_fd(NULL) == -1);
    CHECK(ummunotify_notifier_counter_fd(NULL) == -1);
    size_t count = 99;
    CHECK_RC(ummunotify_notifier_read_events(NULL, NULL, 0, &count, NULL),
             UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_get_stats(NULL, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);

    ummunotify_notifier *n = new_notifier_or_skip();
    CHECK_RC(ummunotify_notifier_generation(n, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_region(n, 1, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_get_stats(n, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_read_events(n, NULL, 4, &count, NULL),
             UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_read_events(n, NULL, 0, NULL, NULL),
             UMMUNOTIFY_ERR_NULL_ARGUMENT);
    /* capacity 0 is fine: reports whether the queue is drained. */
    uint64_t drained = 0;
    CHECK_RC(ummunotify_notifier_read_events(n, NULL, 0, &count, &drained), UMMUNOTIFY_OK);
    CHECK(count == 0 && drained != UMMUNOTIFY_GENERATION_NONE);

    /* Bad ranges. */
    char *p = map_pages(2);
    uintptr_t a = (uintptr_t)p;
    CHECK_RC(ummunotify_notifier_register(n, a, a, 1, NULL), UMMUNOTIFY_ERR_EMPTY_RANGE);
    CHECK_RC(ummunotify_notifier_register(n, a + page, a, 1, NULL),
             UMMUNOTIFY_ERR_WRAPPING_RANGE);
    CHECK_RC(ummunotify_notifier_register(n, UINTPTR_MAX - 10, UINTPTR_MAX, 1, NULL),
             UMMUNOTIFY_ERR_WRAPPING_RANGE);
    /* Below vm.mmap_min_addr: never mapped, and no other thread can map it meanwhile. */
    char *hole = (char *)(uintptr_t)page;
    CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)hole, (uintptr_t)hole + page, 1, NULL),
             UMMUNOTIFY_ERR_UNMAPPED);
    char msg[256];
    ummunotify_last_error(msg, sizeof msg);
    CHECK(strstr(msg, "not mapped") != NULL);
    /* ... which register_any accepts (the 2010 rule), with a valid token. */
    ummunotify_region any;
    CHECK_RC(ummunotify_notifier_register_any(n, (uintptr_t)hole, (uintptr_t)hole + page, 9,
                                              &any),
             UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, any));
    CHECK_RC(ummunotify_notifier_mapped(n, (uintptr_t)hole, (uintptr_t)hole + page),
             UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_register_any(n, a, a, 10, NULL), UMMUNOTIFY_ERR_EMPTY_RANGE);
    CHECK_RC(ummunotify_notifier_register_any(NULL, a, a + page, 10, NULL),
             UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_mapped(NULL, a, a + page), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_unregister(n, 9), UMMUNOTIFY_OK);

    /* Cookies: duplicate and unknown. */
    CHECK_RC(ummunotify_notifier_register(n, a, a + page, 1, NULL), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_register(n, a + page, a + 2 * page, 1, NULL),
             UMMUNOTIFY_ERR_DUPLICATE_COOKIE);
    CHECK_RC(ummunotify_notifier_unregister(n, 2), UMMUNOTIFY_ERR_UNKNOWN_COOKIE);
    ummunotify_region r;
    CHECK_RC(ummunotify_notifier_region(n, 2, &r), UMMUNOTIFY_ERR_UNKNOWN_COOKIE);
    CHECK_RC(ummunotify_notifier_unregister(n, 1), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_notifier_unregister(n, 1), UMMUNOTIFY_ERR_UNKNOWN_COOKIE);

    /* A forged token answers, it does not crash. */
    ummunotify_region forged = {.slot = 0xffffff, .notifier = 0, .tag = 42};
    CHECK(!ummunotify_notifier_is_valid(n, forged));

    ummunotify_notifier_free(n);
    munmap(p, 2 * page);
    done("errors");
    return 0;
}

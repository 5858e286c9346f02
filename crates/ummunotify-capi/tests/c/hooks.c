/* The C library on the hooks backend (run with UMN_BACKEND=hooks, as a container without
 * userfaultfd would get it from Auto): libc munmap, madvise, mmap(MAP_FIXED) and free() of an
 * mmapped malloc block are seen before they return; a raw syscall is not (shown, not hidden).
 * Run with UMN_BACKEND=hybrid too: the same, and the raw syscall is seen (by userfaultfd). */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

#include "check.h"

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ummunotify_notifier *n = new_notifier_or_skip();
    const char *asked = getenv("UMN_BACKEND");
    int hybrid = asked != NULL && strcmp(asked, "hybrid") == 0;
    CHECK(strcmp(ummunotify_notifier_backend(n), hybrid ? "hybrid" : "hooks") == 0);
    CHECK(ummunotify_notifier_backend(NULL) == NULL);
    char *p = map_pages(4);
    uintptr_t a = (uintptr_t)p;
    ummunotify_region r[4];
    for (int i = 0; i < 4; i++)
        CHECK_RC(ummunotify_notifier_register(n, a + i * page, a + (i + 1) * page, 10 + i, &r[i]),
                 UMMUNOTIFY_OK);
    CHECK(munmap(p, page) == 0);
    CHECK(!ummunotify_notifier_is_valid(n, r[0]));
    CHECK(madvise(p + page, page, MADV_DONTNEED) == 0);
    CHECK(!ummunotify_notifier_is_valid(n, r[1]));
    CHECK(mmap(p + 2 * page, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
          p + 2 * page);
    CHECK(!ummunotify_notifier_is_valid(n, r[2]));
    /* What hooks can not see: a raw syscall stays valid (the documented limit); hybrid's
     * userfaultfd half sees it. */
    CHECK(syscall(SYS_munmap, p + 3 * page, page) == 0);
    if (hybrid) {
        CHECK(!ummunotify_notifier_is_valid(n, r[3]));
    } else {
        CHECK(ummunotify_notifier_is_valid(n, r[3]));
        printf("hooks: raw syscall(SYS_munmap) missed, as documented\n");
    }

    /* free() of an mmapped block: glibc's internal __munmap (under ASan, its allocator keeps
     * freed blocks in quarantine instead, so this part is glibc's malloc only). */
#if !defined(__SANITIZE_ADDRESS__)
    CHECK(mallopt(M_MMAP_THRESHOLD, 128 << 10) == 1);
    char *block = malloc(1 << 20);
    CHECK(block != NULL);
    uintptr_t inner = ((uintptr_t)block + 2 * page) & ~(uintptr_t)(page - 1);
    ummunotify_region rb;
    CHECK_RC(ummunotify_notifier_register(n, inner, inner + page, 20, &rb), UMMUNOTIFY_OK);
    free(block);
    CHECK(!ummunotify_notifier_is_valid(n, rb));
#endif
    munmap(p + page, 3 * page);
    ummunotify_notifier_free(n);
    done("hooks");
    return 0;
}

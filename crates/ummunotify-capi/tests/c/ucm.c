/* Another patcher in the process: UCX's memory hooks (libucm, installed when libucs loads:
   it rewrites the entries of libc's mmap, munmap, madvise, mremap, brk, shmdt with jumps). The
   hooks backend patches the same instructions. Whatever the order, nothing may crash or hang and
   no check may pass after a change returned:

   UMN_UCM_ORDER=first (libucs preloaded by the harness, so UCX patched first):
     hooks and hybrid refuse to start, naming the other library and the fallback; the default
     backend (userfaultfd) works, with UCX's jumps in place.
   UMN_UCM_ORDER=reloc (libucs preloaded with UCX_MEM_MMAP_HOOK_MODE=reloc: UCX rewrites GOT
     entries, not libc's code): every backend starts, and sees libc's calls through UCX's.
   UMN_UCM_ORDER=late (libucs dlopened after the notifier started):
     hooks: the notifier stops before UCX writes (its mprotect of libc's text is seen): every
     check fails from then on, and registering says why; hybrid carries on through userfaultfd.
   Every mode then churns: register, munmap or madvise, check, read, unregister. */
#include <dlfcn.h>
#include <errno.h>

#include "check.h"

#define ROUNDS 200

static int starts_with_jump(const char *name) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    const unsigned char *p = libc ? dlsym(libc, name) : NULL;
    return p != NULL && p[0] == 0xe9;
}

/* Rounds of x == y changes; returns how many checks passed after the change returned. */
static int churn(const ummunotify_notifier *n, int expect_ok) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int stale = 0;
    for (uint64_t i = 0; i < ROUNDS; i++) {
        char *p = map_pages(2);
        ummunotify_region r;
        ummunotify_result rc =
            ummunotify_notifier_register(n, (uintptr_t)p, (uintptr_t)p + 2 * page, i, &r);
        if (!expect_ok) {
            CHECK(rc == UMMUNOTIFY_ERR_UNSUPPORTED);
            munmap(p, 2 * page);
            continue;
        }
        CHECK_RC(rc, UMMUNOTIFY_OK);
        if (i % 2)
            CHECK(madvise(p, page, MADV_DONTNEED) == 0);
        else
            CHECK(munmap(p, 2 * page) == 0);
        if (ummunotify_notifier_is_valid(n, r))
            stale++;
        ummunotify_event ev[4];
        size_t count;
        CHECK_RC(ummunotify_notifier_read_events(n, ev, 4, &count, NULL), UMMUNOTIFY_OK);
        CHECK_RC(ummunotify_notifier_unregister(n, i), UMMUNOTIFY_OK);
        if (i % 2)
            munmap(p, 2 * page);
    }
    return stale;
}

int main(void) {
    const char *order = getenv("UMN_UCM_ORDER");
    const char *backend = getenv("UMN_BACKEND");
    int late = order && strcmp(order, "late") == 0;
    int reloc = order && strcmp(order, "reloc") == 0;
    int hooks = backend && strcmp(backend, "hooks") == 0;
    int hybrid = backend && strcmp(backend, "hybrid") == 0;
    if (reloc) {
        CHECK(!starts_with_jump("munmap"));
        if (!dlopen("libucs.so.0", RTLD_NOW | RTLD_NOLOAD)) {
            printf("SKIP: libucs was not preloaded\n");
            return SKIP_EXIT;
        }
    } else if (!late && !starts_with_jump("munmap")) {
        printf("SKIP: libucs was not preloaded (UCX's memory hooks are not in libc's munmap)\n");
        return SKIP_EXIT;
    }
    ummunotify_notifier *n = NULL;
    ummunotify_result rc = ummunotify_notifier_new(&n);
    char why[1024];
    ummunotify_last_error(why, sizeof why);
    if (!late && !reloc && (hooks || hybrid)) {
        /* UCX came first: refused, naming it and the fallback. */
        CHECK(rc == UMMUNOTIFY_ERR_UNSUPPORTED);
        CHECK(strstr(why, "another library patched libc first") != NULL);
        CHECK(strstr(why, "UCX_MEM_EVENTS=n") != NULL && strstr(why, "userfaultfd") != NULL);
        printf("ucm first, %s: refused (%s)\n", backend, why);
        done("ucm");
        return 0;
    }
    CHECK_RC(rc, UMMUNOTIFY_OK);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ummunotify_region before;
    char *held = map_pages(1);
    CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)held, (uintptr_t)held + page, 1 << 20,
                                          &before),
             UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, before));
    if (late) {
        void *ucs = dlopen("libucs.so.0", RTLD_NOW | RTLD_GLOBAL);
        if (!ucs) {
            printf("SKIP: libucs.so.0 (Debian's libucx0): %s\n", dlerror());
            return SKIP_EXIT;
        }
        CHECK(starts_with_jump("munmap")); /* UCX's jump, over ours */
    }
    int ok = !(late && hooks);
    if (!ok) {
        /* Stopped before UCX wrote: every check fails, registering names the reason. */
        CHECK(!ummunotify_notifier_is_valid(n, before));
        ummunotify_region r;
        CHECK(ummunotify_notifier_register(n, (uintptr_t)held, (uintptr_t)held + page, 2, &r) ==
              UMMUNOTIFY_ERR_UNSUPPORTED);
        ummunotify_last_error(why, sizeof why);
        CHECK(strstr(why, "another library is writing into libc's code") != NULL);
    } else {
        CHECK(ummunotify_notifier_is_valid(n, before));
    }
    int stale = churn(n, ok);
    printf("ucm %s, %s: %d stale checks of %d\n", order ? order : "first",
           ummunotify_notifier_backend(n), stale, ROUNDS);
    CHECK(stale == 0);
    munmap(held, page);
    ummunotify_notifier_free(n);
    done("ucm");
    return 0;
}

/* The ready-made verbs registrar's C surface, on any machine: NULL arguments, the typed error
   where libibverbs is absent, and the release rules. (Registering through it needs an RDMA
   device: kernel/rxe/verbs_hazard.c runs that on soft-RoCE in the QEMU guest.) */
#include "check.h"

int main(void) {
    ummunotify_registrar r;
    memset(&r, 0, sizeof r);
    /* Never dereferenced: creating the registrar makes no verbs call. */
    static long fake_pd[8];
    struct ibv_pd *pd = (struct ibv_pd *)fake_pd;

    CHECK_RC(ummunotify_verbs_registrar_new(NULL, 0, &r), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK(r.register_fn == NULL && r.ctx == NULL); /* state unchanged */
    CHECK_RC(ummunotify_verbs_registrar_new(pd, 0, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK(strstr(ummunotify_strerror(UMMUNOTIFY_ERR_VERBS_UNAVAILABLE), "libibverbs") != NULL);

    ummunotify_result rc = ummunotify_verbs_registrar_new(pd, 7, &r);
    if (rc == UMMUNOTIFY_ERR_VERBS_UNAVAILABLE) {
        char why[512];
        ummunotify_last_error(why, sizeof why);
        CHECK(strstr(why, "libibverbs.so.1") != NULL);
        CHECK(r.register_fn == NULL);
        puts("libibverbs absent: typed error checked");
        return 0;
    }
    CHECK_RC(rc, UMMUNOTIFY_OK);
    CHECK(r.register_fn != NULL && r.deregister_fn != NULL && r.ctx != NULL);
    CHECK(r.max_len == 0 && r.max_registrations == 0);

    /* A registrar of the caller's own is not ours to free. */
    ummunotify_registrar mine = r;
    mine.register_fn = NULL;
    ummunotify_verbs_registrar_free(&mine);
    CHECK(mine.ctx == r.ctx);

    ummunotify_verbs_registrar_free(&r);
    CHECK(r.register_fn == NULL && r.deregister_fn == NULL && r.ctx == NULL);
    ummunotify_verbs_registrar_free(&r); /* released already: no-op */
    ummunotify_verbs_registrar_free(NULL);
    printf("verbs registrar C surface: %d checks passed\n", checks_run);
    return 0;
}

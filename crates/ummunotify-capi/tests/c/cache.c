/* The registration cache with a C registrar: the x == y story, hits, limits, flush, stats,
   handle lifetime, and errors. The "device" pins by copying: a registration's key names a
   snapshot of the memory taken at registration, which is what a NIC would DMA from. */
#include <errno.h>
#include <pthread.h>

#include "check.h"

#define MAX_KEYS 256
struct fake_device {
    pthread_mutex_t lock;
    int fail_next; /* errno to return from the next register */
    uint64_t next_key;
    struct {
        uintptr_t start;
        size_t len;
        unsigned char first_byte; /* the "pinned pages" content */
        int live;
        int deregistered;
    } reg[MAX_KEYS];
    int registers, deregisters;
};

static int dev_register(void *ctx, uintptr_t start, size_t len, uint64_t *key_out) {
    struct fake_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    if (d->fail_next) {
        int e = d->fail_next;
        d->fail_next = 0;
        pthread_mutex_unlock(&d->lock);
        return e;
    }
    uint64_t k = ++d->next_key;
    if (k >= MAX_KEYS) abort();
    d->reg[k].start = start;
    d->reg[k].len = len;
    d->reg[k].first_byte = *(unsigned char *)start;
    d->reg[k].live = 1;
    d->registers++;
    *key_out = k;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int dev_deregister(void *ctx, uintptr_t start, size_t len, uint64_t key) {
    struct fake_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    if (key == 0 || key >= MAX_KEYS || !d->reg[key].live || d->reg[key].start != start ||
        d->reg[key].len != len) {
        fprintf(stderr, "bad deregister of key %llu\n", (unsigned long long)key);
        abort();
    }
    d->reg[key].live = 0;
    d->reg[key].deregistered++;
    d->deregisters++;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* "send from addr": what the device would transmit for this handle. */
static unsigned char device_reads(struct fake_device *d, const ummunotify_cache_handle *h) {
    return d->reg[ummunotify_cache_handle_key(h)].first_byte;
}

static struct fake_device dev = {.lock = PTHREAD_MUTEX_INITIALIZER};

static ummunotify_cache *new_cache_or_skip(const ummunotify_cache_config *cfg) {
    ummunotify_registrar r = {
        .register_fn = dev_register, .deregister_fn = dev_deregister, .ctx = &dev};
    ummunotify_cache *c = NULL;
    ummunotify_result rc = ummunotify_cache_new(&r, cfg, &c);
    if (rc == UMMUNOTIFY_ERR_UNSUPPORTED) {
        char why[1024];
        ummunotify_last_error(why, sizeof why);
        printf("SKIP: %s\n", why);
        exit(SKIP_EXIT);
    }
    CHECK_RC(rc, UMMUNOTIFY_OK);
    return c;
}

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    /* Errors first: NULLs, a registrar without callbacks. */
    ummunotify_cache *c = NULL;
    ummunotify_registrar bad = {0};
    CHECK_RC(ummunotify_cache_new(NULL, NULL, &c), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_cache_new(&bad, NULL, &c), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_cache_free(NULL), UMMUNOTIFY_OK);
    ummunotify_cache_put(NULL);
    CHECK(ummunotify_cache_handle_key(NULL) == 0);
    CHECK(!ummunotify_cache_handle_is_valid(NULL));
    CHECK_RC(ummunotify_cache_get(NULL, 0, 1, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_cache_flush(NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK(ummunotify_cache_notifier(NULL) == NULL);
    ummunotify_cache_config cfg = {.size = 0};
    CHECK_RC(ummunotify_cache_config_default(&cfg), UMMUNOTIFY_ERR_INVALID_ARGUMENT); /* no size */
    cfg.size = sizeof cfg;
    CHECK_RC(ummunotify_cache_config_default(&cfg), UMMUNOTIFY_OK);
    CHECK(cfg.size == sizeof cfg);
    CHECK(cfg.max_regions > 0 && cfg.max_bytes == SIZE_MAX && cfg.merge_adjacent);
    cfg.max_regions = 0;
    ummunotify_registrar good = {
        .register_fn = dev_register, .deregister_fn = dev_deregister, .ctx = &dev};
    CHECK_RC(ummunotify_cache_new(&good, &cfg, &c), UMMUNOTIFY_ERR_INVALID_ARGUMENT);

    c = new_cache_or_skip(NULL);
    ummunotify_cache_handle h, h2;
    CHECK_RC(ummunotify_cache_get(c, 0, 0, &h), UMMUNOTIFY_ERR_EMPTY_RANGE);
    CHECK_RC(ummunotify_cache_get(c, page, page, &h), UMMUNOTIFY_ERR_UNMAPPED);
    CHECK_RC(ummunotify_cache_get(c, 0, 1, NULL), UMMUNOTIFY_ERR_NULL_ARGUMENT);

    /* x == y. */
    char *x = map_pages(4);
    memset(x, 'x', 4 * page);
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)x, 4 * page, &h), UMMUNOTIFY_OK); /* miss */
    CHECK(ummunotify_cache_handle_is_valid(&h));
    CHECK(device_reads(&dev, &h) == 'x');
    uint64_t key_x = ummunotify_cache_handle_key(&h);
    ummunotify_cache_put(&h);
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)x + 100, 1000, &h), UMMUNOTIFY_OK); /* hit */
    CHECK(ummunotify_cache_handle_key(&h) == key_x);
    uintptr_t rs;
    size_t rl;
    ummunotify_cache_handle_range(&h, &rs, &rl);
    CHECK(rs == (uintptr_t)x && rl == 4 * page);
    ummunotify_cache_put(&h);
    CHECK(dev.registers == 1);

    CHECK(munmap(x, 4 * page) == 0);
    char *y = mmap(x, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0);
    CHECK(y == x); /* y == x, by force */
    memset(y, 'y', 4 * page);
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)y, 4 * page, &h), UMMUNOTIFY_OK);
    CHECK(ummunotify_cache_handle_key(&h) != key_x); /* never the stale registration */
    CHECK(device_reads(&dev, &h) == 'y');
    CHECK(dev.registers == 2);

    /* A handle held across an invalidation: stays registered, reads invalid, deregistered
       after the put. */
    CHECK(madvise(y, page, MADV_DONTNEED) == 0);
    CHECK(!ummunotify_cache_handle_is_valid(&h));
    uint64_t key_y = ummunotify_cache_handle_key(&h);
    CHECK(dev.reg[key_y].live);
    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_ERR_CACHE_BUSY); /* a handle is out */
    ummunotify_cache_put(&h);
    CHECK_RC(ummunotify_cache_flush(c), UMMUNOTIFY_OK);
    CHECK(!dev.reg[key_x].live && dev.reg[key_x].deregistered == 1);
    CHECK(!dev.reg[key_y].live && dev.reg[key_y].deregistered == 1);

    ummunotify_cache_stats st = {.size = sizeof st};
    CHECK_RC(ummunotify_cache_get_stats(c, &st), UMMUNOTIFY_OK);
    CHECK(st.hits == 1 && st.misses == 2 && st.invalidations == 2);
    CHECK(st.deregistrations == 2 && st.regions == 0 && st.retired == 0);

    /* Registrar failure is reported with its errno. */
    dev.fail_next = EPERM;
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)y, page, &h), UMMUNOTIFY_ERR_REGISTER);
    char msg[256];
    ummunotify_last_error(msg, sizeof msg);
    CHECK(strstr(msg, "register") != NULL);

    /* The borrowed notifier works for the program's own regions (cookies below 1 << 63). */
    const ummunotify_notifier *n = ummunotify_cache_notifier(c);
    char *own = map_pages(1);
    ummunotify_region r;
    CHECK_RC(ummunotify_notifier_register(n, (uintptr_t)own, (uintptr_t)own + page, 5, &r),
             UMMUNOTIFY_OK);
    CHECK(ummunotify_notifier_is_valid(n, r));
    munmap(own, page);
    CHECK(!ummunotify_notifier_is_valid(n, r));
    CHECK_RC(ummunotify_notifier_unregister(n, 5), UMMUNOTIFY_OK);

    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_OK);
    munmap(y, 4 * page);

    /* Limits: at most 2 regions; the least recently used unused one is evicted. */
    CHECK_RC(ummunotify_cache_config_default(&cfg), UMMUNOTIFY_OK);
    cfg.max_regions = 2;
    cfg.merge_adjacent = false;
    c = new_cache_or_skip(&cfg);
    int before = dev.registers;
    char *a = map_pages(1), *b = map_pages(1), *d = map_pages(1);
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)a, page, &h), UMMUNOTIFY_OK);
    ummunotify_cache_put(&h);
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)b, page, &h), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)d, page, &h2), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_cache_get_stats(c, &st), UMMUNOTIFY_OK);
    CHECK(st.regions <= 2 && st.evictions >= 1);
    CHECK(dev.registers == before + 3);
    ummunotify_cache_put(&h);
    ummunotify_cache_put(&h2);
    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_OK);
    /* Every key ever registered was deregistered exactly once. */
    for (uint64_t k = 1; k <= dev.next_key; k++)
        CHECK(!dev.reg[k].live && dev.reg[k].deregistered == 1);
    CHECK(dev.registers == dev.deregisters);
    munmap(a, page);
    munmap(b, page);
    munmap(d, page);

    /* Structs that grow: a program built against a newer header (a bigger struct) gets what this
       library knows, and the bytes it does not know are left alone on output and must be zero
       on input; a missing size is refused. */
    struct {
        ummunotify_cache_stats s;
        uint64_t future[4];
    } big = {.s.size = sizeof big, .future = {0xAA, 0xAA, 0xAA, 0xAA}};
    struct {
        ummunotify_cache_config c;
        uint64_t future[2];
    } bigcfg = {.c.size = sizeof bigcfg};
    CHECK_RC(ummunotify_cache_config_default(&bigcfg.c), UMMUNOTIFY_OK);
    CHECK(bigcfg.c.size == sizeof bigcfg && bigcfg.future[0] == 0 && bigcfg.future[1] == 0);
    c = new_cache_or_skip(&bigcfg.c);
    CHECK_RC(ummunotify_cache_get_stats(c, &big.s), UMMUNOTIFY_OK);
    CHECK(big.s.size == sizeof big && big.s.regions == 0);
    for (int i = 0; i < 4; i++)
        CHECK(big.future[i] == 0xAA);
    ummunotify_cache_stats nosize = {.size = 0, .hits = 12345};
    CHECK_RC(ummunotify_cache_get_stats(c, &nosize), UMMUNOTIFY_ERR_INVALID_ARGUMENT);
    CHECK(nosize.hits == 12345); /* nothing written */
    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_OK);
    bigcfg.future[1] = 1; /* an option this library does not know: refused, not ignored */
    ummunotify_registrar good2 = {
        .register_fn = dev_register, .deregister_fn = dev_deregister, .ctx = &dev};
    c = NULL;
    CHECK_RC(ummunotify_cache_new(&good2, &bigcfg.c, &c), UMMUNOTIFY_ERR_INVALID_ARGUMENT);
    CHECK(c == NULL);
    cfg.size = 0;
    CHECK_RC(ummunotify_cache_new(&good2, &cfg, &c), UMMUNOTIFY_ERR_INVALID_ARGUMENT);

    /* Handles live in the caller's storage: a put empties it, a second put does nothing, and a
       failed get leaves it empty. */
    c = new_cache_or_skip(NULL);
    char *hm = map_pages(1);
    ummunotify_cache_handle hh;
    CHECK_RC(ummunotify_cache_get(c, (uintptr_t)hm, page, &hh), UMMUNOTIFY_OK);
    CHECK(ummunotify_cache_handle_is_valid(&hh));
    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_ERR_CACHE_BUSY);
    ummunotify_cache_put(&hh);
    CHECK(!ummunotify_cache_handle_is_valid(&hh) && ummunotify_cache_handle_key(&hh) == 0);
    ummunotify_cache_put(&hh);
    CHECK_RC(ummunotify_cache_get(c, 0, 0, &hh), UMMUNOTIFY_ERR_EMPTY_RANGE);
    CHECK(!ummunotify_cache_handle_is_valid(&hh));

    /* Events of the program's own regions on the cache's notifier reach it, one per region
       however often it was hit before the read, and the cache's own events never show. */
    const ummunotify_notifier *cn = ummunotify_cache_notifier(c);
    char *mine = map_pages(2);
    ummunotify_region mr;
    CHECK_RC(ummunotify_notifier_register(cn, (uintptr_t)mine, (uintptr_t)mine + 2 * page, 9, &mr),
             UMMUNOTIFY_OK);
    ummunotify_event evs[8];
    size_t nev = 99;
    CHECK_RC(ummunotify_cache_read_events(c, evs, 8, &nev), UMMUNOTIFY_OK);
    CHECK(nev == 0);
    for (int i = 0; i < 50; i++) {
        CHECK(madvise(mine + (i % 2) * page, page, MADV_DONTNEED) == 0);
        /* a miss and a flush: the cache reads the notifier's queue (and re-arms the region) */
        char *other = map_pages(1);
        CHECK_RC(ummunotify_cache_get(c, (uintptr_t)other, page, &hh), UMMUNOTIFY_OK);
        ummunotify_cache_put(&hh);
        CHECK(munmap(other, page) == 0);
        CHECK_RC(ummunotify_cache_flush(c), UMMUNOTIFY_OK);
    }
    CHECK_RC(ummunotify_cache_read_events(c, evs, 8, &nev), UMMUNOTIFY_OK);
    CHECK(nev == 1 && evs[0].cookie == 9 && evs[0].flags == 0);
    CHECK(evs[0].start == (uintptr_t)mine && evs[0].end == (uintptr_t)mine + 2 * page);
    CHECK_RC(ummunotify_cache_read_events(c, evs, 8, &nev), UMMUNOTIFY_OK);
    CHECK(nev == 0);
    CHECK(madvise(mine, page, MADV_DONTNEED) == 0);
    CHECK_RC(ummunotify_cache_read_events(c, evs, 8, &nev), UMMUNOTIFY_OK);
    CHECK(nev == 1 && evs[0].cookie == 9 && evs[0].flags == UMMUNOTIFY_EVENT_FLAG_HINT);
    CHECK_RC(ummunotify_cache_read_events(c, NULL, 1, &nev), UMMUNOTIFY_ERR_NULL_ARGUMENT);
    CHECK_RC(ummunotify_notifier_unregister(cn, 9), UMMUNOTIFY_OK);
    CHECK_RC(ummunotify_cache_free(c), UMMUNOTIFY_OK);
    munmap(mine, 2 * page);
    munmap(hm, page);
    done("cache");
    return 0;
}

/* verbs_hazard MODE DEVICE [BATCH]: the x == y hazard on the wire, through the C library.
 *
 *   naive       a cache that never invalidates (exact ranges to their ibv_mr)
 *   ummunotify  ummunotify_cache_new() over ummunotify_verbs_registrar_new() (UMN_BACKEND picks
 *               the notifier's backend)
 *   cost        what a registration costs (4 KiB, 64 KiB, 1 MiB) against the bare verbs calls,
 *               and a hit, in TSC ticks (the guest clock has 4 ms resolution); BATCH is the
 *               number of calls per round (default 100); with MAPPINGS, more mappings first,
 *               until the process has that many VMAs (issue 41)
 *
 * For every kind of kinds.h, hazard.h's case: this process serves a buffer through the cache and
 * a peer process (rxe_peer) RDMA-READs and RDMA-WRITEs it over an RC QP, before and after the
 * change. One RXE-HAZARD line per kind (lang=c), judged by verdict.py against the Rust run's
 * claims. Exits 1 on a failure of the harness itself, never for a stale byte.
 */
#define _GNU_SOURCE
#include <x86intrin.h>
#include "hazard.h"
#include "pair.h"
#include "ummunotify.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

static void die(const char *what)
{
	char why[512] = "";
	ummunotify_last_error(why, sizeof why);
	fprintf(stderr, "verbs_hazard: %s (%s; errno %s)\n", what, why, strerror(errno));
	exit(1);
}

/* The cache under test: the library's, or the naive one; and the wire. */
struct served {
	int naive;
	struct ibv_pd *pd;
	struct wire *wire;
	ummunotify_cache *cache;
	ummunotify_cache_handle h;
	struct {
		uintptr_t start;
		size_t len;
		struct ibv_mr *mr;
	} map[8];
	int n;
	char why[512];
};

/* Serves [start, start + len) for one use: 0 and the rkey, or the result and why not. */
static int serve(void *ctx, uintptr_t start, size_t len, uint64_t *key, int *hit,
		 const char **result, const char **note)
{
	struct served *s = ctx;
	if (s->naive) {
		for (int i = 0; i < s->n; i++)
			if (s->map[i].start == start && s->map[i].len == len) {
				*key = s->map[i].mr->rkey;
				*hit = 1;
				return 0;
			}
		struct ibv_mr *mr = ibv_reg_mr(s->pd, (void *)start, len, ACCESS);
		if (!mr) {
			snprintf(s->why, sizeof s->why, "ibv_reg_mr: %s", strerror(errno));
			*result = "device-refused";
			*note = s->why;
			return -1;
		}
		s->map[s->n].start = start;
		s->map[s->n].len = len;
		s->map[s->n++].mr = mr;
		*key = mr->rkey;
		*hit = 0;
		return 0;
	}
	ummunotify_cache_stats before = {.size = sizeof before}, after = {.size = sizeof after};
	ummunotify_cache_get_stats(s->cache, &before);
	ummunotify_result rc = ummunotify_cache_get(s->cache, start, len, &s->h);
	if (rc == UMMUNOTIFY_ERR_UNSUPPORTED_MAPPING || rc == UMMUNOTIFY_ERR_REGISTER) {
		ummunotify_last_error(s->why, sizeof s->why);
		*result = rc == UMMUNOTIFY_ERR_REGISTER ? "device-refused" : "refused";
		*note = s->why;
		return -1;
	} else if (rc) {
		die("ummunotify_cache_get");
	}
	ummunotify_cache_get_stats(s->cache, &after);
	struct ibv_mr *mr = (struct ibv_mr *)(uintptr_t)ummunotify_cache_handle_key(&s->h);
	uintptr_t rs;
	size_t rl;
	ummunotify_cache_handle_range(&s->h, &rs, &rl);
	if (!mr || (uintptr_t)mr->addr != rs || mr->length != rl || rs > start ||
	    start + len > rs + rl)
		die("the handle's key is not the ibv_mr of its range");
	*key = mr->rkey;
	*hit = after.misses == before.misses;
	return 0;
}

static void put(void *ctx)
{
	struct served *s = ctx;
	if (!s->naive)
		ummunotify_cache_put(&s->h);
}

static int read_wire(void *ctx, uintptr_t addr, size_t len, uint64_t key, unsigned char *buf)
{
	return wire_read(((struct served *)ctx)->wire, addr, len, (uint32_t)key, buf);
}

static int write_wire(void *ctx, uintptr_t addr, size_t len, uint64_t key, int byte)
{
	return wire_write(((struct served *)ctx)->wire, addr, len, (uint32_t)key, byte);
}

static void end_case(void *ctx)
{
	struct served *s = ctx;
	if (s->naive) {
		for (int i = 0; i < s->n; i++)
			if (ibv_dereg_mr(s->map[i].mr))
				die("ibv_dereg_mr");
		s->n = 0;
	} else if (ummunotify_cache_flush(s->cache)) {
		die("ummunotify_cache_flush");
	}
}

/* A failing ibv_reg_mr reaches the caller as UMMUNOTIFY_ERR_REGISTER naming the call and errno
 * (remote write without local write is refused by every device: EINVAL). */
static void check_register_error(struct ibv_pd *pd)
{
	ummunotify_registrar reg;
	ummunotify_cache *cache;
	if (ummunotify_verbs_registrar_new(pd, IBV_ACCESS_REMOTE_WRITE, &reg) ||
	    ummunotify_cache_new(&reg, NULL, &cache))
		die("a cache over the verbs registrar");
	static char buf[8192] __attribute__((aligned(4096)));
	ummunotify_cache_handle h;
	ummunotify_result rc = ummunotify_cache_get(cache, (uintptr_t)buf, sizeof buf, &h);
	char why[512] = "";
	ummunotify_last_error(why, sizeof why);
	int ok = rc == UMMUNOTIFY_ERR_REGISTER && strstr(why, "ibv_reg_mr(") &&
		 strstr(why, "Invalid argument") && ummunotify_cache_handle_key(&h) == 0;
	printf("RXE-CHECK c register-error %s rc=%u why=\"%s\"\n", ok ? "ok" : "FAIL", rc, why);
	ummunotify_cache_free(cache);
	ummunotify_verbs_registrar_free(&reg);
}

#define POOL 32

static char *map_populated(void *at, size_t len)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | (at ? MAP_FIXED : 0);
	char *p = mmap(at, len, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

/* How many VMAs this process has (lines of /proc/self/maps). */
static long count_vmas(void)
{
	static char text[1 << 16];
	long lines = 0;
	ssize_t n;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("open /proc/self/maps");
	while ((n = read(fd, text, sizeof text)) > 0)
		for (ssize_t i = 0; i < n; i++)
			lines += text[i] == '\n';
	close(fd);
	return lines;
}

/* Mappings until the process has `want` VMAs: one mapping whose every other page is read-only,
 * so that the kernel keeps a VMA per page (as `umn bench --mappings`). */
static void more_mappings(long want)
{
	long n = want - count_vmas();
	if (n <= 0)
		return;
	char *p = mmap(NULL, (size_t)n * 4096, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap (more mappings)");
	for (long i = 1; i < n; i += 2)
		if (mprotect(p + i * 4096, 4096, PROT_READ))
			die("mprotect (more mappings)");
}

/* One read of all of /proc/self/maps (what a miss on Linux < 6.11 does where PROCMAP_QUERY is
 * missing): a reference point for the misses, in the same round. */
static void read_maps(void)
{
	static char text[1 << 16];
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("open /proc/self/maps");
	while (read(fd, text, sizeof text) > 0)
		;
	close(fd);
}

static ummunotify_cache *verbs_cache(struct ibv_pd *pd, ummunotify_registrar *reg, size_t max)
{
	ummunotify_cache *cache;
	ummunotify_cache_config cfg = {.size = sizeof cfg};
	ummunotify_cache_config_default(&cfg);
	cfg.max_regions = max;
	cfg.merge_adjacent = false;
	if (ummunotify_verbs_registrar_new(pd, ACCESS, reg) || ummunotify_cache_new(reg, &cfg, &cache))
		die("a cache over the verbs registrar");
	return cache;
}

/* What a registration costs, in TSC ticks per operation, all in this process (hazard.h's
 * rounds):
 *   pair  ibv_reg_mr + ibv_dereg_mr against a miss of a full cache, which deregisters the region
 *         it evicts (max_regions 1, two buffers in turn): the steady state of a busy cache;
 *   in    ibv_reg_mr alone against a miss alone (POOL buffers one after the other, their
 *         deregistration untimed): what ummunotify adds on the way in;
 *   hit   a hit (get + put of a cached region), against the pair's verbs calls;
 *   maps  one read of all of /proc/self/maps, which a miss makes on kernels without
 *         PROCMAP_QUERY (Linux < 6.11, this guest's), for reference. */
static void cost(struct ibv_pd *pd, int batch, long mappings)
{
	more_mappings(mappings);
	long vmas = count_vmas();
	static const size_t sizes[] = {4096, 65536, 1 << 20};
	ummunotify_registrar reg1, regp;
	ummunotify_cache *full = verbs_cache(pd, &reg1, 1), *pool = verbs_cache(pd, &regp, 1 << 16);
	const char *backend = ummunotify_notifier_backend(ummunotify_cache_notifier(full));
	for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
		size_t len = sizes[si];
		char *b[POOL];
		struct ibv_mr *mrs[POOL];
		for (int i = 0; i < POOL; i++)
			b[i] = map_populated(NULL, len);
		uint64_t pair_reg[COST_ROUNDS], pair_miss[COST_ROUNDS], hit[COST_ROUNDS],
			in_reg[COST_ROUNDS], in_miss[COST_ROUNDS], maps[COST_ROUNDS];
		ummunotify_cache_handle h;
		for (int r = 0; r < COST_ROUNDS; r++) {
			uint64_t t0 = __rdtsc();
			for (int i = 0; i < batch; i++) {
				struct ibv_mr *mr = ibv_reg_mr(pd, b[i & 1], len, ACCESS);
				if (!mr || ibv_dereg_mr(mr))
					die("ibv_reg_mr/ibv_dereg_mr");
			}
			pair_reg[r] = (__rdtsc() - t0) / (uint64_t)batch;
			t0 = __rdtsc();
			for (int i = 0; i < batch; i++) {
				if (ummunotify_cache_get(full, (uintptr_t)b[i & 1], len, &h))
					die("ummunotify_cache_get (miss)");
				ummunotify_cache_put(&h);
			}
			pair_miss[r] = (__rdtsc() - t0) / (uint64_t)batch;
			char *cached = b[(batch - 1) & 1];
			t0 = __rdtsc();
			for (int i = 0; i < batch * 20; i++) {
				if (ummunotify_cache_get(full, (uintptr_t)cached, len, &h))
					die("ummunotify_cache_get (hit)");
				ummunotify_cache_put(&h);
			}
			hit[r] = (__rdtsc() - t0) / (uint64_t)(batch * 20);
			ummunotify_cache_flush(full);
			t0 = __rdtsc();
			for (int i = 0; i < POOL; i++)
				if (!(mrs[i] = ibv_reg_mr(pd, b[i], len, ACCESS)))
					die("ibv_reg_mr");
			in_reg[r] = (__rdtsc() - t0) / POOL;
			for (int i = 0; i < POOL; i++)
				if (ibv_dereg_mr(mrs[i]))
					die("ibv_dereg_mr");
			t0 = __rdtsc();
			for (int i = 0; i < POOL; i++) {
				if (ummunotify_cache_get(pool, (uintptr_t)b[i], len, &h))
					die("ummunotify_cache_get (pool miss)");
				ummunotify_cache_put(&h);
			}
			in_miss[r] = (__rdtsc() - t0) / POOL;
			/* A few reads: with 10,000 mappings one read is 100M ticks. */
			t0 = __rdtsc();
			for (int i = 0; i < 4; i++)
				read_maps();
			maps[r] = (__rdtsc() - t0) / 4;
			/* New memory under every buffer: the pool's regions go, untimed. */
			for (int i = 0; i < POOL; i++)
				map_populated(b[i], len);
			ummunotify_cache_flush(pool);
		}
		/* Ratios first: cost_median() sorts its array. */
		double miss_ratio = cost_median_ratio(pair_miss, pair_reg),
		       in_ratio = cost_median_ratio(in_miss, in_reg),
		       hit_ratio = cost_median_ratio(hit, pair_reg);
		printf("RXE-COST verbs backend=%s len=%zu rounds=%d batch=%d "
		       "ibv_reg_dereg_ticks=%llu miss_ticks=%llu miss_over_reg=%.3f "
		       "ibv_reg_ticks=%llu miss_in_ticks=%llu miss_in_over_reg=%.3f "
		       "hit_ticks=%llu hit_over_reg=%.5f maps_read_ticks=%llu mappings=%ld vmas=%ld\n",
		       backend, len, COST_ROUNDS, batch, (unsigned long long)cost_median(pair_reg),
		       (unsigned long long)cost_median(pair_miss), miss_ratio,
		       (unsigned long long)cost_median(in_reg), (unsigned long long)cost_median(in_miss),
		       in_ratio, (unsigned long long)cost_median(hit),
		       hit_ratio, (unsigned long long)cost_median(maps), mappings, vmas);
		fflush(stdout);
		for (int i = 0; i < POOL; i++)
			munmap(b[i], len);
		ummunotify_cache_flush(full);
		ummunotify_cache_flush(pool);
	}
	ummunotify_cache_stats st = {.size = sizeof st};
	ummunotify_cache_get_stats(full, &st);
	printf("RXE-COST verbs-stats backend=%s mappings=%ld misses=%llu hits=%llu evictions=%llu\n",
	       backend, mappings, (unsigned long long)st.misses, (unsigned long long)st.hits,
	       (unsigned long long)st.evictions);
	if (ummunotify_cache_free(full) || ummunotify_cache_free(pool))
		die("ummunotify_cache_free");
	ummunotify_verbs_registrar_free(&reg1);
	ummunotify_verbs_registrar_free(&regp);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: verbs_hazard naive|ummunotify|cost DEVICE [BATCH [MAPPINGS]]\n");
		return 2;
	}
	const char *mode = argv[1], *dev = argv[2];
	struct ibv_context *ctx = pair_open(dev);
	if (!ctx)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd");
	if (!strcmp(mode, "cost")) {
		cost(pd, argc > 3 ? atoi(argv[3]) : 100, argc > 4 ? atol(argv[4]) : 0);
		return 0;
	}
	const char *peer = getenv("UMN_RXE_PEER") ? getenv("UMN_RXE_PEER") : "rxe_peer";
	struct wire w = {0};
	/* The peer first: no fork once the notifier's threads run. */
	if (wire_connect(&w, peer, dev, pd))
		die("connecting to the peer");
	struct served s = {.naive = !strcmp(mode, "naive"), .pd = pd, .wire = &w};
	ummunotify_registrar reg;
	const char *backend = "-";
	if (!s.naive) {
		check_register_error(pd);
		if (ummunotify_verbs_registrar_new(pd, ACCESS, &reg) ||
		    ummunotify_cache_new(&reg, NULL, &s.cache))
			die("a cache over the verbs registrar");
		backend = ummunotify_notifier_backend(ummunotify_cache_notifier(s.cache));
	}
	struct hazard_ops ops = {.ctx = &s, .serve = serve, .put = put, .read = read_wire,
				 .write = write_wire, .end_case = end_case};
	static unsigned char buf[8u << 20];
	for (size_t i = 0; i < NKINDS; i++)
		hazard_case("c", s.naive ? "naive" : "ummunotify", backend, KINDS[i], &ops, buf);
	if (!s.naive) {
		ummunotify_cache_stats st = {.size = sizeof st};
		ummunotify_cache_get_stats(s.cache, &st);
		printf("RXE-STATS lang=c backend=%s misses=%llu hits=%llu invalidations=%llu "
		       "deregistrations=%llu regions=%llu\n",
		       backend, (unsigned long long)st.misses, (unsigned long long)st.hits,
		       (unsigned long long)st.invalidations, (unsigned long long)st.deregistrations,
		       (unsigned long long)st.regions);
		if (ummunotify_cache_free(s.cache))
			die("ummunotify_cache_free");
		ummunotify_verbs_registrar_free(&reg);
	}
	wire_close(&w);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}

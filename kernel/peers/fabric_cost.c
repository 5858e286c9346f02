/* fabric_cost MONITOR DOMAIN ITERS         the costs of one memory monitor in libfabric's MR cache
 * fabric_cost MONITOR DOMAIN ITERS drop    the drop path alone (FI_MR_CACHE_MAX_COUNT=1)
 *
 * MONITOR: ummunotify (imported with ummunotify_fabric_import() before the first fi_getinfo,
 * as Open MPI imports its own; UMN_BACKEND picks the backend), or one of libfabric's own by
 * FI_MR_CACHE_MONITOR: memhooks, userfaultfd, kdreg2 (2.x built with kdreg2.h).
 *
 * One domain of "verbs;ofi_rxm" on DOMAIN (rxe0): fi_mr_reg goes through the verbs domain's MR
 * cache, whose monitor is the one under test. TSC ticks per operation, the median over
 * COST_ROUNDS rounds (kernel/rxe/hazard.h), each baseline measured in the same round:
 *
 *   hit       fi_mr_reg + fi_close of a cached 64 KiB range (the lookup asks the monitor's
 *             valid(), in 1.17 as in 2.x)
 *   miss      fi_mr_reg + fi_close of a 16 KiB buffer never registered: search, ibv_reg_mr,
 *             subscribe, keep; against ibv_reg_mr + ibv_dereg_mr of the same length
 *   munmap    munmap of a populated 4 KiB page whose registration the cache holds, against
 *             munmap of one never registered (the monitor's share of the unmapping call)
 *   madvise   madvise(MADV_DONTNEED) of such a page, registered against not
 *   drop      (drop mode) a miss that also evicts the previous entry (deregistration and, on
 *             2.x, the monitor's unsubscribe), against ibv_reg_mr + ibv_dereg_mr
 *
 * One PEER-COST line per measurement; exits 1 only when the harness itself fails.
 */
#define _GNU_SOURCE
#include <x86intrin.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <ummunotify-fabric.h>
#include "hazard.h"
#include "pair.h"

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct ibv_context *vctx;
static struct ibv_pd *pd;

static void fail(const char *what, int rc)
{
	fprintf(stderr, "fabric_cost: %s: %d (%s)\n", what, rc, fi_strerror(rc < 0 ? -rc : rc));
	exit(1);
}

static void open_domain(const char *name)
{
	struct fi_info *hints = fi_allocinfo();
	hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("verbs;ofi_rxm");
	hints->domain_attr->name = strdup(name);
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	int rc = fi_getinfo(FI_VERSION(1, 13), NULL, NULL, 0, hints, &info);
	if (rc)
		fail("fi_getinfo(verbs;ofi_rxm)", rc);
	fi_freeinfo(hints);
	if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL)) ||
	    (rc = fi_domain(fabric, info, &domain, NULL)))
		fail("fi_fabric/fi_domain", rc);
	vctx = pair_open(name);
	pd = vctx ? ibv_alloc_pd(vctx) : NULL;
	if (!pd)
		fail("ibv_alloc_pd", -FI_ENODEV);
}

static uint64_t reg(void *p, size_t len)
{
	struct fid_mr *mr;
	int rc = fi_mr_reg(domain, p, len, FI_REMOTE_READ, 0, 0, 0, &mr, NULL);
	if (rc)
		fail("fi_mr_reg", rc);
	uint64_t key = fi_mr_key(mr);
	fi_close(&mr->fid); /* back to the cache, which keeps it */
	return key;
}

static char *map(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
		       -1, 0);
	if (p == MAP_FAILED)
		fail("mmap", -errno);
	return p;
}

static void line(const char *monitor, const char *what, size_t len, uint64_t *t, uint64_t *base,
		 const char *base_name)
{
	double ratio = cost_median_ratio(t, base); /* before cost_median sorts them */
	printf("PEER-COST monitor=%s fi=%s what=%s len=%zu ticks=%llu %s_ticks=%llu ratio=%.4f\n",
	       monitor, fi_tostr(&(uint32_t){fi_version()}, FI_TYPE_VERSION), what, len,
	       (unsigned long long)cost_median(t), base_name, (unsigned long long)cost_median(base),
	       ratio);
}

static void hit(const char *monitor, int iters)
{
	size_t len = 64 << 10;
	char *a = map(len);
	uint64_t key = reg(a, len), t[COST_ROUNDS], base[COST_ROUNDS];
	for (int r = 0; r < COST_ROUNDS; r++) {
		uint64_t t0 = __rdtsc();
		for (int i = 0; i < iters; i++)
			if (reg(a, len) != key)
				fail("a hit that missed: the cache is not caching", -FI_EINVAL);
		t[r] = (__rdtsc() - t0) / (uint64_t)iters;
		/* The baseline: the same loop's overhead without libfabric (an empty call pair). */
		t0 = __rdtsc();
		for (int i = 0; i < iters; i++)
			__asm__ volatile("" ::: "memory");
		base[r] = (__rdtsc() - t0) / (uint64_t)iters + 1;
	}
	line(monitor, "hit", len, t, base, "loop");
}

#define MISS_PER_ROUND 16

static void miss(const char *monitor, const char *what, size_t len)
{
	size_t stride = len + 4096, span = stride * MISS_PER_ROUND * COST_ROUNDS + 4096;
	char *base = map(span), *ref = map(len);
	uint64_t t[COST_ROUNDS], b[COST_ROUNDS];
	for (int r = 0; r < COST_ROUNDS; r++) {
		uint64_t t0 = __rdtsc();
		for (int i = 0; i < MISS_PER_ROUND; i++)
			reg(base + ((size_t)r * MISS_PER_ROUND + i) * stride + 4096, len);
		t[r] = (__rdtsc() - t0) / MISS_PER_ROUND;
		uint64_t sum = 0;
		for (int i = 0; i < MISS_PER_ROUND; i++) {
			t0 = __rdtsc();
			struct ibv_mr *mr = ibv_reg_mr(pd, ref, len, IBV_ACCESS_LOCAL_WRITE |
						       IBV_ACCESS_REMOTE_READ);
			if (!mr)
				fail("ibv_reg_mr", -errno);
			ibv_dereg_mr(mr);
			sum += __rdtsc() - t0;
		}
		b[r] = sum / MISS_PER_ROUND;
	}
	line(monitor, what, len, t, b, "reg_dereg");
	/* base stays mapped: its entries stay cached (an unmapping would move the cost of their
	 * deregistration into whatever comes next). */
	munmap(ref, len);
}

#define UNMAP_PER_ROUND 8

/* The unmapping call on a registered page against one on a page never registered. */
static void unmap_cost(const char *monitor, int advise)
{
	uint64_t t[COST_ROUNDS], b[COST_ROUNDS];
	for (int r = 0; r < COST_ROUNDS; r++) {
		uint64_t sum_reg = 0, sum_plain = 0;
		for (int i = 0; i < UNMAP_PER_ROUND; i++) {
			char *p = map(4096), *q = map(4096);
			reg(p, 4096);
			/* The plain call first, then the registered one, then a pause: a monitor's
			 * threads woken by the registered call (ours, libfabric's userfaultfd
			 * thread) run on the guest's two CPUs during the pause, not during the next
			 * timed call. */
			uint64_t t0 = __rdtsc();
			int rc2 = advise ? madvise(q, 4096, MADV_DONTNEED) : munmap(q, 4096);
			sum_plain += __rdtsc() - t0;
			t0 = __rdtsc();
			int rc = advise ? madvise(p, 4096, MADV_DONTNEED) : munmap(p, 4096);
			sum_reg += __rdtsc() - t0;
			if (rc || rc2)
				fail(advise ? "madvise" : "munmap", -errno);
			struct timespec pause = {.tv_nsec = 5000000};
			nanosleep(&pause, NULL);
			if (advise) {
				munmap(p, 4096);
				munmap(q, 4096);
			}
			/* Let the cache act on what its monitor reported (a search flushes the dead
			 * list) outside the timing. */
			char *s = map(4096);
			reg(s, 4096);
			munmap(s, 4096);
		}
		t[r] = sum_reg / UNMAP_PER_ROUND;
		b[r] = sum_plain / UNMAP_PER_ROUND;
	}
	line(monitor, advise ? "madvise-registered" : "munmap-registered", 4096, t, b,
	     advise ? "madvise_plain" : "munmap_plain");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 4) {
		fprintf(stderr, "usage: fabric_cost ummunotify|memhooks|userfaultfd|kdreg2 DOMAIN ITERS "
			"[drop]\n");
		return 2;
	}
	const char *monitor = argv[1];
	int iters = atoi(argv[3]), drop = argc > 4 && !strcmp(argv[4], "drop");
	if (!getenv("FI_UNIVERSE_SIZE"))
		setenv("FI_UNIVERSE_SIZE", "16", 1);
	if (drop)
		setenv("FI_MR_CACHE_MAX_COUNT", "1", 1); /* every miss evicts the entry before it */
	if (strcmp(monitor, "ummunotify")) {
		setenv("FI_MR_CACHE_MONITOR", monitor, 1);
	} else {
		unsetenv("FI_MR_CACHE_MONITOR");
		if (ummunotify_fabric_import() != UMMUNOTIFY_FABRIC_OK) {
			printf("PEER-COST-FAIL monitor=%s import: %s\n", monitor,
			       ummunotify_fabric_message());
			return 1;
		}
	}
	open_domain(argv[2]);
	char report[256] = "-";
	if (!strcmp(monitor, "ummunotify"))
		ummunotify_fabric_report(report, sizeof report);
	printf("PEER-COST-START monitor=%s fi=%s drop=%d report=\"%s\"\n", monitor,
	       fi_tostr(&(uint32_t){fi_version()}, FI_TYPE_VERSION), drop, report);
	if (drop) {
		miss(monitor, "drop", 16 << 10);
	} else {
		hit(monitor, iters);
		miss(monitor, "miss", 16 << 10);
		unmap_cost(monitor, 0);
		unmap_cost(monitor, 1);
	}
	if (!strcmp(monitor, "ummunotify")) {
		ummunotify_fabric_report(report, sizeof report);
		printf("PEER-COST-END monitor=%s report=\"%s\"\n", monitor, report);
	}
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	ibv_dealloc_pd(pd);
	ibv_close_device(vctx);
	return 0;
}

/* fabric_hazard MONITOR DOMAIN            the hazard through libfabric's own MR cache
 * fabric_hazard cost MONITOR DOMAIN ITERS  a cache hit: libfabric's against ummunotify's;
 *                                          a miss: libfabric's cache with this MONITOR
 *
 * MONITOR: ummunotify (imported with ummunotify_fabric_import(); UMN_BACKEND picks its
 * backend), or one of libfabric's own, set as FI_MR_CACHE_MONITOR: memhooks, userfaultfd
 * (libfabric 1.17's names; it ignores others, such as "uffd", and keeps its default).
 *
 * Provider "verbs;ofi_rxm" on DOMAIN (rxe0), one fabric, one domain (whose MR cache is the one
 * under test), two RDM endpoints: A owns the memory, B reads it with fi_read and writes it with
 * fi_write over rxm's verbs RC connection. For every kind of kinds.h, hazard.h's case, with
 * fi_mr_reg as the cache's get and fi_close as its put (on the second fi_mr_reg libfabric asks
 * its monitor whether the cached entry is still valid). One RXE-HAZARD line per kind
 * (lang=fabric, cache=<monitor>), judged by verdict.py. Exits 1 on a failure of the harness
 * itself, never for a stale byte.
 */
#define _GNU_SOURCE
#include <x86intrin.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <ummunotify-fabric.h>
#include "hazard.h"
#include "pair.h"
#include "ummunotify.h"

#define SCRATCH (8u << 20)

struct fab {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq[2];
	struct fid_ep *ep[2];
	fi_addr_t addr[2];
	char *scratch;
	struct fid_mr *scratch_mr;
	void *scratch_desc;
};

static void fail(const char *what, int rc)
{
	fprintf(stderr, "fabric_hazard: %s: %d (%s)\n", what, rc, fi_strerror(rc < 0 ? -rc : rc));
	exit(1);
}

/* Progresses both endpoints until B's operation completes. */
static int wait_b(struct fab *f, const char *what)
{
	struct fi_cq_entry e;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		ssize_t n = fi_cq_read(f->cq[1], &e, 1);
		if (n == 1)
			return 0;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			fi_cq_readerr(f->cq[1], &err, 0);
			fprintf(stderr, "fabric_hazard: %s: completion error %d (%s), prov_errno %d\n",
				what, err.err, fi_strerror(err.err), err.prov_errno);
			return -1;
		}
		if (n != -FI_EAGAIN)
			fail(what, (int)n);
		fi_cq_read(f->cq[0], &e, 0); /* progress A (rxm's connection setup) */
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 60) {
			fprintf(stderr, "fabric_hazard: %s: no completion in 60 s\n", what);
			return -1;
		}
	}
}

static int rma(struct fab *f, int write, uintptr_t addr, size_t len, uint64_t key)
{
	struct fi_context ctx;
	ssize_t rc;
	do {
		rc = write ? fi_write(f->ep[1], f->scratch, len, f->scratch_desc, f->addr[0], addr, key,
				      &ctx)
			   : fi_read(f->ep[1], f->scratch, len, f->scratch_desc, f->addr[0], addr, key,
				     &ctx);
		if (rc == -FI_EAGAIN) {
			struct fi_cq_entry e;
			fi_cq_read(f->cq[0], &e, 0);
			fi_cq_read(f->cq[1], &e, 0);
		}
	} while (rc == -FI_EAGAIN);
	if (rc)
		fail(write ? "fi_write" : "fi_read", (int)rc);
	return wait_b(f, write ? "fi_write" : "fi_read");
}

static void open_fabric(struct fab *f, const char *domain)
{
	struct fi_info *hints = fi_allocinfo();
	hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("verbs;ofi_rxm");
	hints->domain_attr->name = strdup(domain);
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	int rc = fi_getinfo(FI_VERSION(1, 13), NULL, NULL, 0, hints, &f->info);
	if (rc)
		fail("fi_getinfo(verbs;ofi_rxm)", rc);
	fi_freeinfo(hints);
	if ((rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL)) ||
	    (rc = fi_domain(f->fabric, f->info, &f->domain, NULL)))
		fail("fi_fabric/fi_domain", rc);
	struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
	if ((rc = fi_av_open(f->domain, &av_attr, &f->av, NULL)))
		fail("fi_av_open", rc);
	for (int i = 0; i < 2; i++) {
		struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 64};
		if ((rc = fi_cq_open(f->domain, &cq_attr, &f->cq[i], NULL)) ||
		    (rc = fi_endpoint(f->domain, f->info, &f->ep[i], NULL)) ||
		    (rc = fi_ep_bind(f->ep[i], &f->av->fid, 0)) ||
		    (rc = fi_ep_bind(f->ep[i], &f->cq[i]->fid, FI_TRANSMIT | FI_RECV)) ||
		    (rc = fi_enable(f->ep[i])))
			fail("an endpoint", rc);
		char name[256];
		size_t len = sizeof name;
		if ((rc = fi_getname(&f->ep[i]->fid, name, &len)))
			fail("fi_getname", rc);
		if (fi_av_insert(f->av, name, 1, &f->addr[i], 0, NULL) != 1)
			fail("fi_av_insert", -FI_EINVAL);
	}
	f->scratch = mmap(NULL, SCRATCH, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (f->scratch == MAP_FAILED)
		fail("mmap", -errno);
	memset(f->scratch, 0, SCRATCH);
	if ((rc = fi_mr_reg(f->domain, f->scratch, SCRATCH, FI_READ | FI_WRITE, 0, 0, 0,
			    &f->scratch_mr, NULL)))
		fail("fi_mr_reg(scratch)", rc);
	f->scratch_desc = fi_mr_desc(f->scratch_mr);
}

static void close_fabric(struct fab *f)
{
	fi_close(&f->scratch_mr->fid);
	/* Both endpoints before any CQ: closing one endpoint tears down its rxm connection to the
	 * other, which still reports to its CQ (closing A's CQ first crashed libfabric 1.17). The
	 * initiator B first, then A once it had the chance to see the disconnect. */
	fi_close(&f->ep[1]->fid);
	struct fi_cq_entry e;
	for (int i = 0; i < 1000; i++)
		fi_cq_read(f->cq[0], &e, 0);
	fi_close(&f->ep[0]->fid);
	for (int i = 0; i < 2; i++)
		fi_close(&f->cq[i]->fid);
	fi_close(&f->av->fid);
	fi_close(&f->domain->fid);
	fi_close(&f->fabric->fid);
	fi_freeinfo(f->info);
}

/* Sets libfabric's monitor before its first fi_getinfo: ours imported, or one of its own. */
static const char *choose_monitor(const char *monitor, int verbose)
{
	if (!getenv("FI_UNIVERSE_SIZE"))
		setenv("FI_UNIVERSE_SIZE", "16", 1); /* rxm's CQ must fit rxe's 32,767 entries */
	if (strcmp(monitor, "ummunotify")) {
		setenv("FI_MR_CACHE_MONITOR", monitor, 1);
		return monitor;
	}
	unsetenv("FI_MR_CACHE_MONITOR");
	int rc = ummunotify_fabric_import();
	if (verbose || rc != UMMUNOTIFY_FABRIC_OK)
		printf("RXE-CHECK fabric import %s: %s\n", rc == UMMUNOTIFY_FABRIC_OK ? "ok" : "FAIL",
		       ummunotify_fabric_message());
	if (rc != UMMUNOTIFY_FABRIC_OK)
		exit(1);
	return monitor;
}

/* libfabric's MR cache, as hazard.h drives a cache: fi_mr_reg, fi_read and fi_write from B. */
struct served {
	struct fab *f;
	struct fid_mr *mr;
	uint64_t first_key;
	void *first_desc;
	int served;
	char why[128];
};

static int serve(void *ctx, uintptr_t start, size_t len, uint64_t *key, int *hit,
		 const char **result, const char **note)
{
	struct served *s = ctx;
	int rc = fi_mr_reg(s->f->domain, (void *)start, len, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0,
			   0, &s->mr, NULL);
	if (rc) {
		snprintf(s->why, sizeof s->why, "fi_mr_reg: %s", fi_strerror(-rc));
		*result = "device-refused";
		*note = s->why;
		s->mr = NULL;
		return -1;
	}
	*key = fi_mr_key(s->mr);
	/* The same entry as the first time (a guess: a freed entry's key and memory may be reused;
	 * the verdict judges libfabric's cache by the bytes alone). */
	*hit = s->served && *key == s->first_key && fi_mr_desc(s->mr) == s->first_desc;
	if (!s->served++) {
		s->first_key = *key;
		s->first_desc = fi_mr_desc(s->mr);
	}
	return 0;
}

static void put(void *ctx)
{
	struct served *s = ctx;
	if (s->mr)
		fi_close(&s->mr->fid); /* back to the cache */
	s->mr = NULL;
}

static int read_wire(void *ctx, uintptr_t addr, size_t len, uint64_t key, unsigned char *buf)
{
	struct served *s = ctx;
	if (rma(s->f, 0, addr, len, key))
		return -1;
	memcpy(buf, s->f->scratch, len);
	return 0;
}

static int write_wire(void *ctx, uintptr_t addr, size_t len, uint64_t key, int byte)
{
	struct served *s = ctx;
	memset(s->f->scratch, byte, len);
	return rma(s->f, 1, addr, len, key);
}

static void end_case(void *ctx)
{
	put(ctx);
}

/* What this process asked of libfabric's cache in cost mode, checked against the cache's own
 * counters when the domain closes (fi_hits_made: calls that must hit; fi_misses_made: calls on a
 * range never registered before, which must miss). */
static unsigned long fi_hits_made, fi_misses_made;
static unsigned long umn_subscribes_missed; /* misses the ummunotify monitor did not subscribe */

/* The imported ummunotify monitor's subscribe count ("subscribes=N" of its report), or 0. */
static unsigned long umn_subscribes(void)
{
	char report[256] = "";
	ummunotify_fabric_report(report, sizeof report);
	char *at = strstr(report, " subscribes=");
	return at ? strtoul(at + strlen(" subscribes="), NULL, 10) : 0;
}

/* Misses per round (each round steps through fresh buffers of one mapping, none unmapped until
 * the end: libfabric 1.17 keeps a released entry on its LRU, registered, until the cache holds
 * FI_MR_CACHE_MAX_COUNT (1,024) entries or its size limit (memory / CPUs / 2, about 500 MiB in
 * the guest); 21 x (32 + 2) fresh entries, 181 MiB, stay below both, so no miss also evicts). */
#define MISS_PER_ROUND_16K 32
#define MISS_PER_ROUND_4M 2

/* A cache miss of len bytes: fi_mr_reg + fi_close of a buffer never registered before, so that
 * libfabric's cache searches, registers with verbs, subscribes the range with its monitor and
 * keeps the entry; against ibv_reg_mr alone of the same length in the same round. A page never
 * registered lies between two buffers: no two entries overlap or touch (libfabric purges an
 * overlapping entry), and one mapping holds them all, populated before the timing. Nothing is
 * unmapped while it runs: an unmapping would put the entries on libfabric's dead list,
 * deregistered by whichever search comes next (a measured one), and the monitors report it at
 * different times (memhooks in the call, userfaultfd from its thread). */
static void miss_cost(struct fab *f, const char *monitor, struct ibv_pd *pd, size_t len,
		      int per_round)
{
	size_t stride = len + 4096, span = stride * (size_t)per_round * COST_ROUNDS + 4096;
	char *base = mmap(NULL, span, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	char *ref = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (base == MAP_FAILED || ref == MAP_FAILED)
		fail("mmap", -errno);
	uint64_t fi_t[COST_ROUNDS], reg_t[COST_ROUNDS];
	unsigned long sub0 = umn_subscribes();
	for (int r = 0; r < COST_ROUNDS; r++) {
		uint64_t t0 = __rdtsc();
		for (int i = 0; i < per_round; i++) {
			char *p = base + ((size_t)r * per_round + i) * stride + 4096;
			struct fid_mr *mr;
			int rc = fi_mr_reg(f->domain, p, len, FI_REMOTE_READ, 0, 0, 0, &mr, NULL);
			if (rc)
				fail("fi_mr_reg (miss)", rc);
			fi_close(&mr->fid);
		}
		fi_t[r] = (__rdtsc() - t0) / (uint64_t)per_round;
		fi_misses_made += (unsigned long)per_round;
		uint64_t sum = 0;
		for (int i = 0; i < per_round; i++) {
			t0 = __rdtsc();
			struct ibv_mr *mr = ibv_reg_mr(pd, ref, len, IBV_ACCESS_LOCAL_WRITE |
						       IBV_ACCESS_REMOTE_READ);
			sum += __rdtsc() - t0;
			if (!mr)
				fail("ibv_reg_mr", -errno);
			ibv_dereg_mr(mr);
		}
		reg_t[r] = sum / (uint64_t)per_round;
	}
	unsigned long subscribed = umn_subscribes() - sub0;
	unsigned long misses = (unsigned long)per_round * COST_ROUNDS;
	if (!strcmp(monitor, "ummunotify") && subscribed < misses)
		umn_subscribes_missed += misses - subscribed;
	char subs[32] = "-";
	if (!strcmp(monitor, "ummunotify"))
		snprintf(subs, sizeof subs, "%lu", subscribed);
	double ratio = cost_median_ratio(fi_t, reg_t); /* before cost_median sorts them */
	printf("RXE-COST fabric-miss monitor=%s len=%zu per_round=%d fi_miss_ticks=%llu "
	       "ibv_reg_ticks=%llu miss_over_reg=%.4f umn_subscribes=%s\n",
	       monitor, len, per_round, (unsigned long long)cost_median(fi_t),
	       (unsigned long long)cost_median(reg_t), ratio, subs);
	/* base stays mapped (its entries cached) until the process exits: unmapped now, its
	 * entries would be deregistered inside the next measurement's first search. */
	munmap(ref, len);
}

/* One cache hit (get + release of a cached registration of 64 KiB): libfabric's fi_mr_reg +
 * fi_close with this process's monitor, and ummunotify's C cache over the verbs registrar. */
static void cost(struct fab *f, const char *monitor, const char *device, int iters)
{
	size_t len = 64 << 10;
	char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
		       -1, 0);
	char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
		       -1, 0);
	if (a == MAP_FAILED || b == MAP_FAILED)
		fail("mmap", -errno);
	struct ibv_context *ctx = pair_open(device);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	ummunotify_registrar reg;
	ummunotify_cache *cache;
	if (!pd || ummunotify_verbs_registrar_new(pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
						  &reg) ||
	    ummunotify_cache_new(&reg, NULL, &cache))
		fail("ummunotify's cache over the verbs registrar", -FI_EINVAL);
	struct fid_mr *mr;
	int rc;
	if ((rc = fi_mr_reg(f->domain, a, len, FI_REMOTE_READ, 0, 0, 0, &mr, NULL)))
		fail("fi_mr_reg", rc);
	fi_misses_made++;
	uint64_t key = fi_mr_key(mr);
	fi_close(&mr->fid);
	ummunotify_cache_handle h;
	if (ummunotify_cache_get(cache, (uintptr_t)b, len, &h))
		fail("ummunotify_cache_get", -FI_EINVAL);
	ummunotify_cache_put(&h);
	uint64_t fi_t[COST_ROUNDS], umn_t[COST_ROUNDS];
	for (int r = 0; r < COST_ROUNDS; r++) {
		uint64_t t0 = __rdtsc();
		for (int i = 0; i < iters; i++) {
			if (fi_mr_reg(f->domain, a, len, FI_REMOTE_READ, 0, 0, 0, &mr, NULL))
				fail("fi_mr_reg (hit)", -FI_EINVAL);
			if (fi_mr_key(mr) != key)
				fail("fi_mr_reg missed: libfabric's cache is not caching", -FI_EINVAL);
			fi_close(&mr->fid);
		}
		fi_t[r] = (__rdtsc() - t0) / (uint64_t)iters;
		fi_hits_made += (unsigned long)iters;
		t0 = __rdtsc();
		for (int i = 0; i < iters; i++) {
			if (ummunotify_cache_get(cache, (uintptr_t)b, len, &h))
				fail("ummunotify_cache_get (hit)", -FI_EINVAL);
			ummunotify_cache_put(&h);
		}
		umn_t[r] = (__rdtsc() - t0) / (uint64_t)iters;
	}
	double ratio = cost_median_ratio(umn_t, fi_t); /* before cost_median sorts them */
	ummunotify_cache_stats st = {.size = sizeof st};
	ummunotify_cache_get_stats(cache, &st);
	printf("RXE-COST fabric monitor=%s umn_backend=%s len=%zu iters=%d fi_hit_ticks=%llu "
	       "umn_hit_ticks=%llu umn_over_fi=%.4f umn_misses=%llu\n",
	       monitor, ummunotify_notifier_backend(ummunotify_cache_notifier(cache)), len, iters,
	       (unsigned long long)cost_median(fi_t), (unsigned long long)cost_median(umn_t), ratio,
	       (unsigned long long)st.misses);
	miss_cost(f, monitor, pd, 16 << 10, MISS_PER_ROUND_16K);
	miss_cost(f, monitor, pd, 4 << 20, MISS_PER_ROUND_4M);
	ummunotify_cache_free(cache);
	ummunotify_verbs_registrar_free(&reg);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

/* Closes the fabric and checks this process's cost calls against libfabric's own counters
 * (FI_LOG_LEVEL=info, FI_LOG_SUBSYS=mr: the MR cache logs "MR cache stats: searches S,
 * deletes D, hits H notify N" on stderr when its domain closes): every call that had to hit
 * hit and nothing else did (H equals the hits made), so each fresh buffer missed; S - H counts
 * the misses, ours and rxm's own registrations. The log is passed on to stderr. */
static void close_counted(struct fab *f, const char *monitor)
{
	fflush(stderr);
	FILE *log = tmpfile();
	int saved = dup(2);
	if (!log || saved < 0 || dup2(fileno(log), 2) < 0)
		fail("capturing stderr", -errno);
	close_fabric(f);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(log);
	char line[512];
	unsigned long searches = 0, deletes = 0, hits = 0, notify = 0;
	int stats = 0;
	while (fgets(line, sizeof line, log)) {
		fputs(line, stderr);
		char *at = strstr(line, "MR cache stats: ");
		if (at && sscanf(at, "MR cache stats: searches %lu, deletes %lu, hits %lu notify %lu",
				 &searches, &deletes, &hits, &notify) == 4)
			stats++;
	}
	fclose(log);
	int ok = stats == 1 && hits == fi_hits_made && searches - hits >= fi_misses_made &&
		 !umn_subscribes_missed;
	printf("RXE-CHECK fabric miss-count %s monitor=%s stats_lines=%d searches=%lu hits=%lu "
	       "hits_made=%lu misses=%lu misses_made=%lu notify=%lu umn_unsubscribed_misses=%lu\n",
	       ok ? "ok" : "FAIL", monitor, stats, searches, hits, fi_hits_made, searches - hits,
	       fi_misses_made, notify, umn_subscribes_missed);
}

/* Opens the fabric, checks that the domain caches, then runs the cost or one kind. */
static int run(const char *monitor_arg, const char *domain, int bench, int iters, const char *kind,
	       int verbose)
{
	const char *monitor = choose_monitor(monitor_arg, verbose);
	struct fab f = {0};
	open_fabric(&f, domain);
	/* The provider caches (the same key for the same range) or this run proves nothing. */
	char *probe = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct fid_mr *m1, *m2;
	if (probe == MAP_FAILED ||
	    fi_mr_reg(f.domain, probe, 1 << 16, FI_REMOTE_READ, 0, 0, 0, &m1, NULL))
		fail("fi_mr_reg(probe)", -FI_EINVAL);
	uint64_t k1 = fi_mr_key(m1);
	fi_close(&m1->fid);
	if (fi_mr_reg(f.domain, probe, 1 << 16, FI_REMOTE_READ, 0, 0, 0, &m2, NULL))
		fail("fi_mr_reg(probe again)", -FI_EINVAL);
	int caches = fi_mr_key(m2) == k1;
	fi_close(&m2->fid);
	char report[256] = "-";
	if (!strcmp(monitor, "ummunotify"))
		ummunotify_fabric_report(report, sizeof report);
	if (verbose || !caches)
		printf("RXE-CHECK fabric cache monitor=%s provider=%s domain=%s caches=%s "
		       "report=\"%s\"\n", monitor, f.info->fabric_attr->prov_name,
		       f.info->domain_attr->name, caches ? "ok" : "FAIL", report);
	if (!caches)
		return 1;
	const char *backend = "-";
	if (!strcmp(monitor, "ummunotify")) {
		char *b = strstr(report, "backend=");
		static char name[32];
		const char *want = getenv("UMN_BACKEND");
		if (!b || sscanf(b, "backend=%31s", name) != 1 || !strcmp(name, "-") ||
		    (want && strcmp(want, name))) {
			fprintf(stderr, "fabric_hazard: libfabric did not start ummunotify on %s: %s\n",
				want ? want : "its backend", report);
			return 1;
		}
		backend = name;
	}
	if (bench) {
		fi_misses_made += 2; /* the scratch buffer and the probe's first registration */
		fi_hits_made += 1;   /* the probe's second */
		cost(&f, monitor, domain, iters);
		munmap(probe, 1 << 16);
		close_counted(&f, monitor);
		return 0;
	} else {
		struct served sv = {.f = &f};
		struct hazard_ops ops = {.ctx = &sv, .serve = serve, .put = put, .read = read_wire,
					 .write = write_wire, .end_case = end_case};
		static unsigned char buf[SCRATCH];
		hazard_case("fabric", monitor, backend, kind, &ops, buf);
	}
	munmap(probe, 1 << 16);
	close_fabric(&f);
	return 0;
}

/* Seconds a kind may take before it is reported as a hang (each takes well under one). */
#define KIND_TIMEOUT 10

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	int bench = argc > 1 && !strcmp(argv[1], "cost");
	if (argc < 3 + bench) {
		fprintf(stderr, "usage: fabric_hazard [cost] ummunotify|memhooks|userfaultfd DOMAIN "
			"[ITERS]\n");
		return 2;
	}
	const char *monitor = argv[1 + bench], *domain = argv[2 + bench];
	if (bench) {
		/* The MR cache's counters, logged at info when the domain closes (close_counted). */
		setenv("FI_LOG_LEVEL", "info", 0);
		setenv("FI_LOG_SUBSYS", "mr", 0);
		return run(monitor, domain, 1, argc > 4 ? atoi(argv[4]) : 500, NULL, 1);
	}
	/* Each kind in a process of its own, from libfabric's start: a kind that hangs a monitor
	 * (libfabric 1.17's userfaultfd monitor leaves MREMAP_DONTUNMAP's old range registered for
	 * missing-page faults it never resolves) is reported as a hang, and the others still run.
	 * No libfabric state crosses a fork. */
	int failed = 0;
	for (size_t i = 0; i < NKINDS; i++) {
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0)
			fail("fork", -errno);
		if (pid == 0)
			_exit(run(monitor, domain, 0, 0, KINDS[i], i == 0));
		int status = 0;
		struct timespec t0, t, tick = {.tv_nsec = 10000000};
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			pid_t w = waitpid(pid, &status, WNOHANG);
			if (w == pid)
				break;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec >= KIND_TIMEOUT) {
				kill(pid, SIGKILL);
				waitpid(pid, &status, 0);
				const char *b = getenv("UMN_BACKEND");
				printf("RXE-HAZARD lang=fabric cache=%s backend=%s kind=%s replaces=%d "
				       "result=hang hit_after=0 read_stale=0 write_lost=0 len=0 "
				       "note=no_result_in_%d_s:_killed\n",
				       monitor, strcmp(monitor, "ummunotify") || !b ? "-" : b, KINDS[i],
				       kind_replaces(KINDS[i]), KIND_TIMEOUT);
				status = 0;
				break;
			}
			nanosleep(&tick, NULL);
		}
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			fprintf(stderr, "fabric_hazard: %s failed (status %#x)\n", KINDS[i], status);
			failed = 1;
		}
	}
	return failed;
}

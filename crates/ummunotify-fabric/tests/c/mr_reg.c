/* End to end through a provider that caches host memory (verbs, efa, cxi, opx): the x == y
 * story with fi_mr_reg and ummunotify as libfabric's monitor.
 *
 *   register x; deregister (libfabric keeps it cached); register x again -> a cache hit
 *   munmap(x) with that registration still open; mmap at the same address (y == x);
 *   register -> must be a new registration (the old one is still registered, so the device
 *   can not give its key to the new one: a different key is exact)
 *
 * Exits 0 on success, 77 when no caching provider can be opened, 1 on failure.
 * FI_PROVIDER picks the provider (default: the first RDM one fi_getinfo returns).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <ummunotify-fabric.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED: %s (line %d)\n", #c, __LINE__); \
	return 1; } } while (0)

static int reg(struct fid_domain *d, void *buf, size_t len, struct fid_mr **mr)
{
	return fi_mr_reg(d, buf, len, FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ |
			 FI_REMOTE_WRITE, 0, 0, 0, mr, NULL);
}

int main(void)
{
	int rc = ummunotify_fabric_import();
	printf("import: %s\n", ummunotify_fabric_message());
	CHECK(rc == UMMUNOTIFY_FABRIC_OK);
	char report[256];

	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->caps = FI_MSG | FI_RMA;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	rc = fi_getinfo(FI_VERSION(1, 13), NULL, NULL, 0, hints, &info);
	if (rc) {
		printf("no RDM provider: %s\n", fi_strerror(-rc));
		return 77;
	}
	printf("provider %s, domain %s\n", info->fabric_attr->prov_name, info->domain_attr->name);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0);
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0);

	size_t len = 1 << 20;
	char *x = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
		       -1, 0);
	CHECK(x != MAP_FAILED);
	struct fid_mr *mr1, *mr2, *mr3;
	CHECK(reg(domain, x, len, &mr1) == 0);
	uint64_t k1 = fi_mr_key(mr1);
	fi_close(&mr1->fid);
	CHECK(reg(domain, x, len, &mr2) == 0);
	uint64_t k2 = fi_mr_key(mr2);
	if (k1 != k2) {
		printf("provider %s does not cache registrations (keys %#llx, %#llx)\n",
		       info->fabric_attr->prov_name, (unsigned long long)k1, (unsigned long long)k2);
		return 77;
	}
	CHECK(munmap(x, len) == 0);
	char *y = mmap(x, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_POPULATE, -1, 0);
	CHECK(y == x);
	CHECK(reg(domain, y, len, &mr3) == 0);
	uint64_t k3 = fi_mr_key(mr3);
	printf("keys: x %#llx, x again %#llx (cache hit), y == x %#llx\n", (unsigned long long)k1,
	       (unsigned long long)k2, (unsigned long long)k3);
	ummunotify_fabric_report(report, sizeof report);
	printf("monitor: %s\n", report);
	CHECK(strstr(report, "started=1") != NULL); /* libfabric's cache runs on ummunotify */
	CHECK(k3 != k1);
	fi_close(&mr2->fid);
	fi_close(&mr3->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	puts("ok");
	return 0;
}

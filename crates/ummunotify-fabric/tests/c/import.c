/* ummunotify_fabric_import() and the LD_PRELOAD constructor against the real libfabric.
 *
 *   import call      calls ummunotify_fabric_import(): must succeed, twice (the report says
 *                    imported, not started); libfabric then refuses a second monitor
 *                    (-FI_EBUSY) and fi_getinfo still works
 *   import preload   calls nothing: the preload must have imported (a second monitor is refused)
 *   import first     imports another monitor first (as Open MPI's patcher would): the call must
 *                    report UMMUNOTIFY_FABRIC_BUSY with a message naming -FI_EBUSY
 *   import own       imports another monitor: must succeed (the preload was turned off)
 */
#include <stdio.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>
#include <ummunotify-fabric.h>

static int other_start(struct fid_mem_monitor *m) { (void)m; return -FI_ENOSYS; }
static void other_stop(struct fid_mem_monitor *m) { (void)m; }
static int other_subscribe(struct fid_mem_monitor *m, const void *a, size_t l)
{ (void)m; (void)a; (void)l; return -FI_ENOSYS; }
static void other_unsubscribe(struct fid_mem_monitor *m, const void *a, size_t l)
{ (void)m; (void)a; (void)l; }
static bool other_valid(struct fid_mem_monitor *m, const void *a, size_t l)
{ (void)m; (void)a; (void)l; return false; }

static struct fi_ops_mem_monitor other_ops = {
	.size = sizeof(struct fi_ops_mem_monitor),
	.start = other_start, .stop = other_stop, .subscribe = other_subscribe,
	.unsubscribe = other_unsubscribe, .valid = other_valid,
};
static struct fid_mem_monitor other = { .fid.fclass = FI_CLASS_MEM_MONITOR,
					 .export_ops = &other_ops };

/* Imports `other` the documented way: fi_open("mr_cache") + fi_import_fid. */
static int import_other(void)
{
	struct fid *cache;
	int ret = fi_open(FI_VERSION(1, 13), "mr_cache", NULL, 0, 0, &cache, NULL);
	if (ret)
		return ret;
	ret = fi_import_fid(cache, &other.fid, 0);
	fi_close(cache);
	return ret;
}

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED: %s (line %d)\n", #c, __LINE__); \
	return 1; } } while (0)

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "call";
	printf("libfabric %u.%u\n", FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
	if (!strcmp(mode, "call")) {
		char report[256];
		CHECK(ummunotify_fabric_report(report, sizeof report) == strlen("imported=0"));
		CHECK(!strcmp(report, "imported=0"));
		int rc = ummunotify_fabric_import();
		printf("import: %d %s: %s\n", rc, ummunotify_fabric_strerror(rc),
		       ummunotify_fabric_message());
		CHECK(rc == UMMUNOTIFY_FABRIC_OK);
		rc = ummunotify_fabric_import();
		printf("again: %d: %s\n", rc, ummunotify_fabric_message());
		CHECK(rc == UMMUNOTIFY_FABRIC_OK && strstr(ummunotify_fabric_message(), "already"));
		/* Imported, not started: libfabric starts the monitor with its first MR cache. */
		size_t n = ummunotify_fabric_report(report, sizeof report);
		printf("report: %s\n", report);
		CHECK(n == strlen(report) && !strncmp(report, "imported=1 started=0 backend=- ", 31));
		CHECK(ummunotify_fabric_report(NULL, 0) == n);
		CHECK(import_other() == -FI_EBUSY);
		struct fi_info *info = NULL;
		rc = fi_getinfo(FI_VERSION(1, 13), NULL, NULL, 0, NULL, &info);
		printf("fi_getinfo after import: %d (%s)\n", rc, rc ? fi_strerror(-rc) : "ok");
		CHECK(rc == 0 || rc == -FI_ENODATA);
		if (info)
			fi_freeinfo(info);
		CHECK(import_other() == -FI_EBUSY);
	} else if (!strcmp(mode, "preload")) {
		CHECK(import_other() == -FI_EBUSY);
	} else if (!strcmp(mode, "first")) {
		CHECK(import_other() == 0);
		int rc = ummunotify_fabric_import();
		printf("import after another monitor: %d: %s\n", rc, ummunotify_fabric_message());
		CHECK(rc == UMMUNOTIFY_FABRIC_BUSY);
		CHECK(strstr(ummunotify_fabric_message(), "-FI_EBUSY") != NULL);
	} else if (!strcmp(mode, "own")) {
		CHECK(import_other() == 0);
	} else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	puts("ok");
	return 0;
}

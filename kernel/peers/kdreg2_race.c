/* kdreg2_race ITERATIONS: is a kdreg2 region still "unchanged" after munmap of its memory has
 * returned, while another thread of the process is inside the kdreg2 file (as libfabric's kdreg2
 * monitor reads its events from a thread of its own)?
 *
 * kdreg2 (HPE's module, built by kernel/peers/build.sh; its public header kdreg2.h) invalidates a
 * region from its MMU notifier's invalidate_range_end only if mutex_trylock() of its context lock
 * succeeds; otherwise it hands the range to a workqueue (kdreg2_defer_range_invalidation). This
 * program measures whether that window shows: the main thread monitors a fresh populated page,
 * unmaps it and, as soon as munmap returned, asks kdreg2_mapping_changed() (the check libfabric's
 * valid() makes). A "no" there is a stale answer: the memory is gone and the cache would reuse
 * the registration. Two runs: "alone" (nothing else touches the file) and "contended" (a second
 * thread monitors and unmonitors a range of its own and drains the events, in a loop). Prints
 * one PEER-KDREG2-RACE line per run: stale answers, and how many of them had turned to
 * "changed" 100 ms later (the deferred work ran). Exits 1 only if the harness fails.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <kdreg2.h>

static int fd;
static const struct kdreg2_status_data *status;
static atomic_bool stop;

static void die(const char *what)
{
	fprintf(stderr, "kdreg2_race: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void drain(void)
{
	struct kdreg2_event ev;
	while (kdreg2_read_counter(&status->pending_events) > 0)
		if (read(fd, &ev, sizeof ev) < 0)
			break;
}

/* The other thread: in the kdreg2 file (its context lock) as often as it can. */
static void *busy(void *arg)
{
	char *page = arg;
	kdreg2_cookie_t cookie = 1u << 30;
	while (!atomic_load(&stop)) {
		struct kdreg2_ioctl_monitor m = {.addr = page, .length = 4096, .cookie = cookie++};
		if (ioctl(fd, KDREG2_IOCTL_MONITOR, &m))
			die("KDREG2_IOCTL_MONITOR (busy)");
		struct kdreg2_ioctl_unmonitor u = {.cookie = m.cookie,
						   .monitoring_params = m.monitoring_params};
		ioctl(fd, KDREG2_IOCTL_UNMONITOR, &u);
		drain();
	}
	return NULL;
}

static void run(const char *mode, int iterations, int contended)
{
	pthread_t t;
	char *other = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (other == MAP_FAILED)
		die("mmap");
	atomic_store(&stop, false);
	if (contended && pthread_create(&t, NULL, busy, other))
		die("pthread_create");
	int stale = 0, later = 0;
	struct kdreg2_monitoring_params *missed = calloc((size_t)iterations, sizeof *missed);
	if (!missed)
		die("calloc");
	for (int i = 0; i < iterations; i++) {
		char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (p == MAP_FAILED)
			die("mmap");
		struct kdreg2_ioctl_monitor m = {.addr = p, .length = 4096, .cookie = (uint64_t)i + 1};
		if (ioctl(fd, KDREG2_IOCTL_MONITOR, &m))
			die("KDREG2_IOCTL_MONITOR");
		if (munmap(p, 4096))
			die("munmap");
		if (!kdreg2_mapping_changed(status, &m.monitoring_params))
			missed[stale++] = m.monitoring_params;
		if (!contended)
			drain();
	}
	struct timespec pause = {.tv_nsec = 100000000};
	nanosleep(&pause, NULL);
	for (int i = 0; i < stale; i++)
		later += kdreg2_mapping_changed(status, &missed[i]);
	atomic_store(&stop, true);
	if (contended)
		pthread_join(t, NULL);
	drain();
	ioctl(fd, KDREG2_IOCTL_UNMONITOR_ALL);
	drain();
	munmap(other, 4096);
	free(missed);
	printf("PEER-KDREG2-RACE mode=%s iterations=%d stale_after_munmap=%d changed_100ms_later=%d\n",
	       mode, iterations, stale, later);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int iterations = argc > 1 ? atoi(argv[1]) : 2000;
	fd = open(KDREG2_DEVICE_NAME, O_RDWR | O_NONBLOCK);
	if (fd < 0)
		die("open " KDREG2_DEVICE_NAME);
	struct kdreg2_config_data config = {.max_regions = 1u << 16};
	if (ioctl(fd, KDREG2_IOCTL_CONFIG_DATA, &config))
		die("KDREG2_IOCTL_CONFIG_DATA");
	status = config.status_data;
	run("alone", iterations, 0);
	run("contended", iterations, 1);
	return 0;
}

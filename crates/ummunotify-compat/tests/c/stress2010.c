/* The 2010 counter under churn, written against the 2010 header only and run under the preload
   (issue 20). The device's contract: "user space just tests whether the value it reads is == the
   old value". So:
   - three threads do x == y rounds of every kind (libc and raw munmap, free of a registered
     block, realloc that moves, raw and libc madvise(DONTNEED), mmap MAP_FIXED over), each with a
     region registered on one device: the counter loaded before the call must differ from the
     counter right after it returned (else a missed check);
   - a fourth thread churns a second device of the same process, whose messages hit none of the
     first device's regions (on userfaultfd the process's one context hands every device every
     message);
   - a poller loads the first device's counter without pause: it must never go down;
   - SIGPROF at 10 kHz on the process's CPU time, as under a sampling profiler.
   UMN_STRESS2010_SECS sets the seconds (default 3). Raw-syscall kinds are skipped on the hooks
   backend (UMN_BACKEND=hooks), which can not see them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <time.h>

#include "ummunotify2010.h"
#include "xy_churn.h"

#define THREADS 3

static int fd, other_fd;
static volatile __u64 *counter;
static _Atomic int stop;
static _Atomic uint64_t polls, decreases;
static struct xy_tally tally, other_tally;
static int raw_ok = 1;

static void die(const char *what) {
    fprintf(stderr, "stress2010: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void arm(void *ctx, char *p, size_t len, uint64_t cookie) {
    struct ummunotify_register_ioctl r = {
        .start = (uintptr_t)p, .end = (uintptr_t)p + len, .user_cookie = cookie};
    if (ioctl(*(int *)ctx, UMMUNOTIFY_REGISTER_REGION, &r) != 0)
        die("register");
}
static uint64_t snapshot(void *ctx) {
    (void)ctx;
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE);
}
static int changed(void *ctx, uint64_t before) {
    (void)ctx;
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE) != before;
}
static int other_changed(void *ctx, uint64_t before) {
    (void)ctx;
    (void)before;
    return 1; /* the second device is there to send messages, not to be judged */
}
static void disarm(void *ctx, uint64_t cookie) {
    __u64 c = cookie;
    if (ioctl(*(int *)ctx, UMMUNOTIFY_UNREGISTER_REGION, &c) != 0)
        die("unregister");
}

static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    struct xy_ops ops = {&fd, arm, snapshot, changed, disarm};
    for (uint64_t i = 0; !atomic_load(&stop); i++) {
        enum xy_kind k = (enum xy_kind)((i + id) % XY_KINDS);
        if (!raw_ok && xy_raw(k))
            continue;
        xy_round(&ops, &tally, k, id << 40 | i);
    }
    return NULL;
}

static void *other(void *arg) {
    (void)arg;
    struct xy_ops ops = {&other_fd, arm, snapshot, other_changed, disarm};
    for (uint64_t i = 0; !atomic_load(&stop); i++)
        xy_round(&ops, &other_tally, XY_LIBC_MUNMAP, i);
    return NULL;
}

static void *poller(void *arg) {
    (void)arg;
    __u64 last = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
    while (!atomic_load(&stop)) {
        __u64 now = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
        if (now < last)
            atomic_fetch_add(&decreases, 1);
        last = now;
        atomic_fetch_add_explicit(&polls, 1, memory_order_relaxed);
    }
    return NULL;
}

int main(void) {
    const char *secs_env = getenv("UMN_STRESS2010_SECS");
    int secs = secs_env ? atoi(secs_env) : 3;
    const char *backend = getenv("UMN_BACKEND");
    raw_ok = !(backend && strcmp(backend, "hooks") == 0);
    xy_init();
    fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
    if (fd < 0 && (errno == ENODEV || errno == EACCES || errno == ENOENT)) {
        printf("SKIP: /dev/ummunotify: %s\n", strerror(errno));
        return 77;
    }
    if (fd < 0)
        die("open");
    other_fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
    if (other_fd < 0)
        die("open a second device");
    counter = mmap(NULL, sizeof *counter, PROT_READ, MAP_SHARED, fd, 0);
    if (counter == MAP_FAILED)
        die("mmap the counter");

    xy_start_profiler();
    pthread_t t[THREADS + 2];
    for (uintptr_t i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(i + 1)) != 0)
            die("pthread_create");
    if (pthread_create(&t[THREADS], NULL, other, NULL) != 0 ||
        pthread_create(&t[THREADS + 1], NULL, poller, NULL) != 0)
        die("pthread_create");
    struct timespec nap = {secs, 0};
    while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS + 2; i++)
        pthread_join(t[i], NULL);
    xy_stop_profiler();

    uint64_t rounds = 0, missed = 0;
    int bad = 0;
    for (int k = 0; k < XY_KINDS; k++) {
        printf("stress2010 %-15s rounds %8llu missed %llu\n", xy_names[k],
               (unsigned long long)tally.rounds[k], (unsigned long long)tally.missed[k]);
        rounds += tally.rounds[k];
        missed += tally.missed[k];
        int allocator_only = xy_allocator((enum xy_kind)k) && !xy_glibc_malloc();
        if (tally.rounds[k] == 0 && (raw_ok || !xy_raw((enum xy_kind)k)) && !allocator_only) {
            fprintf(stderr, "stress2010: no round of %s\n", xy_names[k]);
            bad = 1;
        }
    }
    printf("stress2010: %llu rounds, %llu missed checks; the counter polled %llu times, %llu "
           "decreases; the second device made %llu rounds\n",
           (unsigned long long)rounds, (unsigned long long)missed, (unsigned long long)polls,
           (unsigned long long)decreases, (unsigned long long)other_tally.rounds[XY_LIBC_MUNMAP]);
    if (missed || decreases || bad) {
        fprintf(stderr, "stress2010: FAILED\n");
        return 1;
    }
    return 0;
}

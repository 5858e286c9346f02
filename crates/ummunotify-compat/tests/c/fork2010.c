/* Fork from a busy multithreaded 2010 program under the preload (guarantee 6, issue 40): a child
   never hangs in fork() or after it. Written against the 2010 header only.

   The device has a region over a hole (so every interposed mmap of any thread announces its
   range to the device, under the notifier's registry lock) and a mapped counter view. Three
   threads map, register (2010 ioctl), unmap, read and unregister without pause; the main thread
   forks (tests/c/../../ummunotify-testkit/c/fork_busy.h: UMN_FORK_COUNT, UMN_FORK_SECS,
   UMN_FORK_DEADLINE_SECS). Each child: the inherited view reads 0xC000000000000000, the
   inherited descriptor answers EIO, mmap/munmap work, and every 16th child (UMN_FORK_OWN_EVERY)
   opens a device of its own, registers a page, unmaps it and reads the INVAL record (perf
   refuses a device in a forked child with ENODEV, accepted there). Exit 77 when there is no device
   (no userfaultfd and no other backend). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fork_busy.h"
#include "ummunotify2010.h"

#define THREADS 3
#define FORKED_COUNTER 0xC000000000000000ull

static int fd;
static volatile __u64 *counter;
static size_t page;
static long own_every;
static int perf; /* UMN_BACKEND=perf */

static void die(const char *what) {
    fprintf(stderr, "fork2010: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int reg(int dev, void *p, size_t len, __u64 cookie) {
    struct ummunotify_register_ioctl r = {
        .start = (uintptr_t)p, .end = (uintptr_t)p + len, .user_cookie = cookie};
    return ioctl(dev, UMMUNOTIFY_REGISTER_REGION, &r);
}

static int unreg(int dev, __u64 cookie) {
    return ioctl(dev, UMMUNOTIFY_UNREGISTER_REGION, &cookie);
}

static void *busy(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    struct ummunotify_event ev[8];
    for (__u64 i = 0; !atomic_load(&fork_busy_stop); i++) {
        char *q = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED)
            die("mmap");
        q[0] = 1;
        __u64 cookie = (__u64)id << 48 | i;
        if (reg(fd, q, 2 * page, cookie) != 0)
            die("register");
        if (munmap(q + page, page) != 0)
            die("munmap");
        while (read(fd, ev, sizeof ev) > 0) {
        }
        if (unreg(fd, cookie) != 0)
            die("unregister");
        if (munmap(q, page) != 0)
            die("munmap");
    }
    return NULL;
}

#define CCHECK(cond)                                                                \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "fork2010 child #%ld: %s (errno %d)\n", i, #cond, errno); \
            return 2;                                                               \
        }                                                                           \
    } while (0)

static int child(long i, void *ctx) {
    (void)ctx;
    CCHECK(*counter == FORKED_COUNTER);
    char buf[64];
    errno = 0;
    CCHECK(read(fd, buf, sizeof buf) == -1 && errno == EIO);
    char *q = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CCHECK(q != MAP_FAILED);
    errno = 0;
    CCHECK(reg(fd, q, page, 7) == -1 && errno == EIO);
    CCHECK(munmap(q, page) == 0);
    if (own_every > 0 && i % own_every == 0) {
        int own = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
        /* perf refuses a notifier in a forked child (its tracepoint canary sees nothing
           there): ENODEV, not a hang. */
        if (own < 0 && errno == ENODEV && perf)
            return 0;
        CCHECK(own >= 0);
        q = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CCHECK(q != MAP_FAILED);
        q[0] = 1;
        CCHECK(reg(own, q, page, 42) == 0);
        CCHECK(munmap(q, page) == 0);
        struct ummunotify_event ev[4];
        ssize_t n = read(own, ev, sizeof ev);
        CCHECK(n >= (ssize_t)sizeof ev[0]);
        CCHECK(ev[0].type == UMMUNOTIFY_EVENT_TYPE_INVAL && ev[0].user_cookie_counter == 42);
        CCHECK(close(own) == 0);
    }
    close(fd);
    return 0;
}

int main(void) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    own_every = fork_busy_env("UMN_FORK_OWN_EVERY", 16);
    perf = getenv("UMN_BACKEND") && strcmp(getenv("UMN_BACKEND"), "perf") == 0;
    fd = open("/dev/ummunotify", O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENODEV || errno == EACCES || errno == ENOENT) {
            printf("SKIP: open(/dev/ummunotify): %s\n", strerror(errno));
            return 77;
        }
        die("open");
    }
    counter = mmap(NULL, page, PROT_READ, MAP_SHARED, fd, 0);
    if (counter == MAP_FAILED)
        die("mmap of the device");
    /* A region over a hole: from now on every interposed mmap announces its range. */
    char *h = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED)
        die("mmap");
    h[0] = 1;
    if (munmap(h + page, 2 * page) != 0)
        die("munmap");
    if (reg(fd, h, 4 * page, 1) != 0)
        die("register over a hole");

    pthread_t t[THREADS];
    for (uintptr_t k = 0; k < THREADS; k++)
        if (pthread_create(&t[k], NULL, busy, (void *)(k + 1)) != 0)
            die("pthread_create");
    fork_busy_run("fork2010", child, NULL);
    for (int k = 0; k < THREADS; k++)
        pthread_join(t[k], NULL);
    if (unreg(fd, 1) != 0)
        die("unregister");
    close(fd);
    return 0;
}

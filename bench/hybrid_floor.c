/*
 * What the hybrid backend's in-thread path can cost at best, on this kernel: the kernel work it
 * can not skip, measured against the plain call in the same run (the machine is noisy; only
 * same-run ratios mean anything).
 *
 * The hybrid hook, for a libc munmap/madvise of a watched page, removes the userfaultfd watch in
 * the calling thread (UFFDIO_UNREGISTER) before calling through, so the kernel sends no message
 * and the thread never waits for the monitor; and it keeps every signal blocked while it holds
 * the notifier's index lock (two rt_sigprocmask calls; a handler that unmapped registered memory
 * would otherwise deadlock on that lock: guarantee 4). This probe times, on 4 KiB pages that are
 * each a VMA of their own, watched as the library watches them (a context with the library's
 * events and WP_ASYNC, UFFDIO_REGISTER_MODE_WP):
 *
 *   munmap                         the plain call
 *   unregister + munmap            the floor of the hybrid munmap (no signal mask)
 *   unregister + munmap + mask     the same with the block/restore pair around it
 *   (the same three for madvise(MADV_DONTNEED))
 *
 * usage: gcc -O2 -o /tmp/hybrid_floor bench/hybrid_floor.c && /tmp/hybrid_floor [rounds]
 * Needs userfaultfd (root, or vm.unprivileged_userfaultfd=1). Medians, ns, and ratios.
 */
#include "probe.h"

/* A touched page with a hole above it: a VMA of its own once the next one is made. */
static char *lone_page(void) {
  char *p = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  munmap(p + PG, PG);
  p[0] = 1;
  return p;
}

static int uffd;

static void watch(char *p) {
  struct uffdio_register r = {.range = {(uint64_t)p, PG}, .mode = UFFDIO_REGISTER_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
    perror("UFFDIO_REGISTER");
    exit(1);
  }
}

static void unwatch(char *p) {
  struct uffdio_range r = {(uint64_t)p, PG};
  if (ioctl(uffd, UFFDIO_UNREGISTER, &r)) {
    perror("UFFDIO_UNREGISTER");
    exit(1);
  }
}

enum { PLAIN, UNWATCH, UNWATCH_MASKED, KINDS };

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 4000;
  uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (uffd < 0) {
    perror("userfaultfd");
    return 2;
  }
  struct uffdio_api api = {.api = UFFD_API, .features = 0};
  if (ioctl(uffd, UFFDIO_API, &api)) {
    perror("UFFDIO_API");
    return 2;
  }
  uint64_t offered = api.features;
  close(uffd);
  uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  uint64_t want = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP |
                  (offered & UFFD_FEATURE_WP_ASYNC);
  struct uffdio_api api2 = {.api = UFFD_API, .features = want};
  if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api2)) {
    perror("UFFDIO_API");
    return 2;
  }
  uint64_t *t[2][KINDS];
  for (int op = 0; op < 2; op++)
    for (int k = 0; k < KINDS; k++) t[op][k] = calloc((size_t)rounds, sizeof(uint64_t));
  sigset_t all, old;
  sigfillset(&all);
  for (int i = 0; i < rounds; i++) {
    for (int op = 0; op < 2; op++) {
      /* The three kinds take turns going first. */
      for (int j = 0; j < KINDS; j++) {
        int k = (i + j) % KINDS;
        char *p = lone_page();
        if (k != PLAIN) watch(p);
        uint64_t t0 = now();
        if (k == UNWATCH_MASKED) pthread_sigmask(SIG_BLOCK, &all, &old);
        if (k != PLAIN) unwatch(p);
        if (op == 0)
          munmap(p, PG);
        else
          madvise(p, PG, MADV_DONTNEED);
        if (k == UNWATCH_MASKED) pthread_sigmask(SIG_SETMASK, &old, NULL);
        t[op][k][i] = now() - t0;
        if (op == 1) munmap(p, PG);
      }
    }
  }
  const char *ops[2] = {"munmap", "madvise(DONTNEED)"};
  for (int op = 0; op < 2; op++) {
    uint64_t m[KINDS];
    for (int k = 0; k < KINDS; k++) {
      qsort(t[op][k], (size_t)rounds, sizeof(uint64_t), cmp);
      m[k] = t[op][k][rounds / 2];
    }
    printf("%-18s plain %6lu ns | unregister+call %6lu ns (%.2fx) | with signal mask %6lu ns (%.2fx)\n",
           ops[op], (unsigned long)m[PLAIN], (unsigned long)m[UNWATCH],
           (double)m[UNWATCH] / (double)m[PLAIN], (unsigned long)m[UNWATCH_MASKED],
           (double)m[UNWATCH_MASKED] / (double)m[PLAIN]);
  }
  return 0;
}

/*
 * What the bench probes (hybrid_floor.c, miss_floor.c, call_floor.c, register_placement.c)
 * share: the headers, a monotonic clock in ns, sorting samples for medians, and a userfaultfd
 * context asking for the library's events.
 */
#ifndef UMN_BENCH_PROBE_H
#define UMN_BENCH_PROBE_H

#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#define PG 4096

static inline uint64_t now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* A non-blocking userfaultfd context with the unmap, remove and remap events the library asks
 * for; exits with status 2 (after perror) if the kernel refuses. */
static inline int probe_uffd(void) {
  int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  struct uffdio_api api = {
      .api = UFFD_API,
      .features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP,
  };
  if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
    perror("userfaultfd");
    exit(2);
  }
  return uffd;
}

#endif

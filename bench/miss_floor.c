/*
 * What a cache miss on never-watched memory must pay the kernel, whatever the library does
 * around it, for comparison with UCX 1.22's whole miss (bench/ucx_compare.sh):
 *
 *   UFFDIO_REGISTER of a fresh 4 KiB page, every other page of one mapping (the userfaultfd
 *     backend's watch: the page's VMA is split off; a miss can not skip it, see
 *     Watcher::watch_persists in crates/ummunotify/src/backend/mod.rs)
 *   msync(addr, 4096, 0)   the mapped check every registration makes (guarantee 5: an unmapped
 *                          range is a typed error, and a racing unmap must not go unseen)
 *   a signal-mask pair     what holding the notifier's index lock costs a user thread
 *                          (guarantee 4: a handler that unmaps must not run while it is held)
 *   PROCMAP_QUERY          the lookup after a watch on userfaultfd: is the range shared memory,
 *                          which then needs a fresh-watch window (docs/architecture/in-flight.md)
 *
 * usage: gcc -O2 -o /tmp/miss_floor bench/miss_floor.c && /tmp/miss_floor [pages, default 2000]
 * Needs userfaultfd (root, or vm.unprivileged_userfaultfd=1). Medians, ns.
 */
#include "probe.h"

/* struct procmap_query (include/uapi/linux/fs.h, Linux 6.11): older headers lack it. */
struct umn_procmap_query {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size,
      vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
#define UMN_PROCMAP_QUERY _IOWR('f', 17, struct umn_procmap_query)
#define UMN_PROCMAP_QUERY_COVERING_OR_NEXT_VMA 0x10

static uint64_t median(uint64_t *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

static double mean(const uint64_t *v, int n) {
  double s = 0;
  for (int i = 0; i < n; i++)
    s += (double)v[i];
  return s / n;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2000;
  int uffd = probe_uffd();
  char *p = mmap(NULL, 2 * (size_t)n * PG, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  uint64_t *reg = calloc((size_t)n, sizeof(uint64_t));
  uint64_t *sync = calloc((size_t)n, sizeof(uint64_t));
  uint64_t *mask = calloc((size_t)n, sizeof(uint64_t));
  uint64_t *query = calloc((size_t)n, sizeof(uint64_t));
  int maps = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (maps < 0) {
    perror("/proc/self/maps");
    return 2;
  }
  sigset_t all, old;
  sigfillset(&all);
  for (int i = 0; i < n; i++) {
    char *page = p + 2 * (size_t)i * PG;
    struct uffdio_register r = {.range = {(uint64_t)page, PG}, .mode = UFFDIO_REGISTER_MODE_WP};
    uint64_t t = now();
    if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
      perror("UFFDIO_REGISTER");
      return 2;
    }
    reg[i] = now() - t;
    t = now();
    msync(page, PG, 0);
    sync[i] = now() - t;
    t = now();
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    mask[i] = now() - t;
    struct umn_procmap_query q = {.size = sizeof q,
                                  .query_flags = UMN_PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
                                  .query_addr = (uint64_t)page};
    t = now();
    int qr = ioctl(maps, UMN_PROCMAP_QUERY, &q);
    query[i] = now() - t;
    if (qr) {
      perror("PROCMAP_QUERY (Linux 6.11+)");
      return 2;
    }
  }
  /* Means first (the sort below reorders the samples): a miss is timed as a mean over as many
     pages, so its floor is summed the same way. */
  double m_reg = mean(reg, n), m_sync = mean(sync, n), m_mask = mean(mask, n),
         m_query = mean(query, n);
  printf("UFFDIO_REGISTER of a fresh page (every other page): %lu ns\n",
         (unsigned long)median(reg, n));
  printf("msync(page, 4096, 0), the mapped check:             %lu ns\n",
         (unsigned long)median(sync, n));
  printf("rt_sigprocmask block + restore:                     %lu ns\n",
         (unsigned long)median(mask, n));
  printf("PROCMAP_QUERY of the page (is it shared memory):    %lu ns\n",
         (unsigned long)median(query, n));
  /* The floor of issue 23: the four calls, and the three a miss still makes (its msync went:
     the check after the watch answers "mapped" too). Means over the same n pages. */
  printf("FLOOR4 mean register+msync+mask+query: %.0f ns\n", m_reg + m_sync + m_mask + m_query);
  printf("FLOOR3 mean register+mask+query: %.0f ns\n", m_reg + m_mask + m_query);
  return 0;
}

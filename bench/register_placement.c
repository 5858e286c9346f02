/*
 * Why `umn bench --miss` puts the floor's pages and the misses' pages in one mapping: the same
 * UFFDIO_REGISTER (a fresh page, every other page) costs a different amount on two mappings of
 * one process, by up to 2x, and which one is dearer changes from process to process (where
 * the kernel placed them among the others). A floor timed on a mapping of its own measures that
 * mapping's place as much as the calls.
 *
 *   separate: two mappings, A mapped first; the same calls on both, page by page in turn.
 *   lanes:    one mapping; lane 0 at pages 6k, lane 1 at pages 6k + 4 (the odd pages stay
 *             unwatched), 50 pages of one lane then 50 of the other, which goes first
 *             alternating, as `umn bench --miss` places the floor and the miss (which also
 *             swaps their lanes every two batches).
 *
 * Each lane has its own userfaultfd context, as the bench's floor and the library do.
 * usage: gcc -O2 -o /tmp/register_placement bench/register_placement.c && for i in 1 2 3 4 5 6;
 *        do /tmp/register_placement; done        (needs userfaultfd; means, ns)
 */
#include "probe.h"

enum { BATCHES = 40, PER = 50, N = BATCHES * PER };

static void *map(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  return p;
}

/* UFFDIO_REGISTER of the page at `p` (write-protect mode, as the library's watch). */
static void watch(int uffd, char *p) {
  struct uffdio_register r = {.range = {(uint64_t)p, PG}, .mode = UFFDIO_REGISTER_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
    perror("UFFDIO_REGISTER");
    exit(2);
  }
}

/* `watch`, timed: ns. */
static uint64_t timed_watch(int uffd, char *p) {
  uint64_t t = now();
  watch(uffd, p);
  return now() - t;
}

int main(void) {
  int u[2] = {probe_uffd(), probe_uffd()};
  char *a = map(2 * (size_t)N * PG), *b = map(2 * (size_t)N * PG);
  uint64_t sep[2] = {0, 0};
  for (int k = 0; k < N; k++) {
    sep[0] += timed_watch(u[0], a + 2 * (size_t)k * PG);
    sep[1] += timed_watch(u[1], b + 2 * (size_t)k * PG);
  }
  char *one = map(6 * (size_t)N * PG);
  uint64_t lane[2] = {0, 0};
  for (int bt = 0; bt < BATCHES; bt++) {
    for (int s = 0; s < 2; s++) {
      int l = bt % 2 == 0 ? s : 1 - s;
      uint64_t t = now();
      for (int i = 0; i < PER; i++)
        watch(u[l], one + (6 * (size_t)(bt * PER + i) + 4 * (size_t)l) * PG);
      lane[l] += now() - t;
    }
  }
  printf("separate: A %.0f ns, B %.0f ns (B/A %.2f)   lanes: 0 %.0f ns, 1 %.0f ns (1/0 %.2f)\n",
         (double)sep[0] / N, (double)sep[1] / N, (double)sep[1] / (double)sep[0],
         (double)lane[0] / N, (double)lane[1] / N, (double)lane[1] / (double)lane[0]);
  return 0;
}

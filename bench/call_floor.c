/*
 * The floor under the C library's cache hit: what two out-of-line calls into a shared library
 * with the signatures of ummunotify_cache_get and ummunotify_cache_put cost on this machine
 * when they do no lookup at all (only the argument checks and the handle stores every
 * implementation of that API makes), measured batch by batch against the real hit
 * (ummunotify_cache_get + _put of 4 KiB inside a cached 1 MiB region, no-op registrar)
 * in the same process. No out-of-line get + put can be cheaper than the floor, so it says
 * which hit-time targets a library called like this can meet here at all; UCX's
 * ucs_rcache_get + _put pays the same two calls.
 *
 * Built twice by bench/call_floor.sh (which bench/ucx_compare.sh and CI run): with
 * -DUMN_FLOOR_LIB -shared -fPIC as the floor's library (libumnfloor.so), and as the driver,
 * linked with it and with libummunotify.so:
 *
 *   bench/call_floor.sh [batches]  (default 100 batches of 1000 pairs each, alternating)
 *
 * Prints two lines in the UCX harness's format (median of the batch means, ns per get + put).
 */
#include <stddef.h>
#include <stdint.h>

/* The handle's shape: four words, the last a magic the put checks (as the library's does). */
typedef struct {
  uint64_t opaque[4];
} floor_handle;
#define FLOOR_MAGIC 0x756d6e68616e646cULL

#ifdef UMN_FLOOR_LIB
int umn_floor_get(const void *cache, size_t addr, size_t len, floor_handle *out) {
  if (!cache || !out || len == 0 || addr + len < addr)
    return 1;
  out->opaque[0] = addr;
  out->opaque[1] = (uint64_t)(uintptr_t)cache;
  out->opaque[3] = FLOOR_MAGIC;
  return 0;
}

void umn_floor_put(floor_handle *h) {
  if (h && h->opaque[3] == FLOOR_MAGIC)
    h->opaque[0] = 0;
}
#else
#include <string.h>

#include "probe.h"
#include "ummunotify.h"

int umn_floor_get(const void *cache, size_t addr, size_t len, floor_handle *out);
void umn_floor_put(floor_handle *h);

static int reg(void *ctx, size_t start, size_t len, uint64_t *key) {
  (void)ctx, (void)start, (void)len;
  *key = 1;
  return 0;
}
static int dereg(void *ctx, size_t start, size_t len, uint64_t key) {
  (void)ctx, (void)start, (void)len, (void)key;
  return 0;
}

#define PER 1000

int main(int argc, char **argv) {
  int batches = argc > 1 ? atoi(argv[1]) : 100;
  if (batches < 1)
    batches = 1;
  ummunotify_registrar r = {reg, dereg, NULL, 0, 0};
  ummunotify_cache *c;
  ummunotify_result rc = ummunotify_cache_new(&r, NULL, &c);
  if (rc != UMMUNOTIFY_OK) {
    fprintf(stderr, "call_floor: ummunotify_cache_new failed: %d\n", (int)rc);
    return 1;
  }
  size_t len = 1 << 20;
  char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    perror("call_floor: mmap");
    return 1;
  }
  memset(buf, 1, len);
  ummunotify_cache_handle h;
  if (ummunotify_cache_get(c, (size_t)buf, len, &h) != UMMUNOTIFY_OK) {
    fprintf(stderr, "call_floor: the first get failed\n");
    return 1;
  }
  ummunotify_cache_put(&h);
  /* Each batch's total ns; the median total over PER is the median of the batch means. */
  uint64_t *hit = calloc((size_t)batches, sizeof *hit), *flr = calloc((size_t)batches, sizeof *flr);
  if (!hit || !flr)
    return 1;
  size_t at = (size_t)buf + 8192;
  for (int b = 0; b < batches; b++) {
    uint64_t t = now();
    for (int i = 0; i < PER; i++) {
      if (ummunotify_cache_get(c, at, 4096, &h) != UMMUNOTIFY_OK) {
        fprintf(stderr, "call_floor: a hit failed\n");
        return 1;
      }
      __asm__ volatile("" : : "r"(&h) : "memory");
      ummunotify_cache_put(&h);
    }
    hit[b] = now() - t;
    floor_handle f;
    t = now();
    for (int i = 0; i < PER; i++) {
      if (umn_floor_get(c, at, 4096, &f))
        return 1;
      __asm__ volatile("" : : "r"(&f) : "memory");
      umn_floor_put(&f);
    }
    flr[b] = now() - t;
  }
  qsort(hit, (size_t)batches, sizeof *hit, cmp);
  qsort(flr, (size_t)batches, sizeof *flr, cmp);
  printf("C HIT ummunotify_cache_get + _put, 4 KiB inside 1 MiB (batch-%d mean/call) n=%d median=%.1f ns\n",
         PER, batches, (double)hit[batches / 2] / PER);
  printf("FLOOR two empty calls into a .so, same signatures (batch-%d mean/call) n=%d median=%.1f ns\n",
         PER, batches, (double)flr[batches / 2] / PER);
  ummunotify_cache_free(c);
  munmap(buf, len);
  return 0;
}
#endif

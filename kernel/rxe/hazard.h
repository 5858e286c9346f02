/* One hazard case, the same for every C cache under test (verbs_hazard.c: the C library's and a
 * naive one; fabric_hazard.c: libfabric's): set the kind's memory up, serve it through the cache
 * and read it over the wire (it must be KIND_OLD), release it (it stays cached), make the change,
 * put new memory at the same address (x == y), serve it again, read it and write it over the
 * wire, and print one line:
 *
 *   RXE-HAZARD lang=<lang> cache=<cache> backend=<backend> kind=<kind> replaces=0|1
 *              result=ran|refused|device-refused|lacks hit_after=0|1
 *              read_stale=<bytes read that were not the new memory's>
 *              write_lost=<bytes written that did not land in the new memory>
 *              write_late=<bytes that landed, but only after the write's completion> len=<bytes>
 *              [read_pages=<per page: the byte read> memory_pages=<the memory at the write's
 *              completion>, when any of the three is not 0]
 *
 * A failure of the harness itself (the wire, a setup) exits 1: never a stale byte, which is the
 * verdict's call (verdict.py).
 */
#ifndef UMN_RXE_HAZARD_H
#define UMN_RXE_HAZARD_H
#include "kinds.h"

#define WIRE_BYTE 'W'

struct hazard_ops {
	void *ctx;
	/* Serves [start, start + len) for one use: 0 with the key the wire needs and whether the
	 * cache hit; else a result name ("refused", "device-refused") and a note. */
	int (*serve)(void *ctx, uintptr_t start, size_t len, uint64_t *key, int *hit,
		     const char **result, const char **note);
	/* Ends the use of the last serve (the registration stays cached). */
	void (*put)(void *ctx);
	/* The peer reads [addr, addr + len) through key into buf / writes len bytes of byte. */
	int (*read)(void *ctx, uintptr_t addr, size_t len, uint64_t key, unsigned char *buf);
	int (*write)(void *ctx, uintptr_t addr, size_t len, uint64_t key, int byte);
	/* After the case: release what it left registered. */
	void (*end_case)(void *ctx);
};

static inline size_t hazard_count_not(const unsigned char *b, size_t len, int byte)
{
	size_t n = 0;
	for (size_t i = 0; i < len; i++)
		n += b[i] != byte;
	return n;
}

/* One character per page of buf: its byte if the whole page holds it, else '?' ('0' for zero). */
static inline void hazard_pages(const unsigned char *buf, size_t len, char *out, size_t cap)
{
	size_t pg = kind_page(), n = 0;
	for (size_t off = 0; off < len && n + 1 < cap; off += pg, n++) {
		unsigned char b = buf[off];
		int whole = hazard_count_not(buf + off, pg < len - off ? pg : len - off, b) == 0;
		out[n] = !whole ? '?' : b == 0 ? '0' : (char)b;
	}
	out[n] = 0;
}

static inline void hazard_die(const char *kind, const char *what, const char *why)
{
	fprintf(stderr, "%s: %s%s%s\n", kind, what, why ? ": " : "", why ? why : "");
	exit(1);
}

static inline void hazard_case(const char *lang, const char *cache, const char *backend,
			       const char *kind, const struct hazard_ops *ops, unsigned char *buf)
{
	struct change c;
	const char *result = "ran", *note = "";
	int hit = 0, hit_after = 0;
	size_t read_stale = 0, write_lost = 0, write_late = 0;
	/* Per page: what the peer read, and the memory after its write (only shown when stale). */
	char read_pages[64] = "", mem_pages[64] = "";
	uint64_t key;
	int rc = kind_setup(&c, kind);
	if (rc == KIND_LACKS) {
		result = "lacks";
		note = c.why;
		goto out;
	} else if (rc) {
		hazard_die(kind, "setup", c.why);
	}
	if (ops->serve(ops->ctx, c.start, c.len, &key, &hit, &result, &note))
		goto out;
	if (ops->read(ops->ctx, c.start, c.len, key, buf))
		hazard_die(kind, "the first read over the wire failed", NULL);
	if (hazard_count_not(buf, c.len, KIND_OLD))
		hazard_die(kind, "the peer did not read the registered memory before the change", NULL);
	ops->put(ops->ctx);
	rc = kind_apply(&c);
	if (rc == KIND_LACKS) {
		result = "lacks";
		note = c.why;
		goto out;
	} else if (rc) {
		hazard_die(kind, "change", c.why);
	}
	if (kind_refill(&c))
		hazard_die(kind, "refill", c.why);
	if (ops->serve(ops->ctx, c.start, c.len, &key, &hit, &result, &note))
		hazard_die(kind, "serving the range after the change", note);
	hit_after = hit;
	if (ops->read(ops->ctx, c.start, c.len, key, buf))
		hazard_die(kind, "the read over the wire after the change failed", NULL);
	read_stale = hazard_count_not(buf, c.len, KIND_NEW);
	hazard_pages(buf, c.len, read_pages, sizeof read_pages);
	if (ops->write(ops->ctx, c.start, c.len, key, WIRE_BYTE))
		hazard_die(kind, "the write over the wire after the change failed", NULL);
	/* The write's bytes must be in the new memory once its completion is in; a write through
	 * a stale registration never gets there, so bytes that arrive later than the completion
	 * (written down as late, for the record) are told apart by waiting 200 ms for them. */
	size_t at_completion = hazard_count_not((const unsigned char *)c.start, c.len, WIRE_BYTE);
	hazard_pages((const unsigned char *)c.start, c.len, mem_pages, sizeof mem_pages);
	write_lost = at_completion;
	for (int i = 0; write_lost && i < 20; i++) {
		struct timespec tick = {.tv_nsec = 10000000};
		nanosleep(&tick, NULL);
		write_lost = hazard_count_not((const unsigned char *)c.start, c.len, WIRE_BYTE);
	}
	write_late = at_completion - write_lost;
	ops->put(ops->ctx);
out:;
	size_t len = c.len;
	kind_cleanup(&c);
	ops->end_case(ops->ctx);
	int odd = read_stale || write_lost || write_late;
	char clean[512];
	snprintf(clean, sizeof clean, "%s", note);
	for (char *p = clean; *p; p++)
		if (*p == ' ')
			*p = '_';
	printf("RXE-HAZARD lang=%s cache=%s backend=%s kind=%s replaces=%d result=%s hit_after=%d "
	       "read_stale=%zu write_lost=%zu write_late=%zu len=%zu%s%s%s%s%s%s\n",
	       lang, cache, backend, kind, kind_replaces(kind), result, hit_after, read_stale,
	       write_lost, write_late, len, *clean ? " note=" : "", clean,
	       odd ? " read_pages=" : "", odd ? read_pages : "", odd ? " memory_pages=" : "",
	       odd ? mem_pages : "");
	fflush(stdout);
}

/* The cost measurements (the "cost" modes) run COST_ROUNDS rounds; each measures every figure
 * once, back to back, so that a ratio compares calls made under the same load (the host's other
 * work slows the emulated guest unevenly). Figures are medians over the rounds. */
#define COST_ROUNDS 21

static inline int cost_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The median of v[COST_ROUNDS] (sorts v). */
static inline uint64_t cost_median(uint64_t *v)
{
	qsort(v, COST_ROUNDS, sizeof v[0], cost_cmp);
	return v[COST_ROUNDS / 2];
}

/* The median over the rounds of num[r] / den[r], as a fraction. */
static inline double cost_median_ratio(const uint64_t *num, const uint64_t *den)
{
	uint64_t r[COST_ROUNDS];
	for (int i = 0; i < COST_ROUNDS; i++)
		r[i] = num[i] * 1000000 / (den[i] ? den[i] : 1);
	return (double)cost_median(r) / 1e6;
}

#endif

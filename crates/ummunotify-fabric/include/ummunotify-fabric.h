/*
 * ummunotify as libfabric's memory monitor.
 *
 * Call ummunotify_fabric_import() once, before the first fi_getinfo() (strictly: before the
 * first domain with an MR cache is opened). libfabric's MR caches for host memory then ask
 * ummunotify whether a cached registration is still valid (true until an unmapping call touching
 * it has returned, in any thread) and are told of every change through libfabric's notify.
 *
 * libfabric is found at run time (dlopen of libfabric.so.1, or UMMUNOTIFY_FABRIC_LIBRARY):
 * this library does not link it. For unmodified programs, preload it instead:
 *     LD_PRELOAD=libummunotify-fabric.so ./prog
 * (UMMUNOTIFY_FABRIC=0 turns the preload off, UMMUNOTIFY_FABRIC_VERBOSE=1 reports success too;
 * failures are always reported on stderr).
 *
 * Link: cc app.c -lummunotify-fabric
 */
#ifndef UMMUNOTIFY_FABRIC_H
#define UMMUNOTIFY_FABRIC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Results of ummunotify_fabric_import(). */
#define UMMUNOTIFY_FABRIC_OK 0      /* imported now, or already by an earlier call */
#define UMMUNOTIFY_FABRIC_ABSENT 1  /* no libfabric could be loaded */
#define UMMUNOTIFY_FABRIC_TOO_OLD 2 /* libfabric < 1.13: no import monitor */
#define UMMUNOTIFY_FABRIC_BUSY 3    /* -FI_EBUSY: another monitor was imported first (Open MPI's
                                       memory patcher), or an MR cache is already active */
#define UMMUNOTIFY_FABRIC_FAILED 4  /* any other refusal (see ummunotify_fabric_message) */
#define UMMUNOTIFY_FABRIC_OVERRIDDEN 5 /* FI_MR_CACHE_MONITOR is set: libfabric would replace an
                                          imported monitor with it when it initializes */

/* Makes ummunotify libfabric's memory monitor. Idempotent; thread-safe. On failure libfabric
 * is unchanged and keeps its own monitor. */
int ummunotify_fabric_import(void);

/* What the last ummunotify_fabric_import() did, or exactly why it failed (with the libfabric
 * version found). Valid until the next import call; "" before the first. */
const char *ummunotify_fabric_message(void);

/* The imported monitor's state in one line, snprintf-style into buf (returns the full length):
 * "imported=1 started=1 backend=uffd subscriptions=2 subscribes=9 subscribe_failures=0
 * notifies=7 evictions=0" once libfabric started it (its first MR cache), "imported=0" before
 * an import. */
size_t ummunotify_fabric_report(char *buf, size_t len);

/* A fixed description of a UMMUNOTIFY_FABRIC_* code. */
const char *ummunotify_fabric_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* UMMUNOTIFY_FABRIC_H */

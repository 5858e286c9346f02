/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The user ABI of this project's /dev/ummunotify module: the 2010 ABI (ioctls 1-3, 32-byte
 * events with HINT and LAST, the counter mapped at offset 0) plus one extension, per-region
 * validity words (ioctl 4 and the slot area mapped at UMMUNOTIFY_SLOTS_OFFSET).
 * Written here from the ABI's description; usable from the kernel and from user space.
 */
#ifndef UMMUNOTIFY_MODULE_H
#define UMMUNOTIFY_MODULE_H

#include <linux/types.h>
#include <linux/ioctl.h>

enum {
	UMMUNOTIFY_EVENT_TYPE_INVAL	= 0,
	UMMUNOTIFY_EVENT_TYPE_LAST	= 1,
};

enum {
	UMMUNOTIFY_EVENT_FLAG_HINT	= 1 << 0,
};

/* One record of read(): 32 bytes. */
struct ummunotify_event {
	__u32	type;
	__u32	flags;
	__u64	hint_start;
	__u64	hint_end;		/* exclusive */
	__u64	user_cookie_counter;	/* INVAL: the cookie; LAST: the counter */
};

/* [start, end) with end exclusive; flags and reserved must be 0. */
struct ummunotify_register_ioctl {
	__u64	start;
	__u64	end;
	__u64	user_cookie;
	__u32	flags;
	__u32	reserved;
};

/*
 * The extension: registers like UMMUNOTIFY_REGISTER_REGION and answers the region's validity
 * word. The region is valid while slots[slot] == generation, where slots is the __u64 array
 * mapped at UMMUNOTIFY_SLOTS_OFFSET: one load and compare, as kdreg2 offers. Every
 * invalidation of the region (and its unregistration) increments its word before the
 * invalidating call proceeds; generations never reach 1 << 63, and a forked child's view of the
 * area reads all ones, so it never matches.
 */
struct ummunotify_register_slot_ioctl {
	__u64	start;			/* in */
	__u64	end;			/* in, exclusive */
	__u64	user_cookie;		/* in */
	__u32	flags;			/* in, 0 */
	__u32	slot;			/* out: index into the slot area */
	__u64	generation;		/* out: the word's value while the region is valid */
};

#define UMMUNOTIFY_MAGIC		'U'

#define UMMUNOTIFY_EXCHANGE_FEATURES	_IOWR(UMMUNOTIFY_MAGIC, 1, __u32)
#define UMMUNOTIFY_REGISTER_REGION	_IOW(UMMUNOTIFY_MAGIC, 2, \
					     struct ummunotify_register_ioctl)
#define UMMUNOTIFY_UNREGISTER_REGION	_IOW(UMMUNOTIFY_MAGIC, 3, __u64)
#define UMMUNOTIFY_REGISTER_REGION_SLOT	_IOWR(UMMUNOTIFY_MAGIC, 4, \
					      struct ummunotify_register_slot_ioctl)

/* mmap offsets: the counter page at 0 (the 2010 layout), the slot area here. */
#define UMMUNOTIFY_SLOTS_OFFSET		(1ULL << 32)

#endif /* UMMUNOTIFY_MODULE_H */

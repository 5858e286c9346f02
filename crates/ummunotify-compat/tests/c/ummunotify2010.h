/*
 * The 2010 /dev/ummunotify user ABI, spelled out as a program of that time carried it
 * (the patch's include/linux/ummunotify.h). Nothing here comes from this project.
 */
#ifndef _LINUX_UMMUNOTIFY_H
#define _LINUX_UMMUNOTIFY_H

#include <linux/types.h>
#include <linux/ioctl.h>

enum {
	UMMUNOTIFY_EVENT_TYPE_INVAL	= 0,
	UMMUNOTIFY_EVENT_TYPE_LAST	= 1,
};

enum {
	UMMUNOTIFY_EVENT_FLAG_HINT	= 1 << 0,
};

struct ummunotify_event {
	__u32	type;
	__u32	flags;
	__u64	hint_start;
	__u64	hint_end;
	__u64	user_cookie_counter;
};

struct ummunotify_register_ioctl {
	__u64	start;
	__u64	end;
	__u64	user_cookie;
	__u32	flags;
	__u32	reserved;
};

#define UMMUNOTIFY_MAGIC		'U'

#define UMMUNOTIFY_EXCHANGE_FEATURES	_IOWR(UMMUNOTIFY_MAGIC, 1, __u32)
#define UMMUNOTIFY_REGISTER_REGION	_IOW(UMMUNOTIFY_MAGIC, 2, \
					     struct ummunotify_register_ioctl)
#define UMMUNOTIFY_UNREGISTER_REGION	_IOW(UMMUNOTIFY_MAGIC, 3, __u64)

#endif /* _LINUX_UMMUNOTIFY_H */

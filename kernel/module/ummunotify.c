// SPDX-License-Identifier: GPL-2.0-only OR MIT
/*
 * /dev/ummunotify: tells a process when the mappings behind address ranges it registered change,
 * from the kernel's MMU notifiers, in the thread that changes them, before that call returns.
 *
 * Written for this project from the 2010 user ABI (ummunotify.h); see kernel/README.md for what
 * it keeps of that ABI and where it does better:
 *  - regions live in an interval tree (O(log n + hits) per invalidation, not a list walk);
 *  - at most max_regions regions per open file and max_regions_per_user per user (module
 *    parameters; ENOSPC beyond), so memory is bounded per user, not only per descriptor;
 *  - what a user asks of it is charged to that user's memory cgroup: the per-file context, the
 *    counter page, the regions (an accounted cache), the slot ids, the slot area and read()'s
 *    buffer are accounted allocations;
 *  - a per-region validity word in a mapped slot area (one load to check one region);
 *  - a forked child (any other mm) gets EIO from its inherited descriptor, and its view of the
 *    mapped counter has bit 63 set, so it never equals a LAST record;
 *  - no registration stays valid across an invalidation in progress: a region registered
 *    between invalidate_range_start and invalidate_range_end of an overlapping range is
 *    invalidated when that end runs (the window userfaultfd's REMOVE leaves open).
 *
 * Locking: ctx->lock (a spinlock) protects the trees, the queue, the tentative list, the counter
 * and the slot words. The notifier callbacks take only that lock, never sleep, never allocate.
 * ctx->setup (a mutex) serialises the one-time notifier registration, which takes the mmap lock
 * inside it: so ctx->setup is never taken with the mmap lock held (mmap() runs with it). The slot
 * area is allocated with no lock held but the caller's and installed under ctx->lock.
 * umn_users_lock (a spinlock) protects the per-user counts; it is taken alone, never with
 * ctx->lock, and never on the event path.
 *
 * Limits: max_regions (default 131072, read-only: it sizes the slot area) per open file, and
 * max_regions_per_user (default 4 * 131072, writable by root at run time) over every open file
 * of one user: the real uid of the opener's credentials (file->f_cred, kept with the file, so a
 * descriptor passed to another user still counts against the opener). A registration beyond
 * either limit fails with ENOSPC (the error for a full file) and changes nothing; a region's
 * count is given back when it is unregistered or its file is released. Lowering the per-user
 * limit below a user's current count refuses new regions until enough are gone.
 */
#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/hashtable.h>
#include <linux/idr.h>
#include <linux/interval_tree.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/poll.h>
#include <linux/rbtree.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>

#include "ummunotify.h"

static unsigned int max_regions = 1 << 17;
module_param(max_regions, uint, 0444);
MODULE_PARM_DESC(max_regions, "regions per open file (ENOSPC beyond), also the slot count");

static unsigned int max_regions_per_user = 4 << 17;
module_param(max_regions_per_user, uint, 0644);
MODULE_PARM_DESC(max_regions_per_user,
		 "regions per user (real uid of the opener) over all open files (ENOSPC beyond)");

#define UMN_EVENT_SIZE sizeof(struct ummunotify_event)
#define UMN_SLOTS_PGOFF (UMMUNOTIFY_SLOTS_OFFSET >> PAGE_SHIFT)
#define UMN_ORPHAN_COUNTER (1ULL << 63)

struct umn_region {
	struct interval_tree_node it;	/* [start, last] = [start, end - 1] */
	struct rb_node by_cookie;
	struct list_head queued;	/* on ctx->queue while an event is pending */
	struct list_head tentative;	/* on ctx->tentative: registered during an invalidation */
	u64 cookie;
	u64 start, end;			/* end exclusive */
	u64 hint_start, hint_end;
	u32 slot;
	bool pending;
	bool hint;
};

/* One per uid with an open file: its region count against max_regions_per_user. */
struct umn_user {
	struct hlist_node node;
	kuid_t uid;
	unsigned int files;		/* open files of this uid */
	unsigned int regions;		/* their regions */
};

static DEFINE_HASHTABLE(umn_users, 6);
static DEFINE_SPINLOCK(umn_users_lock);

struct umn_ctx {
	spinlock_t lock;
	struct rb_root_cached tree;	/* regions by range */
	struct rb_root cookies;		/* regions by cookie */
	struct list_head queue;		/* regions with a pending event, oldest first */
	struct list_head tentative;	/* regions registered while ->active > 0 */
	unsigned int active;		/* invalidations started and not yet ended */
	bool last_owed;			/* a read drained the queue but had no room for LAST */
	bool used;			/* EXCHANGE_FEATURES is refused once the file was used */
	u64 *counter;			/* one zeroed page, mapped at offset 0 */
	u64 *slots;			/* max_regions words, vmalloc_user, made on first use */

	struct mutex setup;
	bool notifier_registered;
	struct mmu_notifier mn;
	struct mm_struct *mm;		/* the opener's; mmgrab()ed */
	struct umn_user *user;		/* the opener's uid: its regions count there */
	struct ida slot_ida;
	wait_queue_head_t wait;
	struct fasync_struct *fasync;
};

static struct kmem_cache *umn_region_cache;
static struct page *umn_orphan_counter;	/* what another mm sees at offset 0 */
static struct page *umn_orphan_slots;	/* ... and in the slot area: all ones */

/* The opener's entry, made on first open by that uid; NULL without memory. */
static struct umn_user *umn_user_get(kuid_t uid)
{
	struct umn_user *u, *fresh;

	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh)
		return NULL;
	spin_lock(&umn_users_lock);
	hash_for_each_possible(umn_users, u, node, __kuid_val(uid)) {
		if (uid_eq(u->uid, uid)) {
			u->files++;
			spin_unlock(&umn_users_lock);
			kfree(fresh);
			return u;
		}
	}
	fresh->uid = uid;
	fresh->files = 1;
	hash_add(umn_users, &fresh->node, __kuid_val(uid));
	spin_unlock(&umn_users_lock);
	return fresh;
}

/* A file is released with n regions: give them back, and the entry with its last file. */
static void umn_user_put(struct umn_user *u, unsigned int n)
{
	bool last;

	spin_lock(&umn_users_lock);
	u->regions -= n;
	last = !--u->files;
	if (last)
		hash_del(&u->node);
	spin_unlock(&umn_users_lock);
	if (last)
		kfree(u);
}

static int umn_user_charge(struct umn_user *u)
{
	int err = 0;

	spin_lock(&umn_users_lock);
	if (u->regions >= READ_ONCE(max_regions_per_user))
		err = -ENOSPC;
	else
		u->regions++;
	spin_unlock(&umn_users_lock);
	return err;
}

static void umn_user_uncharge(struct umn_user *u)
{
	spin_lock(&umn_users_lock);
	u->regions--;
	spin_unlock(&umn_users_lock);
}

static size_t umn_slots_bytes(void)
{
	return PAGE_ALIGN((size_t)max_regions * sizeof(u64));
}

/* ---- the event path (called with ctx->lock held; no sleeping, no allocation) ---- */

static void umn_invalidate(struct umn_ctx *ctx, struct umn_region *r, u64 start, u64 end)
{
	if (ctx->slots)
		WRITE_ONCE(ctx->slots[r->slot], ctx->slots[r->slot] + 1);
	if (!r->pending) {
		r->pending = true;
		r->hint = true;
		r->hint_start = max(start, r->start);
		r->hint_end = min(end, r->end);
		list_add_tail(&r->queued, &ctx->queue);
	} else {
		/* A second invalidation before the read: the 2010 rule, the whole region. */
		r->hint = false;
		r->hint_start = r->start;
		r->hint_end = r->end;
	}
}

static bool umn_hit_tree(struct umn_ctx *ctx, u64 start, u64 end)
{
	struct interval_tree_node *n;
	bool hit = false;

	if (start >= end)
		return false;
	for (n = interval_tree_iter_first(&ctx->tree, start, end - 1); n;
	     n = interval_tree_iter_next(n, start, end - 1)) {
		umn_invalidate(ctx, container_of(n, struct umn_region, it), start, end);
		hit = true;
	}
	return hit;
}

static void umn_bump_counter(struct umn_ctx *ctx)
{
	/*
	 * Paired with the reader's plain load: the spinlock release orders it before the
	 * invalidating call can return.
	 */
	WRITE_ONCE(*ctx->counter, *ctx->counter + 1);
}

static void umn_wake(struct umn_ctx *ctx)
{
	wake_up_interruptible(&ctx->wait);
	kill_fasync(&ctx->fasync, SIGIO, POLL_IN);
}

static int umn_invalidate_range_start(struct mmu_notifier *mn,
				      const struct mmu_notifier_range *range)
{
	struct umn_ctx *ctx = container_of(mn, struct umn_ctx, mn);
	bool hit;

	spin_lock(&ctx->lock);
	ctx->active++;
	hit = umn_hit_tree(ctx, range->start, range->end);
	if (hit)
		umn_bump_counter(ctx);
	spin_unlock(&ctx->lock);
	if (hit)
		umn_wake(ctx);
	return 0;
}

static void umn_invalidate_range_end(struct mmu_notifier *mn,
				     const struct mmu_notifier_range *range)
{
	struct umn_ctx *ctx = container_of(mn, struct umn_ctx, mn);
	struct umn_region *r, *tmp;
	bool hit = false;

	spin_lock(&ctx->lock);
	/*
	 * Regions registered after some invalidation started: the one ending now may have
	 * started before them, so a registration overlapping it is not valid.
	 */
	list_for_each_entry(r, &ctx->tentative, tentative) {
		if (r->start < range->end && range->start < r->end) {
			umn_invalidate(ctx, r, range->start, range->end);
			hit = true;
		}
	}
	/* An end whose start ran before this notifier was registered has no count. */
	if (ctx->active)
		ctx->active--;
	if (!ctx->active) {
		list_for_each_entry_safe(r, tmp, &ctx->tentative, tentative)
			list_del_init(&r->tentative);
	}
	if (hit)
		umn_bump_counter(ctx);
	spin_unlock(&ctx->lock);
	if (hit)
		umn_wake(ctx);
}

static void umn_release_mm(struct mmu_notifier *mn, struct mm_struct *mm)
{
	struct umn_ctx *ctx = container_of(mn, struct umn_ctx, mn);
	bool hit;

	/* The address space is going away: everything registered is invalid. */
	spin_lock(&ctx->lock);
	hit = umn_hit_tree(ctx, 0, ~0ULL);
	if (hit)
		umn_bump_counter(ctx);
	spin_unlock(&ctx->lock);
	if (hit)
		umn_wake(ctx);
}

static const struct mmu_notifier_ops umn_mn_ops = {
	.invalidate_range_start = umn_invalidate_range_start,
	.invalidate_range_end = umn_invalidate_range_end,
	.release = umn_release_mm,
};

/* ---- the file ---- */

static bool umn_foreign(struct umn_ctx *ctx)
{
	return current->mm != ctx->mm;
}

static int umn_open(struct inode *inode, struct file *file)
{
	struct umn_ctx *ctx;

	if ((file->f_flags & O_ACCMODE) != O_RDONLY)
		return -EINVAL;
	if (!current->mm)
		return -EINVAL;
	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx)
		return -ENOMEM;
	ctx->counter = (u64 *)get_zeroed_page(GFP_KERNEL_ACCOUNT);
	if (!ctx->counter) {
		kfree(ctx);
		return -ENOMEM;
	}
	ctx->user = umn_user_get(file->f_cred->uid);
	if (!ctx->user) {
		free_page((unsigned long)ctx->counter);
		kfree(ctx);
		return -ENOMEM;
	}
	spin_lock_init(&ctx->lock);
	ctx->tree = RB_ROOT_CACHED;
	ctx->cookies = RB_ROOT;
	INIT_LIST_HEAD(&ctx->queue);
	INIT_LIST_HEAD(&ctx->tentative);
	mutex_init(&ctx->setup);
	ida_init(&ctx->slot_ida);
	init_waitqueue_head(&ctx->wait);
	ctx->mn.ops = &umn_mn_ops;
	mmgrab(current->mm);
	ctx->mm = current->mm;
	file->private_data = ctx;
	return stream_open(inode, file);
}

static int umn_release(struct inode *inode, struct file *file)
{
	struct umn_ctx *ctx = file->private_data;
	struct umn_region *r, *next;
	unsigned int n = 0;

	/* Waits for callbacks in flight; after it no callback runs. */
	if (ctx->notifier_registered)
		mmu_notifier_unregister(&ctx->mn, ctx->mm);
	/*
	 * Nothing else sees the tree now: free it in one pass, without rebalancing, and let
	 * others run (up to max_regions objects; freeing them in one go stalled RCU under KASAN).
	 */
	rbtree_postorder_for_each_entry_safe(r, next, &ctx->cookies, by_cookie) {
		kmem_cache_free(umn_region_cache, r);
		n++;
		cond_resched();
	}
	umn_user_put(ctx->user, n);
	ida_destroy(&ctx->slot_ida);
	vfree(ctx->slots);
	free_page((unsigned long)ctx->counter);
	mmdrop(ctx->mm);
	kfree(ctx);
	return 0;
}

static struct umn_region *umn_find_cookie(struct umn_ctx *ctx, u64 cookie)
{
	struct rb_node *n = ctx->cookies.rb_node;

	while (n) {
		struct umn_region *r = rb_entry(n, struct umn_region, by_cookie);

		if (cookie < r->cookie)
			n = n->rb_left;
		else if (cookie > r->cookie)
			n = n->rb_right;
		else
			return r;
	}
	return NULL;
}

/* Links r by cookie; false if the cookie is taken. */
static bool umn_link_cookie(struct umn_ctx *ctx, struct umn_region *r)
{
	struct rb_node **p = &ctx->cookies.rb_node, *parent = NULL;

	while (*p) {
		struct umn_region *o = rb_entry(*p, struct umn_region, by_cookie);

		parent = *p;
		if (r->cookie < o->cookie)
			p = &(*p)->rb_left;
		else if (r->cookie > o->cookie)
			p = &(*p)->rb_right;
		else
			return false;
	}
	rb_link_node(&r->by_cookie, parent, p);
	rb_insert_color(&r->by_cookie, &ctx->cookies);
	return true;
}

/*
 * Registers the MMU notifier on first use (a file with no region costs the mm nothing) and makes
 * the slot area on first use. The notifier registration takes mmap_lock: never ask for it from
 * ->mmap, which runs with mmap_lock held.
 */
/*
 * The slot area, allocated on first use. Called from ioctl and from mmap() (with the mmap lock
 * held), so it takes no lock but ctx->lock: two first users may both allocate, one area is kept.
 */
static int umn_setup_slots(struct umn_ctx *ctx)
{
	u64 *slots;

	if (READ_ONCE(ctx->slots))
		return 0;
	/*
	 * Not vmalloc_user(): it can not charge the caller. The pages are handed out by
	 * umn_fault() (vmalloc_to_page), not remap_vmalloc_range(), so no VM_USERMAP is needed.
	 */
	slots = __vmalloc(umn_slots_bytes(), GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!slots)
		return -ENOMEM;
	spin_lock(&ctx->lock);
	if (!ctx->slots) {
		WRITE_ONCE(ctx->slots, slots);
		slots = NULL;
	}
	spin_unlock(&ctx->lock);
	vfree(slots);
	return 0;
}

static int umn_setup(struct umn_ctx *ctx, bool want_notifier, bool want_slots)
{
	int err = 0;

	if (want_notifier) {
		/* mmu_notifier_register() takes the mmap lock: never called with it held. */
		mutex_lock(&ctx->setup);
		if (!ctx->notifier_registered) {
			err = mmu_notifier_register(&ctx->mn, ctx->mm);
			if (!err)
				ctx->notifier_registered = true;
		}
		mutex_unlock(&ctx->setup);
	}
	if (!err && want_slots)
		err = umn_setup_slots(ctx);
	return err;
}

static void umn_unlink(struct umn_ctx *ctx, struct umn_region *r)
{
	interval_tree_remove(&r->it, &ctx->tree);
	rb_erase(&r->by_cookie, &ctx->cookies);
	if (r->pending)
		list_del(&r->queued);
	list_del(&r->tentative);
	if (ctx->slots)
		WRITE_ONCE(ctx->slots[r->slot], ctx->slots[r->slot] + 1);
}

static long umn_register(struct umn_ctx *ctx, u64 start, u64 end, u64 cookie, u32 flags,
			 u32 reserved, bool want_slot, u32 *slot, u64 *generation)
{
	struct umn_region *r;
	int id, err;

	if (flags || reserved || start >= end)
		return -EINVAL;
	err = umn_setup(ctx, true, want_slot);
	if (err)
		return err;
	err = umn_user_charge(ctx->user);
	if (err)
		return err;
	r = kmem_cache_zalloc(umn_region_cache, GFP_KERNEL);
	if (!r) {
		umn_user_uncharge(ctx->user);
		return -ENOMEM;
	}
	id = ida_alloc_max(&ctx->slot_ida, max_regions - 1, GFP_KERNEL_ACCOUNT);
	if (id < 0) {
		kmem_cache_free(umn_region_cache, r);
		umn_user_uncharge(ctx->user);
		return id == -ENOSPC ? -ENOSPC : id;
	}
	r->slot = id;
	r->cookie = cookie;
	r->start = start;
	r->end = end;
	r->it.start = start;
	r->it.last = end - 1;
	INIT_LIST_HEAD(&r->queued);
	INIT_LIST_HEAD(&r->tentative);

	spin_lock(&ctx->lock);
	if (!umn_link_cookie(ctx, r)) {
		spin_unlock(&ctx->lock);
		ida_free(&ctx->slot_ida, id);
		kmem_cache_free(umn_region_cache, r);
		umn_user_uncharge(ctx->user);
		return -EINVAL;
	}
	interval_tree_insert(&r->it, &ctx->tree);
	if (ctx->active)
		list_add_tail(&r->tentative, &ctx->tentative);
	ctx->used = true;
	*slot = r->slot;
	*generation = ctx->slots ? ctx->slots[r->slot] : 0;
	spin_unlock(&ctx->lock);
	return 0;
}

static long umn_unregister(struct umn_ctx *ctx, u64 cookie)
{
	struct umn_region *r;

	spin_lock(&ctx->lock);
	ctx->used = true;
	r = umn_find_cookie(ctx, cookie);
	if (!r) {
		spin_unlock(&ctx->lock);
		return -EINVAL;
	}
	umn_unlink(ctx, r);
	spin_unlock(&ctx->lock);
	ida_free(&ctx->slot_ida, r->slot);
	kmem_cache_free(umn_region_cache, r);
	umn_user_uncharge(ctx->user);
	return 0;
}

static long umn_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct umn_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;
	u32 slot;
	u64 gen;
	long err;

	if (umn_foreign(ctx))
		return -EIO;
	switch (cmd) {
	case UMMUNOTIFY_EXCHANGE_FEATURES: {
		u32 mask;
		bool used;

		spin_lock(&ctx->lock);
		used = ctx->used;
		ctx->used = true;
		spin_unlock(&ctx->lock);
		if (used)
			return -EINVAL;
		if (get_user(mask, (u32 __user *)uarg))
			return -EFAULT;
		/* No optional features. */
		return put_user(0u, (u32 __user *)uarg) ? -EFAULT : 0;
	}
	case UMMUNOTIFY_REGISTER_REGION: {
		struct ummunotify_register_ioctl req;

		if (copy_from_user(&req, uarg, sizeof(req)))
			return -EFAULT;
		return umn_register(ctx, req.start, req.end, req.user_cookie, req.flags,
				    req.reserved, false, &slot, &gen);
	}
	case UMMUNOTIFY_REGISTER_REGION_SLOT: {
		struct ummunotify_register_slot_ioctl req;

		if (copy_from_user(&req, uarg, sizeof(req)))
			return -EFAULT;
		err = umn_register(ctx, req.start, req.end, req.user_cookie, req.flags, 0, true,
				   &slot, &gen);
		if (err)
			return err;
		req.slot = slot;
		req.generation = gen;
		if (copy_to_user(uarg, &req, sizeof(req))) {
			/* Leave the state as it was. */
			umn_unregister(ctx, req.user_cookie);
			return -EFAULT;
		}
		return 0;
	}
	case UMMUNOTIFY_UNREGISTER_REGION: {
		u64 cookie;

		if (get_user(cookie, (u64 __user *)uarg))
			return -EFAULT;
		return umn_unregister(ctx, cookie);
	}
	default:
		return -ENOTTY;
	}
}

static bool umn_readable(struct umn_ctx *ctx)
{
	bool ready;

	spin_lock(&ctx->lock);
	ready = !list_empty(&ctx->queue) || ctx->last_owed;
	spin_unlock(&ctx->lock);
	return ready;
}

/* After a failed copy to user space: the records are owed again (no HINT: conservative). */
static void umn_requeue(struct umn_ctx *ctx, struct ummunotify_event *ev, size_t k)
{
	size_t i;

	spin_lock(&ctx->lock);
	for (i = 0; i < k; i++) {
		struct umn_region *r;

		if (ev[i].type == UMMUNOTIFY_EVENT_TYPE_LAST) {
			ctx->last_owed = true;
			continue;
		}
		r = umn_find_cookie(ctx, ev[i].user_cookie_counter);
		if (r && !r->pending) {
			r->pending = true;
			r->hint = false;
			r->hint_start = r->start;
			r->hint_end = r->end;
			list_add_tail(&r->queued, &ctx->queue);
		} else if (r) {
			r->hint = false;
			r->hint_start = r->start;
			r->hint_end = r->end;
		}
	}
	spin_unlock(&ctx->lock);
}

static ssize_t umn_read(struct file *file, char __user *buf, size_t count, loff_t *pos)
{
	struct umn_ctx *ctx = file->private_data;
	struct ummunotify_event *ev;
	size_t n, k;
	int err;

	if (umn_foreign(ctx))
		return -EIO;
	if (count < UMN_EVENT_SIZE)
		return -EINVAL;
	n = min_t(size_t, count, PAGE_SIZE) / UMN_EVENT_SIZE;
	ev = kmalloc_array(n, UMN_EVENT_SIZE, GFP_KERNEL_ACCOUNT);
	if (!ev)
		return -ENOMEM;
	for (;;) {
		spin_lock(&ctx->lock);
		ctx->used = true;
		if (!list_empty(&ctx->queue) || ctx->last_owed)
			break;
		spin_unlock(&ctx->lock);
		if (file->f_flags & O_NONBLOCK) {
			err = -EAGAIN;
			goto fail;
		}
		err = wait_event_interruptible(ctx->wait, umn_readable(ctx));
		if (err)
			goto fail;
	}
	/* Holding ctx->lock. */
	for (k = 0; k < n && !list_empty(&ctx->queue); k++) {
		struct umn_region *r = list_first_entry(&ctx->queue, struct umn_region, queued);

		list_del(&r->queued);
		r->pending = false;
		ev[k] = (struct ummunotify_event){
			.type = UMMUNOTIFY_EVENT_TYPE_INVAL,
			.flags = r->hint ? UMMUNOTIFY_EVENT_FLAG_HINT : 0,
			.hint_start = r->hint_start,
			.hint_end = r->hint_end,
			.user_cookie_counter = r->cookie,
		};
	}
	if (list_empty(&ctx->queue)) {
		if (k < n) {
			ev[k++] = (struct ummunotify_event){
				.type = UMMUNOTIFY_EVENT_TYPE_LAST,
				.user_cookie_counter = *ctx->counter,
			};
			ctx->last_owed = false;
		} else {
			ctx->last_owed = true;
		}
	}
	spin_unlock(&ctx->lock);
	if (copy_to_user(buf, ev, k * UMN_EVENT_SIZE)) {
		umn_requeue(ctx, ev, k);
		err = -EFAULT;
		goto fail;
	}
	kfree(ev);
	return k * UMN_EVENT_SIZE;
fail:
	kfree(ev);
	return err;
}

static __poll_t umn_poll(struct file *file, poll_table *wait)
{
	struct umn_ctx *ctx = file->private_data;

	if (umn_foreign(ctx))
		return EPOLLERR;
	poll_wait(file, &ctx->wait, wait);
	return umn_readable(ctx) ? EPOLLIN | EPOLLRDNORM : 0;
}

static int umn_fasync(int fd, struct file *file, int on)
{
	struct umn_ctx *ctx = file->private_data;

	return fasync_helper(fd, file, on, &ctx->fasync);
}

/*
 * Pages are handed out at fault time, so a forked child (whose copy of this VMA has no page
 * tables: fork does not copy them for a shared mapping without anon pages) faults here and gets
 * the orphan pages instead of the parent's live ones.
 */
static vm_fault_t umn_fault(struct vm_fault *vmf)
{
	struct umn_ctx *ctx = vmf->vma->vm_private_data;
	bool owner = vmf->vma->vm_mm == ctx->mm;
	struct page *page;

	if (vmf->pgoff == 0) {
		page = owner ? virt_to_page(ctx->counter) : umn_orphan_counter;
	} else if (vmf->pgoff >= UMN_SLOTS_PGOFF &&
		   vmf->pgoff - UMN_SLOTS_PGOFF < (umn_slots_bytes() >> PAGE_SHIFT)) {
		u64 *slots = READ_ONCE(ctx->slots);

		if (owner && slots)
			page = vmalloc_to_page((char *)slots +
					       ((vmf->pgoff - UMN_SLOTS_PGOFF) << PAGE_SHIFT));
		else
			page = umn_orphan_slots;
	} else {
		return VM_FAULT_SIGBUS;
	}
	get_page(page);
	vmf->page = page;
	return 0;
}

static const struct vm_operations_struct umn_vm_ops = {
	.fault = umn_fault,
};

static int umn_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct umn_ctx *ctx = file->private_data;
	unsigned long size = vma->vm_end - vma->vm_start;

	if (vma->vm_flags & VM_WRITE)
		return -EACCES;
	if (vma->vm_pgoff == 0) {
		if (size > PAGE_SIZE)
			return -EINVAL;
	} else if (vma->vm_pgoff == UMN_SLOTS_PGOFF) {
		if (size > umn_slots_bytes())
			return -EINVAL;
		if (vma->vm_mm == ctx->mm) {
			int err = umn_setup(ctx, false, true);

			if (err)
				return err;
		}
	} else {
		return -EINVAL;
	}
	if (vma->vm_mm == ctx->mm) {
		spin_lock(&ctx->lock);
		ctx->used = true;
		spin_unlock(&ctx->lock);
	}
	vma->vm_flags &= ~VM_MAYWRITE;
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	vma->vm_ops = &umn_vm_ops;
	vma->vm_private_data = ctx;
	return 0;
}

static const struct file_operations umn_fops = {
	.owner = THIS_MODULE,
	.open = umn_open,
	.release = umn_release,
	.read = umn_read,
	.poll = umn_poll,
	.unlocked_ioctl = umn_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = umn_mmap,
	.fasync = umn_fasync,
	.llseek = no_llseek,
};

static struct miscdevice umn_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "ummunotify",
	.fops = &umn_fops,
	.mode = 0444,
};

static int __init umn_init(void)
{
	u64 *p;
	int err;

	if (!max_regions || max_regions > (1U << 30))
		return -EINVAL;
	/* SLAB_ACCOUNT: every region is charged to the memory cgroup of the task registering it. */
	umn_region_cache = KMEM_CACHE(umn_region, SLAB_ACCOUNT);
	if (!umn_region_cache)
		return -ENOMEM;
	umn_orphan_counter = alloc_page(GFP_KERNEL | __GFP_ZERO);
	umn_orphan_slots = alloc_page(GFP_KERNEL);
	if (!umn_orphan_counter || !umn_orphan_slots) {
		err = -ENOMEM;
		goto fail;
	}
	p = page_address(umn_orphan_counter);
	p[0] = UMN_ORPHAN_COUNTER;
	memset(page_address(umn_orphan_slots), 0xff, PAGE_SIZE);
	err = misc_register(&umn_misc);
	if (err)
		goto fail;
	return 0;
fail:
	if (umn_orphan_counter)
		__free_page(umn_orphan_counter);
	if (umn_orphan_slots)
		__free_page(umn_orphan_slots);
	kmem_cache_destroy(umn_region_cache);
	return err;
}

static void __exit umn_exit(void)
{
	misc_deregister(&umn_misc);
	__free_page(umn_orphan_counter);
	__free_page(umn_orphan_slots);
	kmem_cache_destroy(umn_region_cache);
}

module_init(umn_init);
module_exit(umn_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("/dev/ummunotify: MMU-notifier events for registered address ranges");

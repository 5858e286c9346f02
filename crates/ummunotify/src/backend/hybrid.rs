//! The hybrid backend: libc hooks in front of userfaultfd.
//!
//! Every page a hybrid notifier watches is watched twice: by the hooks' filter and by the
//! process's userfaultfd context. A libc call that changes watched pages (munmap, mremap,
//! madvise, mmap(MAP_FIXED), brk, shmdt, glibc's own calls from free/realloc/malloc_trim/thread
//! exit) is caught by the hooks in the calling thread, which invalidate the regions there and
//! *remove the userfaultfd watch* from the call's pages before calling through
//! ([`Context::unwatch_in_hook`]): the kernel sends no message, so the thread does not sleep
//! until the monitor reads one (KERNEL-FACTS, "What an invalidation costs, by design"). What
//! the hooks can not see (raw syscalls, io_uring, `process_madvise`, ld.so's own unmaps) still
//! reaches userfaultfd, whose watch is in place for every page no hooked call touched. `shmdt`,
//! which userfaultfd never reports, is seen by the hooks.
//!
//! # Visibility rule
//! A hooked call: in the calling thread, before calling through (and again after), as on the
//! hooks backend; its regions' coverage counts as lost (the watch was removed), so re-arming
//! watches their pages again. Anything else: the busy protocol of the userfaultfd backend.
//!
//! # Pages another userfaultfd owns, or it can not watch
//! Where the kernel refuses the watch (`EBUSY`: libfabric's or PSM3's own monitor owns the
//! range; `EINVAL`: a mapping this kernel's userfaultfd can not register, a SysV segment on
//! Linux 6.1), the hooks alone watch it and the registration succeeds; such watches are counted
//! (`Stats::hooks_only_watches`). Raw syscalls on them are not seen.
//!
//! # With non-hybrid notifiers
//! While a plain userfaultfd notifier shares the context, the hooks remove no watch (that
//! notifier learns of changes only through messages); hybrid notifiers then see libc calls twice
//! (in the thread, then by message), which coalesces into one pending event.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::uffd::{Context, UffdWatcher};
use super::{hooks, Delivery, Watcher};
use crate::sink::{Count, Invalidation, Sink, Window, WindowEnd};

/// One hybrid notifier's watches.
struct HybridWatcher {
    uffd: UffdWatcher,
    hooks: hooks::Watch,
    hooks_only: AtomicU64,
}

/// A hybrid [`Watcher`] on the process's context (the hooks must be installed).
pub(crate) fn watcher(ctx: Arc<Context>) -> Box<dyn Watcher> {
    Box::new(HybridWatcher {
        uffd: UffdWatcher::new(ctx, false),
        hooks: hooks::Watch::new(),
        hooks_only: AtomicU64::new(0),
    })
}

impl Watcher for HybridWatcher {
    fn watch(&self, start: u64, end: u64) -> crate::Result<()> {
        // The filter first: from here on a hooked call on these pages goes through the hooks.
        self.hooks.watch(start, end);
        match self.uffd.watch(start, end) {
            // Another library's context owns the pages (EBUSY), or this kernel's userfaultfd
            // can not watch the mapping (EINVAL: a SysV segment on Linux 6.1): the hooks alone.
            // (A range that is not mapped fails the caller's check after the watch instead.)
            Err(crate::Error::RangeBusy | crate::Error::UnsupportedMapping(_)) => {
                self.hooks_only.fetch_add(1, Relaxed);
                Ok(())
            }
            // The caller unwatches what it added (both halves) on an error.
            r => r,
        }
    }

    fn unwatch(&self, start: u64, end: u64) {
        self.hooks.unwatch(start, end);
        self.uffd.unwatch(start, end);
    }

    fn maybe_shared(&self, start: u64, end: u64) -> Option<bool> {
        // Once the hooks took a watch alone, another library's context may own pages this
        // watcher's count still holds (watched before an unmap): the probe's ioctls must never
        // touch those, so the core looks in the mapping list instead.
        if self.hooks_only.load(Relaxed) > 0 {
            return None;
        }
        self.uffd.maybe_shared(start, end)
    }

    fn covering(&self, start: u64, end: u64) -> Option<bool> {
        // As `maybe_shared`. (A one-page watch proves nothing here: the hooks take a range the
        // kernel refused, mapped or not.)
        if self.hooks_only.load(Relaxed) > 0 {
            return None;
        }
        self.uffd.covering(start, end)
    }

    fn splits_vmas(&self) -> bool {
        true
    }

    /// A raw `madvise(MADV_REMOVE)` is seen only by the userfaultfd half.
    fn fresh_watch_window(&self) -> bool {
        true
    }

    fn hooks_only(&self) -> u64 {
        self.hooks_only.load(Relaxed)
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        let uffd = self.uffd.deliver(sink.clone())?;
        let hooks = hooks::publish(Arc::new(InFront {
            core: sink,
            ctx: self.uffd.context().clone(),
        }))?;
        Ok(Box::new(Both { hooks, uffd }))
    }
}

/// The sink the hooks see for a hybrid notifier: the core's, plus removing the userfaultfd watch
/// from the call's pages on the first pass.
struct InFront {
    core: Arc<dyn Sink>,
    ctx: Arc<Context>,
}

impl Sink for InFront {
    fn begin(&self, count: Count) {
        self.core.begin(count)
    }
    fn apply(&self, inv: Invalidation) {
        self.core.apply(inv)
    }
    fn end(&self) {
        self.core.end()
    }
    fn invalidate_in_thread(&self, start: u64, end: u64, unmap: bool, again: bool) {
        // First the regions (before the watch goes: a raw change racing with this call is then
        // still reported), then the watch; the second pass after the syscall repeats neither.
        // Coverage counts as lost either way: the watch may be gone (this or another hybrid
        // notifier's first pass removed it), and re-arming watches the pages again.
        self.core.invalidate_in_thread(start, end, true, again);
        // Whatever the call (munmap, MAP_FIXED, mremap, brk: UNMAP/REMAP; madvise: REMOVE), with
        // the watch gone the kernel sends nothing and this thread does not wait.
        let _ = unmap;
        if !again {
            self.ctx.unwatch_in_hook(start, end);
        }
    }
    fn invalidate_all(&self) {
        self.core.invalidate_all()
    }
    fn window_open(&self, start: u64, end: u64, how: WindowEnd) -> Window {
        self.core.window_open(start, end, how)
    }
    fn window_close(&self, window: Window) {
        self.core.window_close(window)
    }
    fn window_close_range(&self, start: u64, end: u64) {
        self.core.window_close_range(start, end)
    }
    fn kill(&self) {
        self.core.kill()
    }
    fn hooks_overwritten(&self) {
        // The hooks only ever remove a userfaultfd watch in a call they see; a call that
        // bypasses them leaves the watch, and userfaultfd reports it.
    }
}

/// Hybrid delivery: the hooks' table entry and the monitor's.
struct Both {
    hooks: Box<dyn Delivery>,
    uffd: Box<dyn Delivery>,
}

impl Delivery for Both {
    fn monitor_tid(&self) -> i32 {
        self.uffd.monitor_tid()
    }
    fn stop(self: Box<Self>, forked: bool) {
        self.hooks.stop(forked);
        self.uffd.stop(forked);
    }
}

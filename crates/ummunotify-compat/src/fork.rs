//! What `fork` does under the preload (guarantee 6: a child never hangs).
//!
//! The library's `pthread_atfork` child handler is registered when the library is loaded (before
//! `main` and before any thread of the program, so no thread can be half-way through
//! registering it when another forks). In the child, with the child's one thread, it
//! - zeroes the descriptor table's reader counts (`table::reset_readers_in_child`): a parent
//!   thread that was mid-lookup left a count that would never drop;
//! - replaces every counter view the program mapped by a private page reading
//!   `FORKED_COUNTER` (`views::poison_in_child`).
//!
//! It only stores to atomics and makes raw syscalls (`syscall(SYS_mmap, ...)`, `SYS_mprotect`,
//! `SYS_readlink`), never a function this library interposes: those may announce a new mapping
//! to every device, which takes a notifier's registry lock, and a parent's thread may have held
//! that lock at fork time (it is never released in the child). The core library's own child
//! handlers (counter pages, userfaultfd context, hooks sink table, perf, eBPF areas) follow the
//! same rule. No lock is taken in a prepare handler: nothing is carried across fork held.

extern "C" fn in_child() {
    crate::table::reset_readers_in_child();
    crate::views::poison_in_child();
}

/// Registers [`in_child`] when the library is loaded.
#[used]
#[link_section = ".init_array"]
static REGISTER_AT_LOAD: extern "C" fn() = {
    extern "C" fn at_load() {
        // SAFETY: registers a handler with no preconditions that lives for the process.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            // ENOMEM at load time: say so rather than leave children unprotected silently.
            let msg = b"libummunotify-compat: pthread_atfork failed: forked children may see the parent's counter views\n";
            // SAFETY: writes a static buffer to stderr.
            unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
        }
    }
    at_load
};

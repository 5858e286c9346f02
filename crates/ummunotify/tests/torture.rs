//! The torture run: worker threads doing a seeded random mix of register/unregister, cache
//! get/put through the io_uring registrar with I/O checked against the file, every kind of
//! mapping change, heap traffic (malloc/realloc/free/malloc_trim), thread creation and exit, and
//! fork with a child that uses the library (and brk), judged by the PFN, device-bytes and
//! notifier oracles (see `torture_kit/engine.rs`).
//!
//! * `UMN_TORTURE_SECS` (default 60): how long; `UMN_TORTURE_SEED`: replay a printed seed;
//!   `UMN_TORTURE_THREADS` (default 3, 2–4 is the intended range).
//! * A failure panics with `UMN_TORTURE_SEED=...`. The seed fixes each thread's choices; the
//!   interleaving of threads is the scheduler's, so a replay repeats the same operations, not
//!   necessarily the same races.
mod common;
mod torture_kit;

use std::time::Duration;

use torture_kit::engine::{install_crash_report, report, run, unprotected_if_asked, Params};
use torture_kit::{env_u64, seed};

#[test]
fn torture() {
    install_crash_report();
    unprotected_if_asked();
    let p = Params {
        seed: seed("UMN_TORTURE_SEED"),
        threads: env_u64("UMN_TORTURE_THREADS", 3).clamp(1, 8) as usize,
        duration: Duration::from_secs(env_u64("UMN_TORTURE_SECS", 60)),
        fork_every: Duration::from_millis(250),
        uring_madvise: true,
        on_notifier: None,
    };
    let t = run(p.clone());
    report("torture", &p, &t);
    if t.ops > 0 {
        assert!(t.io > 0 && t.changes > 0 && t.checks() > 0, "{t:?}");
        // A kind that never ran (IORING_OP_MADVISE falling back to plain madvise, say) is a
        // hole in the run, not a pass.
        let never = t.kinds_never_run(&p);
        assert!(never.is_empty(), "change kinds that never ran: {never:?}");
    }
}

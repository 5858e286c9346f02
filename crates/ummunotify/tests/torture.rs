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

#[test]
fn torture() {
    torture_kit::engine::torture_test("torture", false, 60);
}

//! The torture run with REMOVE churn (issue 9): everything `torture.rs` does, plus shared
//! buffers that a changer thread drops without pause with every REMOVE-producing kind (madvise
//! DONTNEED / FREE / DONTNEED_LOCKED / REMOVE, glibc and raw, `process_madvise`,
//! `IORING_OP_MADVISE`) while the workers register and pin them, get them through the cache and
//! re-arm a region over them by reading its events (see `torture_kit/engine.rs`, `Churn`). A use
//! no change overlapped must carry the bytes that are mapped.
//!
//! * `UMN_TORTURE_SECS` (default 20: `cargo test --workspace` runs it in a debug build next to
//!   the 60 s `torture`), `UMN_TORTURE_SEED`, `UMN_TORTURE_THREADS` as for `torture`.
//! * `UMN_TORTURE_UNPROTECTED=1` turns the REMOVE-in-flight protection off by hand: the run must
//!   then fail with a stale registration (how CI shows this test would have caught the bug).
mod common;
mod torture_kit;

#[test]
fn torture_remove_churn() {
    torture_kit::engine::torture_test("torture_remove", true, 20);
}

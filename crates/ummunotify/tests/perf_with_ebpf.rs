//! The perf and eBPF backends at once, in one process (issue 13). A BPF program attached to a
//! syscall tracepoint decides whether the tracepoint's perf events get the record: a program
//! that returns 0 silences every perf event on that tracepoint, system-wide (seen here: the perf
//! backend's start-up canary found every tracepoint silent while the eBPF programs were
//! attached). Ours return 1, so both backends work side by side; this test fails if they do not.
//!
//! Needs root, bpf(2), perf tracepoints and tracefs: a loud skip otherwise (a failure under
//! `UMN_REQUIRE_ALL=1`, as in CI). Alone in its file: the perf backend traces every thread of
//! its process.
mod common;

use common::{map, unmap, PAGE};
use ummunotify::{Backend, Cookie, Error, Notifier, Unsupported};
use ummunotify_testkit::require::skip_or_fail;

#[test]
fn perf_and_ebpf_notifiers_both_see_a_munmap_while_both_are_attached() {
    const TEST: &str = "perf_and_ebpf_notifiers_both_see_a_munmap_while_both_are_attached";
    // The eBPF programs first: the perf backend's canary then runs with them attached.
    let ebpf = match Notifier::with_backend(Backend::Ebpf) {
        Ok(n) => n,
        Err(Error::Unsupported(Unsupported::Ebpf { reason })) => {
            skip_or_fail(TEST, &reason);
            return;
        }
        Err(e) => panic!("{TEST}: ebpf: {e}"),
    };
    let perf = match Notifier::with_backend(Backend::Perf) {
        Ok(n) => n,
        Err(Error::Unsupported(Unsupported::Perf { missing })) => {
            // With the eBPF programs attached, "the tracepoints record nothing" is the bug this
            // test is about, not a missing feature.
            assert!(
                !missing.contains("record nothing"),
                "{TEST}: the eBPF programs silence perf: {missing}"
            );
            skip_or_fail(TEST, &missing);
            return;
        }
        Err(e) => panic!("{TEST}: perf: {e}"),
    };
    let (a, b) = (map(PAGE), map(PAGE));
    let on_ebpf = ebpf
        .register(a..a + PAGE, Cookie(1))
        .expect("register on ebpf");
    let on_perf = perf
        .register(b..b + PAGE, Cookie(2))
        .expect("register on perf");
    assert!(ebpf.is_valid(on_ebpf) && perf.is_valid(on_perf));
    unmap(a, PAGE);
    assert!(!ebpf.is_valid(on_ebpf), "eBPF missed the munmap");
    assert!(
        perf.is_valid(on_perf),
        "perf invalidated a range nobody changed"
    );
    unmap(b, PAGE);
    assert!(
        !perf.is_valid(on_perf),
        "perf missed the munmap with eBPF attached"
    );
    assert_eq!(perf.stats().all_changed, 0, "perf lost records");
}

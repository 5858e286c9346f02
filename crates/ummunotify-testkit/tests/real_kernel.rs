//! Real-kernel tests: the PFN oracle, the io_uring stale-registration hazard, and the whole
//! catalogue run against the naive watcher (which proves every case really changes memory).
//!
//! A missing kernel feature prints a loud SKIP, or fails when `UMN_REQUIRE_ALL=1`.

use std::io;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use ummunotify_testkit::changes::{
    case_json, child_case_from_env, parse_case_json, print_child_report, run_case, run_in_child,
    CaseReport, ChangeKind, NaiveWatcher, WatchError, Watcher,
};
use ummunotify_testkit::pagemap::{page_size, pfn};
use ummunotify_testkit::require::{or_skip, skip_or_fail};
use ummunotify_testkit::uring::Pinner;

/// Cases map at fixed addresses; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn mmap_rw(at: usize, len: usize) -> usize {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | if at == 0 {
            0
        } else {
            libc::MAP_FIXED_NOREPLACE
        };
    // SAFETY: never MAP_FIXED, so no existing mapping is replaced.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
    p as usize
}

fn fill(addr: usize, len: usize, byte: u8) {
    // SAFETY: callers pass memory they just mapped read-write.
    unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len) };
}

#[test]
fn pagemap_reports_present_absent_and_unmapped() {
    let _g = serial();
    let page = page_size();
    let base = mmap_rw(0, 2 * page);
    fill(base, page, 1);
    let Some(touched) = or_skip("pagemap", pfn(base)) else {
        return;
    };
    assert!(touched.is_some(), "written page must be present");
    assert_eq!(
        pfn(base + page).unwrap(),
        None,
        "untouched page is not present"
    );
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(base as *mut libc::c_void, 2 * page) };
    assert_eq!(pfn(base).unwrap(), None, "unmapped page is not present");
}

#[test]
fn uring_registration_goes_stale_after_munmap_and_remap() {
    let _g = serial();
    let page = page_size();
    let Some(mut pinner) = or_skip("uring hazard", Pinner::new()) else {
        return;
    };
    let a = mmap_rw(0, page);
    fill(a, page, b'A');
    pinner.register(a, page).expect("register buffer");
    let Some(old) = or_skip("uring hazard", pfn(a)) else {
        return;
    };
    // SAFETY: unmapping our own (pinned) page; the pin keeps the frame alive.
    assert_eq!(unsafe { libc::munmap(a as *mut libc::c_void, page) }, 0);
    let b = mmap_rw(a, page);
    assert_eq!(a, b, "x == y");
    fill(b, page, b'B');
    let new = pfn(b).unwrap();
    assert_eq!(pinner.write_fixed(b, page, 0).unwrap(), page);
    let file = pinner.read_back(page, 0).unwrap();
    pinner.unregister().unwrap();
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(b as *mut libc::c_void, page) };
    assert!(
        file.iter().all(|&c| c == b'A'),
        "device must read the stale 'A' page"
    );
    assert_ne!(
        old, new,
        "a pinned frame can not be reused: PFN must differ"
    );
}

#[test]
fn write_fixed_outside_the_registration_is_refused() {
    let Some(mut pinner) = or_skip("write_fixed bounds", Pinner::new()) else {
        return;
    };
    let err = pinner.write_fixed(4096, 4096, 0).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn names_round_trip_and_are_unique() {
    let mut names: Vec<_> = ChangeKind::ALL.iter().map(|k| k.name()).collect();
    for kind in ChangeKind::ALL {
        assert_eq!(ChangeKind::from_name(kind.name()), Some(*kind));
    }
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ChangeKind::ALL.len());
    assert_eq!(ChangeKind::ALL.len(), 22);
    let unseen: Vec<_> = ChangeKind::ALL
        .iter()
        .filter(|k| !k.userfaultfd_reports())
        .map(|k| k.name())
        .collect();
    assert_eq!(
        unseen,
        [
            "shmdt",
            "madv-guard-install",
            "madv-collapse",
            "punch-hole",
            "ftruncate-shared"
        ]
    );
    assert_eq!(ChangeKind::from_name("no-such-change"), None);
    assert!(ChangeKind::BrkShrink.needs_own_process());
}

#[test]
fn json_round_trips() {
    let mut report = CaseReport::new(ChangeKind::PartialOverlap, true);
    report.detected = true;
    report.stale_uses = 2;
    report.events = vec![(4096..8192, true), (0..1, false)];
    report.counter_moved = true;
    report.oracle_changed = Some(false);
    report.oracle = "pfn".into();
    report.problems = vec!["quote \" backslash \\ newline \n tab \t bell \u{7} é".into()];
    let json = case_json(&report);
    assert!(!json.contains('\n'));
    assert_eq!(parse_case_json(&json).unwrap(), report);
    assert!(parse_case_json("{\"kind\":\"libc-munmap\"}").is_err());
    assert!(parse_case_json(&format!("{json} x")).is_err());

    // An inconclusive case has no verdict: `detected` is null, the reason is kept.
    let mut report = CaseReport::new(ChangeKind::LibcMunmap, true);
    report.inconclusive = Some("taken by 7f00-7f01 rw-p".into());
    let json = case_json(&report);
    assert!(json.contains("\"detected\":null"), "{json}");
    assert!(json.contains("\"inconclusive\":true"), "{json}");
    assert_eq!(parse_case_json(&json).unwrap(), report);
    assert!(!report.passed() && !report.missed_expected());
}

/// Whether an oracle could judge a change that replaces memory; a loud skip (a failure under
/// `UMN_REQUIRE_ALL=1`) when none could: PFNs are hidden without root, and an ordinary file's
/// pages refuse a long-term pin, so `file-backed` run by an ordinary user has no oracle at all.
fn judgeable(report: &CaseReport) -> bool {
    if report.kind.replaces_memory() && report.memory_changed().is_none() {
        skip_or_fail(
            report.kind.name(),
            "an oracle (the pagemap PFNs need root, and the pages could not be pinned)",
        );
        return false;
    }
    true
}

/// What the naive watcher must show for `kind`.
fn assert_naive(report: &CaseReport) {
    let kind = report.kind;
    let text = case_json(report);
    assert!(report.inconclusive.is_none(), "{text}");
    assert!(!report.counter_moved && report.events.is_empty(), "{text}");
    if kind.replaces_memory() {
        // Where PFNs are visible the PFN oracle must see it; the device view wherever pinned.
        assert_ne!(
            report.oracle_changed,
            Some(false),
            "PFN oracle must see {kind}: {text}"
        );
        assert_eq!(
            report.memory_changed(),
            Some(true),
            "an oracle must see {kind}: {text}"
        );
        assert_eq!(
            report.stale_uses, 2,
            "naive watcher must be stale for {kind}: {text}"
        );
        assert!(!report.detected && !report.expected, "{text}");
        if report.pinned {
            assert_eq!(
                report.device_bytes_stale,
                Some(true),
                "device view for {kind}: {text}"
            );
        }
        // Missed as expected of the naive watcher: a note, not a problem.
        assert!(report.passed(), "{text}");
    } else if kind.expects_event() {
        // MADV_FREE: the event is owed but the frames may stay; only detection is judged.
        assert!(!report.detected && !report.expected, "{text}");
    } else {
        assert_ne!(
            report.oracle_changed,
            Some(true),
            "{kind} must not change the range: {text}"
        );
        assert_eq!(report.device_bytes_stale, Some(false), "{text}");
        assert!(
            report.detected && report.expected && report.passed(),
            "{text}"
        );
    }
}

#[test]
fn naive_watcher_is_stale_for_every_replacing_change() {
    let _g = serial();
    for &kind in ChangeKind::ALL {
        if kind.needs_own_process() {
            continue;
        }
        let Some(report) = or_skip(kind.name(), run_case(kind, &mut NaiveWatcher::new())) else {
            continue;
        };
        eprintln!("{}", case_json(&report));
        if judgeable(&report) {
            assert_naive(&report);
        }
    }
}

#[test]
fn brk_shrink_refuses_to_run_in_a_shared_process() {
    if child_case_from_env().is_some() {
        return;
    }
    let err = run_case(ChangeKind::BrkShrink, &mut NaiveWatcher::new()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

/// Entry point of the child process [`run_in_child`] starts; a no-op in a normal test run.
#[test]
fn child_entry() {
    if let Some(kind) = child_case_from_env() {
        print_child_report(&run_case(kind, &mut NaiveWatcher::new()));
    }
}

#[test]
fn naive_watcher_is_stale_for_brk_shrink_in_its_own_process() {
    if child_case_from_env().is_some() {
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"]);
    if let Some(report) = or_skip("brk-shrink", run_in_child(ChangeKind::BrkShrink, cmd)) {
        eprintln!("{}", case_json(&report));
        if judgeable(&report) {
            assert_naive(&report);
        }
    }
}

/// A watcher that, like a thread starting at the wrong moment, maps memory into the hole the
/// change just left (on its first `is_valid` after each `watch`), `intrusions` times.
struct Intruder {
    inner: NaiveWatcher,
    intrusions: usize,
    planted: Vec<usize>,
    armed: bool,
}

impl Watcher for Intruder {
    fn watch(&mut self, range: std::ops::Range<usize>) -> Result<(), WatchError> {
        self.armed = self.intrusions > 0;
        self.inner.watch(range)
    }
    fn is_valid(&mut self) -> bool {
        if self.armed {
            self.armed = false;
            self.intrusions -= 1;
            let at = self.inner.range().expect("watching").start;
            assert_eq!(mmap_rw(at, page_size()), at, "intrude at {at:#x}");
            self.planted.push(at);
        }
        self.inner.is_valid()
    }
    fn counter_moved(&mut self) -> bool {
        self.inner.counter_moved()
    }
    fn events(&mut self) -> Vec<(std::ops::Range<usize>, bool)> {
        self.inner.events()
    }
    fn unwatch(&mut self) {
        self.inner.unwatch();
    }
}

impl Drop for Intruder {
    fn drop(&mut self) {
        for &at in &self.planted {
            // SAFETY: pages this watcher mapped itself.
            unsafe { libc::munmap(at as *mut libc::c_void, page_size()) };
        }
    }
}

#[test]
fn a_taken_address_is_retried_then_inconclusive_never_a_miss() {
    let _g = serial();
    // Taken once: the case runs again at a fresh address and reaches a verdict.
    let mut w = Intruder {
        inner: NaiveWatcher::new(),
        intrusions: 1,
        planted: Vec::new(),
        armed: false,
    };
    let report = run_case(ChangeKind::LibcMunmap, &mut w).expect("run_case");
    assert!(report.inconclusive.is_none(), "{}", case_json(&report));
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("taken by a mapping")),
        "{}",
        case_json(&report)
    );
    assert_eq!(report.stale_uses, 2, "{}", case_json(&report));
    // Taken every time: inconclusive, naming the intruder, and no verdict.
    let mut w = Intruder {
        inner: NaiveWatcher::new(),
        intrusions: usize::MAX,
        planted: Vec::new(),
        armed: false,
    };
    let report = run_case(ChangeKind::LibcMunmap, &mut w).expect("run_case");
    let json = case_json(&report);
    let reason = report.inconclusive.as_deref().expect("inconclusive");
    assert!(
        reason.contains("taken by a mapping the case did not make"),
        "{json}"
    );
    assert!(reason.contains("rw-p"), "the intruder's maps line: {json}");
    assert!(json.contains("\"detected\":null"), "{json}");
    assert!(!report.passed() && !report.missed_expected(), "{json}");
}

/// A watcher that refuses every mapping by type (as ummunotify's userfaultfd backend refuses a
/// SysV segment on Linux 6.1), expected or not to see the kind.
struct Refuser {
    expected: bool,
}

impl Watcher for Refuser {
    fn watch(&mut self, _range: std::ops::Range<usize>) -> Result<(), WatchError> {
        Err(WatchError::Refused(
            "the kernel can not watch this mapping".into(),
        ))
    }
    fn is_valid(&mut self) -> bool {
        unreachable!("a refused watch is never checked")
    }
    fn counter_moved(&mut self) -> bool {
        unreachable!("a refused watch is never checked")
    }
    fn events(&mut self) -> Vec<(std::ops::Range<usize>, bool)> {
        unreachable!("a refused watch is never checked")
    }
    fn unwatch(&mut self) {}
    fn expects(&self, _kind: ChangeKind) -> bool {
        self.expected
    }
}

/// A typed refusal of a kind the watcher is not expected to see is an expected miss (a note,
/// no problem: `umn coverage` lists it as missed, and its exit status stays 0); of a kind it is
/// expected to see, a problem.
#[test]
fn a_typed_refusal_is_an_expected_miss_only_where_no_event_is_expected() {
    let _g = serial();
    let Some(report) = or_skip(
        "shmdt",
        run_case(ChangeKind::Shmdt, &mut Refuser { expected: false }),
    ) else {
        return;
    };
    assert!(report.problems.is_empty(), "{}", case_json(&report));
    assert!(report.inconclusive.is_none(), "{}", case_json(&report));
    assert!(
        !report.detected && !report.expected,
        "{}",
        case_json(&report)
    );
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("refuses this mapping")),
        "{}",
        case_json(&report)
    );
    let report = run_case(ChangeKind::Shmdt, &mut Refuser { expected: true }).expect("run_case");
    assert!(
        report.problems.iter().any(|p| p.contains("refused")),
        "{}",
        case_json(&report)
    );
}

//! `umn coverage --json` on this kernel: every change kind from the notifier's list is detected
//! (an event, the counter, the region word, invalid right after the call returned) with zero
//! stale uses, each in a child process, on pages pinned by io_uring (the PFN oracle is exact).
use std::process::Command;

#[test]
fn every_change_kind_is_detected_with_no_stale_use() {
    let out = Command::new(env!("CARGO_BIN_EXE_umn"))
        .args(["coverage", "--json"])
        .output()
        .expect("run umn coverage");
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.starts_with("{\"backend\":\"userfaultfd\""),
        "{json}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cases = json.matches("\"kind\":").count();
    assert_eq!(cases, 17, "{json}");
    let detected = json.matches("\"detected\":true").count();
    let clean = json.matches("\"stale_uses\":0,").count();
    let passed = json.matches("\"passed\":true").count();
    assert_eq!((detected, clean, passed), (cases, cases, cases), "{json}");
    assert!(out.status.success());
}

#[test]
fn doctor_reports_a_working_backend() {
    let out = Command::new(env!("CARGO_BIN_EXE_umn"))
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("userfaultfd: ok"), "{text}");
    assert!(
        text.contains("EVENT_UNMAP") && text.contains("WP_ASYNC"),
        "{text}"
    );
}

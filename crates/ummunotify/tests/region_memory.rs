//! Bytes per registered region, measured by RSS (issue 12: at most 64 at a million regions).
//!
//! Each case runs in a process of its own (this test binary re-run on one ignored test), so
//! memory freed by another case can not be reused and hide what registration costs: the child
//! registers one-page regions on pages that were never touched (they add no RSS themselves) and
//! prints the growth of `VmRSS` per region; the parent checks it. What it counts is everything
//! the notifier keeps per region: the slot (validity word, cookie, index node, event hint), the
//! cookie table, the event queue's bit, the coverage map and the allocator's overhead.
//!
//! Release builds only (`cargo test --release --test region_memory -- --nocapture` prints the
//! figures; `.ci/run` runs it).
mod common;

use std::process::Command;
use std::time::Instant;

use common::*;
use ummunotify::{Cookie, Notifier};

/// The bound, at a million regions.
const MAX_BYTES_PER_REGION: f64 = 64.0;

const REGIONS: usize = 1_000_000;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Registers `regions()` one-page regions, one every `stride` pages of one untouched mapping,
/// and prints `UMN_REGION_BYTES <bytes per region> <seconds>`.
fn measure(stride: usize) {
    let n_regions = REGIONS;
    let pg = page();
    let n = Notifier::new().unwrap();
    let base = map_untouched(n_regions * stride * pg);
    // Lazily created state that does not grow with the regions (the mapping list the watch
    // policy opens, the first slot segments) is made before the baseline.
    n.register(base..base + pg, Cookie(u64::MAX)).unwrap();
    n.unregister(Cookie(u64::MAX)).unwrap();
    let before = rss_kib();
    let t = Instant::now();
    for i in 0..n_regions {
        let a = base + i * stride * pg;
        n.register(a..a + pg, Cookie(i as u64)).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    let after = rss_kib();
    assert_eq!(n.stats().regions, n_regions);
    let per = (after.saturating_sub(before) * 1024) as f64 / n_regions as f64;
    println!("UMN_REGION_BYTES {per:.1} {secs:.3}");
    eprintln!("stats after registering: {:?}", n.stats());
}

#[test]
#[ignore = "run by bytes_per_region, in a process of its own"]
fn child_adjacent() {
    measure(1);
}

#[test]
#[ignore = "run by bytes_per_region, in a process of its own"]
fn child_scattered() {
    measure(2);
}

/// Runs one child case; returns (bytes per region, seconds to register).
fn run_child(name: &str) -> (f64, f64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| Some(l.split_once("UMN_REGION_BYTES ")?.1))
        .unwrap_or_else(|| panic!("{name} printed no figure:\n{stdout}"));
    let mut it = line.split_whitespace().map(|v| v.parse::<f64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// A figure at a million regions: with fewer, fixed costs (the first slot segments, the coverage
/// runs of the exactly watched pages) and the cookie table's load factor (it grows by half at
/// 3/4 full: 4 to 8 bytes per region) weigh differently, and a debug build takes minutes.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a release-build figure: .ci/run runs it with --release"
)]
fn bytes_per_region() {
    let n = REGIONS;
    for (name, what) in [
        ("child_adjacent", "adjacent pages"),
        ("child_scattered", "every other page (past the VMA budget)"),
    ] {
        let (per, secs) = run_child(name);
        println!(
            "{n} regions on {what}: {per:.1} bytes of RSS per region, registered in {secs:.2} s \
             ({:.2} us per region)",
            secs * 1e6 / n as f64
        );
        assert!(
            per <= MAX_BYTES_PER_REGION,
            "{what}: {per:.1} bytes per region, more than {MAX_BYTES_PER_REGION}"
        );
    }
}

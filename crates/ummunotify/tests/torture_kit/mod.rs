//! Support for the reliability tests (torture, storms, limits, seccomp, signals): raw mappings,
//! a small seeded RNG, memory figures from `/proc/self/status`, a watchdog that turns a hang into
//! a failure, and a way to run part of a test in a fresh child process (re-executing the test
//! binary), for what must not touch the test process itself (rlimits, capabilities, seccomp, brk).
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::common::{map_untouched as map, page, replace as map_fixed, unmap};

/// Fills `[addr, addr + len)` with `byte`.
pub fn fill(addr: usize, len: usize, byte: u8) {
    // SAFETY: callers pass a mapped, writable range they own and do not reference otherwise.
    unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len) };
}

/// A private low address range for tests that unmap and map again at the same address; distinct
/// from `tests/common::fixed_area` (0x2000_0000+). The kernel's top-down mmap never picks these.
pub fn area(slot: usize) -> usize {
    0x4000_0000 + slot * 0x100_0000
}

/// Small, seedable RNG (splitmix64): enough for choosing operations, and reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A seed from `name` in the environment, or from the clock; printed either way.
pub fn seed(var: &str) -> u64 {
    let seed = match std::env::var(var) {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{var}={s} is not a number"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32)
        }
    };
    // Straight to fd 2, before anything runs: the test harness captures `eprintln!`, and a run
    // that dies by a signal never prints what it captured.
    let line = format!("seed: {var}={seed:#x}\n");
    // SAFETY: writes a live buffer of the given length to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    SEED.store(seed, std::sync::atomic::Ordering::SeqCst);
    seed
}

/// The seed of the running test, where a core dump shows it (`print torture_kit::SEED`).
pub static SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A `u64` from the environment, or `default`.
pub fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`, `VmPin`, `VmLck`).
pub fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Number of mappings of this process (lines of `/proc/self/maps`).
pub fn map_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// Number of mappings the kernel marks as watched by a userfaultfd context (`um`/`uw`/`ui` in
/// the `VmFlags` of `/proc/self/smaps`).
pub fn watched_vmas() -> usize {
    Smaps::with_capacity(1 << 20).watched_vmas()
}

/// Reads `/proc/self/smaps` into a buffer reserved up front: at `vm.max_map_count` the process can
/// not make the new mapping a growing buffer would need.
pub struct Smaps(Vec<u8>);

impl Smaps {
    pub fn with_capacity(bytes: usize) -> Smaps {
        Smaps(Vec::with_capacity(bytes))
    }

    pub fn watched_vmas(&mut self) -> usize {
        use std::io::Read;
        self.0.clear();
        let mut f = std::fs::File::open("/proc/self/smaps").unwrap();
        loop {
            if self.0.len() == self.0.capacity() {
                panic!("smaps larger than the reserved {} bytes", self.0.capacity());
            }
            let len = self.0.len();
            let cap = self.0.capacity();
            self.0.resize(cap, 0);
            let n = f.read(&mut self.0[len..]).unwrap();
            self.0.truncate(len + n);
            if n == 0 {
                break;
            }
        }
        String::from_utf8_lossy(&self.0)
            .lines()
            .filter_map(|l| l.strip_prefix("VmFlags:"))
            .filter(|f| {
                f.split_whitespace()
                    .any(|w| matches!(w, "um" | "uw" | "ui"))
            })
            .count()
    }
}

/// Aborts the process (a hang becomes a failure) unless dropped within `limit`.
pub struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    pub fn new(what: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            while t.elapsed() < limit {
                if d.load(SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("DEADLOCK/HANG: {what} did not finish in {limit:?}");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// Environment variable naming the child-side role of a test run in a child process.
pub const CHILD_ROLE: &str = "UMN_RELIABILITY_CHILD";

/// The role this process plays, if it is a child started by [`run_child`].
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ROLE).ok()
}

/// What a child printed and how it ended.
#[derive(Debug)]
pub struct ChildOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the test `test` of this test binary in a fresh process with `CHILD_ROLE=role`, killing
/// it if it takes longer than `limit` (a hang fails the test instead of hanging CI).
pub fn run_child(test: &str, role: &str, limit: Duration) -> ChildOutput {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "child {test}/{role} hung for {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    ChildOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub mod engine;

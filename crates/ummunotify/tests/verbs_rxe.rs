//! The x == y hazard on the wire: a registration cache over [`VerbsRegistrar`] serves this
//! process's buffers, and a peer process reads them by RDMA READ (and writes them by RDMA WRITE)
//! over an RC queue pair, while this process changes the memory by every kind of the catalogue
//! and puts new memory at the same address.
//!
//! * `ummunotify_cache_puts_no_old_page_on_the_wire`: the cache on the notifier `UMN_BACKEND`
//!   picks. For every kind the backend claims, the get after the change must miss and the peer
//!   must read the new bytes and write into the new pages: 0 stale bytes.
//! * `naive_cache_puts_old_pages_on_the_wire`: the same with a cache that never invalidates:
//!   every kind that replaces memory must show stale bytes (else the test could not fail).
//!
//! Each case prints one `RXE-HAZARD` line (the guest's `kernel/rxe/verdict.py` reads them).
//! An RDMA device is needed: soft-RoCE in the QEMU guest of `kernel/rxe/run.sh`, or real
//! hardware. Without one the tests say so and pass: the one skip `UMN_REQUIRE_ALL=1` does not
//! turn into a failure (hardware, not a kernel feature, is missing). The peer is
//! `kernel/rxe/rxe_peer.c`: `UMN_RXE_PEER` names a built one, else it is built with gcc
//! (rdma-core's headers needed). `UMN_RXE_DEVICE` picks the device (default: the first).
//! Kinds the running kernel can not make at all are listed in `UMN_KERNEL_LACKS` (the guest
//! does); any other missing feature is a SKIP (a failure under `UMN_REQUIRE_ALL=1`).
#![allow(unsafe_code)]

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::process::Command;

use ummunotify::cache::{Cache, Config, Error as CacheError};
use ummunotify::registrar::{verbs_devices, Access, MemoryRegion, VerbsRegistrar};
use ummunotify::Error;
use ummunotify_testkit::changes::{Change, ChangeKind, NEW_BYTE, OLD_BYTE, OWN_PROCESS_ENV};
use ummunotify_testkit::rdma::Wire;
use ummunotify_testkit::require::{missing_feature, skip_or_fail};

/// What the peer writes over the wire.
const WIRE_BYTE: u8 = b'W';
/// Environment variable of a child run: the one kind it runs.
const ONLY_ENV: &str = "UMN_RXE_ONLY_KIND";

fn access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

/// The device to use, or `None` after saying why not (hardware absent).
fn device(test: &str) -> Option<String> {
    let devices = match verbs_devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "**************** SKIP {test}: no RDMA device ({e}). Not a failure under \
                 UMN_REQUIRE_ALL=1: hardware, not a kernel feature, is missing; kernel/rxe/run.sh \
                 runs this test on soft-RoCE in a QEMU guest."
            );
            return None;
        }
    };
    let want = std::env::var("UMN_RXE_DEVICE").ok();
    match want {
        Some(w) if devices.contains(&w) => Some(w),
        Some(w) => panic!("{test}: UMN_RXE_DEVICE={w} is not among the devices {devices:?}"),
        None => match devices.into_iter().next() {
            Some(d) => Some(d),
            None => {
                eprintln!(
                    "**************** SKIP {test}: no RDMA device (libibverbs lists none). Not a \
                     failure under UMN_REQUIRE_ALL=1: hardware is missing; kernel/rxe/run.sh runs \
                     this test on soft-RoCE in a QEMU guest."
                );
                None
            }
        },
    }
}

/// The peer program: `UMN_RXE_PEER`, or built from `kernel/rxe/rxe_peer.c`.
fn peer() -> PathBuf {
    if let Some(p) = std::env::var_os("UMN_RXE_PEER") {
        return p.into();
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kernel/rxe/rxe_peer.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rxe_peer");
    ummunotify_testkit::cprog::gcc(&src, &out, ["-O2", "-libverbs"]);
    out
}

/// Kinds the running kernel can not make at all (`UMN_KERNEL_LACKS`, comma-separated names).
fn kernel_lacks(kind: ChangeKind) -> bool {
    std::env::var("UMN_KERNEL_LACKS")
        .unwrap_or_default()
        .split(',')
        .any(|k| k == kind.name())
}

/// Whether `UMN_RXE_KNOWN_REFUSALS` (`backend:kind,...`, from `kernel/rxe/known-refusals.txt`)
/// lists a claimed kind this backend refuses on the running kernel with a typed error (nothing
/// is registered then, so nothing stale can be sent; `kernel/rxe/verdict.py` keeps the list
/// exact).
fn known_refusal(backend: &str, kind: ChangeKind) -> bool {
    std::env::var("UMN_RXE_KNOWN_REFUSALS")
        .unwrap_or_default()
        .split(',')
        .any(|e| e == format!("{backend}:{kind}"))
}

/// A registration handed out for one use.
struct Got {
    addr: usize,
    rkey: u32,
    hit: bool,
}

/// A registration cache under test, as the hazard loop drives it.
trait Served {
    /// The cache's name in the report (`ummunotify`, `naive`).
    fn name(&self) -> &'static str;
    /// The backend's name (`-` for the naive cache).
    fn backend(&self) -> String;
    /// Serves `range` for one use (the registration stays cached after [`Served::put`]).
    fn get(&mut self, range: Range<usize>) -> Result<Got, CacheError>;
    /// Ends the use of the last `get`.
    fn put(&mut self);
    /// After a case: releases what the case left registered.
    fn end_case(&mut self);
    /// The protection domain the registrations are made in.
    fn pd(&self) -> *mut std::ffi::c_void;
}

/// The library's cache. The handle of the current use is kept as its range and key (a `Handle`
/// borrows the cache); `put` happens at once, which is what a cache user does between uses.
struct Ummunotify {
    cache: Cache<VerbsRegistrar>,
}

impl Served for Ummunotify {
    fn name(&self) -> &'static str {
        "ummunotify"
    }
    fn backend(&self) -> String {
        self.cache.notifier().backend().name().to_owned()
    }
    fn get(&mut self, range: Range<usize>) -> Result<Got, CacheError> {
        let misses = self.cache.stats().misses;
        let h = self.cache.get(range.start, range.len())?;
        let got = Got {
            addr: range.start,
            rkey: h.key().rkey(),
            hit: self.cache.stats().misses == misses,
        };
        assert!(h.range().start <= range.start && range.end <= h.range().end);
        assert_eq!(
            h.key().addr(),
            h.range().start,
            "the region's address is its start"
        );
        Ok(got)
    }
    fn put(&mut self) {}
    fn end_case(&mut self) {
        self.cache.flush();
    }
    fn pd(&self) -> *mut std::ffi::c_void {
        self.cache.registrar().pd()
    }
}

/// A cache that never invalidates: exact ranges to their memory regions.
struct Naive {
    verbs: VerbsRegistrar,
    map: Vec<(Range<usize>, MemoryRegion)>,
}

impl Served for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }
    fn backend(&self) -> String {
        "-".into()
    }
    fn get(&mut self, range: Range<usize>) -> Result<Got, CacheError> {
        if let Some((_, mr)) = self.map.iter().find(|(r, _)| *r == range) {
            return Ok(Got {
                addr: range.start,
                rkey: mr.rkey(),
                hit: true,
            });
        }
        let mr = self
            .verbs
            .reg_mr(range.clone())
            .map_err(|e| CacheError::Register(e.into()))?;
        let rkey = mr.rkey();
        self.map.push((range.clone(), mr));
        Ok(Got {
            addr: range.start,
            rkey,
            hit: false,
        })
    }
    fn put(&mut self) {}
    fn end_case(&mut self) {
        for (_, mr) in self.map.drain(..) {
            self.verbs.dereg_mr(mr).expect("ibv_dereg_mr");
        }
    }
    fn pd(&self) -> *mut std::ffi::c_void {
        self.verbs.pd()
    }
}

/// How a case ended.
#[derive(Debug, PartialEq)]
enum CaseEnd {
    /// Ran to the end.
    Ran,
    /// The notifier refused to watch the range with a typed error (nothing was sent).
    Refused(String),
    /// The device refused to register the range (nothing was sent).
    DeviceRefused(String),
    /// The kernel can not make this kind (listed in `UMN_KERNEL_LACKS`).
    Lacks(String),
}

/// One case's result: one `RXE-HAZARD` line.
#[derive(Debug)]
struct Outcome {
    cache: &'static str,
    backend: String,
    kind: ChangeKind,
    claimed: Option<bool>,
    ran: CaseEnd,
    /// The get after the change was a hit (the old registration reused).
    hit_after: bool,
    /// Bytes the peer read over the wire that were not the new memory's.
    read_stale: usize,
    /// Bytes the peer wrote that did not land in the new memory.
    write_lost: usize,
    /// Bytes of the write that landed in the new memory only after its completion.
    write_late: usize,
    len: usize,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let claimed = match self.claimed {
            Some(true) => "1",
            Some(false) => "0",
            None => "-",
        };
        let (result, note) = match &self.ran {
            CaseEnd::Ran => ("ran", String::new()),
            CaseEnd::Refused(why) => ("refused", why.replace(char::is_whitespace, "_")),
            CaseEnd::DeviceRefused(why) => {
                ("device-refused", why.replace(char::is_whitespace, "_"))
            }
            CaseEnd::Lacks(why) => ("lacks", why.replace(char::is_whitespace, "_")),
        };
        write!(
            f,
            "RXE-HAZARD lang=rust cache={} backend={} kind={} claimed={claimed} replaces={} \
             result={result} hit_after={} read_stale={} write_lost={} write_late={} len={}",
            self.cache,
            self.backend,
            self.kind,
            u8::from(self.kind.replaces_memory()),
            u8::from(self.hit_after),
            self.read_stale,
            self.write_lost,
            self.write_late,
            self.len
        )?;
        if !note.is_empty() {
            write!(f, " note={note}")?;
        }
        Ok(())
    }
}

fn read_memory(range: &Range<usize>) -> Vec<u8> {
    let mut out = vec![0; range.len()];
    // SAFETY: the case's range, mapped readable after the refill; `out` is our own buffer.
    unsafe { std::ptr::copy_nonoverlapping(range.start as *const u8, out.as_mut_ptr(), out.len()) };
    out
}

/// One case: serve, read OLD over the wire, change, refill (x == y), serve again, read and write
/// over the wire, compare with the new memory.
fn case(kind: ChangeKind, served: &mut dyn Served, wire: &mut Wire) -> Outcome {
    let backend = served.backend();
    let mut out = Outcome {
        cache: served.name(),
        claimed: kind.expected_on(&backend),
        backend,
        kind,
        ran: CaseEnd::Ran,
        hit_after: false,
        read_stale: 0,
        write_lost: 0,
        write_late: 0,
        len: 0,
    };
    let lacks = |e: &std::io::Error| -> Option<CaseEnd> {
        let m = missing_feature(e)?;
        if kernel_lacks(kind) {
            Some(CaseEnd::Lacks(m.to_string()))
        } else {
            skip_or_fail(&format!("verbs_rxe {kind}"), &m.to_string());
            Some(CaseEnd::Lacks(m.to_string()))
        }
    };
    let mut ch = match Change::setup(kind) {
        Ok(ch) => ch,
        Err(e) => {
            out.ran = lacks(&e).unwrap_or_else(|| panic!("{kind}: setup: {e}"));
            return out;
        }
    };
    let range = ch.range();
    out.len = range.len();
    let first = match served.get(range.clone()) {
        Ok(g) => g,
        Err(CacheError::Notifier(e @ Error::UnsupportedMapping(_))) => {
            out.ran = CaseEnd::Refused(e.to_string());
            let _ = ch.cleanup();
            return out;
        }
        Err(CacheError::Register(e)) => {
            out.ran = CaseEnd::DeviceRefused(e.to_string());
            let _ = ch.cleanup();
            return out;
        }
        Err(e) => panic!("{kind}: first get: {e}"),
    };
    let before = wire
        .read(first.addr, range.len(), first.rkey)
        .unwrap_or_else(|e| panic!("{kind}: first RDMA READ: {e}"));
    assert!(
        before.iter().all(|&b| b == OLD_BYTE),
        "{kind}: the peer did not read the registered memory before the change"
    );
    served.put();
    if let Err(e) = ch.apply() {
        out.ran = lacks(&e).unwrap_or_else(|| panic!("{kind}: change: {e}"));
        let _ = ch.cleanup();
        served.end_case();
        return out;
    }
    ch.refill()
        .unwrap_or_else(|e| panic!("{kind}: refill: {e}"));
    let after = match served.get(range.clone()) {
        Ok(g) => g,
        Err(e) => panic!("{kind}: get after the change: {e}"),
    };
    out.hit_after = after.hit;
    let wire_bytes = wire
        .read(after.addr, range.len(), after.rkey)
        .unwrap_or_else(|e| panic!("{kind}: RDMA READ after the change: {e}"));
    out.read_stale = wire_bytes.iter().filter(|&&b| b != NEW_BYTE).count();
    wire.write(after.addr, range.len(), after.rkey, WIRE_BYTE)
        .unwrap_or_else(|e| panic!("{kind}: RDMA WRITE after the change: {e}"));
    // A write through a stale registration never reaches the new memory; bytes that arrive
    // after the write's completion are told apart (and recorded as late) by waiting 200 ms.
    let not_written = || {
        read_memory(&range)
            .iter()
            .filter(|&&b| b != WIRE_BYTE)
            .count()
    };
    let at_completion = not_written();
    out.write_lost = at_completion;
    for _ in 0..20 {
        if out.write_lost == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        out.write_lost = not_written();
    }
    out.write_late = at_completion - out.write_lost;
    served.put();
    let problems = ch.cleanup();
    assert!(problems.is_empty(), "{kind}: cleanup: {problems:?}");
    served.end_case();
    out
}

/// The kinds this process runs: `UMN_RXE_ONLY_KIND` in a child, else the whole catalogue.
fn kinds() -> Vec<ChangeKind> {
    match std::env::var(ONLY_ENV) {
        Ok(k) => vec![ChangeKind::from_name(&k).expect("a catalogue kind")],
        Err(_) => ChangeKind::ALL.to_vec(),
    }
}

/// Parses the `RXE-HAZARD` line a child printed back into an outcome's numbers.
fn from_child(kind: ChangeKind, test: &str) -> Outcome {
    let out = Command::new(std::env::current_exe().expect("current_exe"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ONLY_ENV, kind.name())
        .env(OWN_PROCESS_ENV, "1")
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{kind} in a child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The harness may print "test ... " before it on the same line.
    let line = stdout
        .lines()
        .find_map(|l| l.find("RXE-HAZARD ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("{kind}: the child printed no RXE-HAZARD line:\n{stdout}"));
    let field = |name: &str| -> String {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .unwrap_or_default()
            .to_owned()
    };
    let num = |name: &str| field(name).parse::<usize>().unwrap_or(0);
    Outcome {
        cache: if field("cache") == "naive" {
            "naive"
        } else {
            "ummunotify"
        },
        backend: field("backend"),
        kind,
        claimed: match field("claimed").as_str() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        },
        ran: match field("result").as_str() {
            "ran" => CaseEnd::Ran,
            "refused" => CaseEnd::Refused(field("note")),
            "device-refused" => CaseEnd::DeviceRefused(field("note")),
            _ => CaseEnd::Lacks(field("note")),
        },
        hit_after: num("hit_after") == 1,
        read_stale: num("read_stale"),
        write_lost: num("write_lost"),
        write_late: num("write_late"),
        len: num("len"),
    }
}

/// Runs every kind against `served`; a kind that needs a process of its own runs in a child
/// (the same test, restricted to it) and its line is relayed.
fn run_all(test: &str, served: &mut dyn Served, device: &str) -> Vec<Outcome> {
    let peer = peer();
    let own = std::env::var_os(ONLY_ENV).is_some();
    // SAFETY: the pd lives in `served`, which outlives the wire (dropped at the end of this fn).
    let mut wire = unsafe { Wire::connect(&peer, device, served.pd()) }
        .unwrap_or_else(|e| panic!("{test}: connecting to the peer on {device}: {e}"));
    let mut outcomes = Vec::new();
    for kind in kinds() {
        let o = if kind.needs_own_process() && !own {
            from_child(kind, test)
        } else {
            case(kind, served, &mut wire)
        };
        println!("{o}");
        outcomes.push(o);
    }
    outcomes
}

#[test]
fn ummunotify_cache_puts_no_old_page_on_the_wire() {
    const TEST: &str = "ummunotify_cache_puts_no_old_page_on_the_wire";
    let Some(device) = device(TEST) else { return };
    let verbs = VerbsRegistrar::open(Some(&device), access()).expect("a verbs registrar");
    let cache = Cache::new(verbs, Config::default()).expect("a cache (UMN_BACKEND's notifier)");
    let mut served = Ummunotify { cache };
    let outcomes = run_all(TEST, &mut served, &device);
    let mut failures = Vec::new();
    for o in &outcomes {
        let claimed = o.claimed == Some(true);
        let who = format!("{} on {}", o.kind, o.backend);
        match &o.ran {
            CaseEnd::Ran if claimed => {
                if o.read_stale != 0 || o.write_lost != 0 {
                    failures.push(format!(
                        "{who}: stale bytes on the wire (read {}, write {})",
                        o.read_stale, o.write_lost
                    ));
                }
                let silent = o.kind == ChangeKind::UntouchedNeighbour;
                if o.hit_after != silent {
                    failures.push(format!(
                        "{who}: the get after the change {}",
                        if silent { "missed" } else { "hit" }
                    ));
                }
            }
            CaseEnd::Refused(why) if claimed && !known_refusal(&o.backend, o.kind) => {
                failures.push(format!("{who}: a claimed kind was refused: {why}"));
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let stats = served.cache.stats();
    println!("RXE-STATS lang=rust backend={} {stats:?}", served.backend());
}

#[test]
fn naive_cache_puts_old_pages_on_the_wire() {
    const TEST: &str = "naive_cache_puts_old_pages_on_the_wire";
    let Some(device) = device(TEST) else { return };
    let verbs = VerbsRegistrar::open(Some(&device), access()).expect("a verbs registrar");
    let mut served = Naive {
        verbs,
        map: Vec::new(),
    };
    let outcomes = run_all(TEST, &mut served, &device);
    let mut failures = Vec::new();
    for o in &outcomes {
        if o.ran != CaseEnd::Ran {
            continue;
        }
        let who = o.kind;
        if o.kind.replaces_memory() && (o.read_stale == 0 || o.write_lost == 0 || !o.hit_after) {
            failures.push(format!(
                "{who}: the naive cache showed no stale bytes (the case does not make the hazard)"
            ));
        }
        if !o.kind.replaces_memory() && (o.read_stale != 0 || o.write_lost != 0) {
            failures.push(format!(
                "{who}: stale bytes where the memory was not replaced"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! `umn coverage`: every change kind against the notifier, each in a child process, judged by
//! the PFN oracle and the io_uring device view (see `ummunotify_testkit::changes`).
use std::io;
use std::process::Command;

use serde::Serialize;
use ummunotify::{Backend, Cookie, Notifier};
use ummunotify_testkit::changes::{
    print_child_report, run_case, run_in_child, CaseJson, CaseReport, ChangeKind,
};

use crate::remove_race::RaceJson;
pub use crate::remove_race::Row as RaceRow;
use crate::watch::{expects, NotifierWatcher};

/// The hidden subcommand a child runs.
pub const CHILD_SUBCOMMAND: &str = "__coverage-case";

/// Runs `kind` in this process against a fresh notifier (on the backend `UMN_BACKEND` names,
/// which [`run_all`] sets) and prints the report line for the parent. Used by the child side of
/// [`run_all`].
pub fn child_main(kind: ChangeKind) {
    let result = Notifier::new()
        .map_err(io::Error::from)
        .and_then(|n| run_case(kind, &mut NotifierWatcher::new(&n, Cookie(0xC0FFEE))));
    print_child_report(&result);
}

/// One row of the coverage table.
#[derive(Debug)]
pub struct Row {
    /// The change kind.
    pub kind: ChangeKind,
    /// The report. A case that could not run at all (a missing kernel feature, a child that
    /// crashed) is an inconclusive report whose reason says why: never "not detected".
    pub report: CaseReport,
}

impl Row {
    fn new(kind: ChangeKind, result: io::Result<CaseReport>, expected: bool) -> Row {
        let report = result.unwrap_or_else(|e| {
            let mut r = CaseReport::new(kind, expected);
            r.inconclusive = Some(format!("could not run: {e}"));
            r
        });
        Row { kind, report }
    }

    /// Detected as the catalogue expects (for an untouched neighbour: correctly silent).
    /// `None` for an inconclusive case: it has no verdict.
    pub fn detected(&self) -> Option<bool> {
        match self.report.inconclusive {
            Some(_) => None,
            None => Some(self.report.detected),
        }
    }
    /// Checks that passed although memory had changed.
    pub fn stale_uses(&self) -> u32 {
        self.report.stale_uses
    }
    /// What counts against the notifier: a kind it is expected to see, missed or used stale,
    /// or any problem in the case.
    pub fn failed(&self) -> bool {
        !self.report.problems.is_empty()
            || self.report.missed_expected()
            || (self.report.expected && self.report.stale_uses > 0)
    }
    /// Whether the case could not run to a verdict.
    pub fn inconclusive(&self) -> bool {
        self.report.inconclusive.is_some()
    }
}

/// What a run means, counted once for the table's closing lines and the JSON's `"summary"`.
struct Summary<'a> {
    /// Kinds this backend is expected to see.
    expected: usize,
    /// Of those, detected with no stale use (and no problem).
    detected: usize,
    failed: Vec<&'a str>,
    inconclusive: Vec<&'a str>,
    /// Kinds this backend can not see, missed as the catalogue says (they stay in the table).
    missed_as_expected: Vec<&'a str>,
}

impl<'a> Summary<'a> {
    fn of(rows: &'a [Row]) -> Summary<'a> {
        let names = |f: &dyn Fn(&Row) -> bool| -> Vec<&'a str> {
            rows.iter()
                .filter(|r| f(r))
                .map(|r| r.kind.name())
                .collect()
        };
        Summary {
            expected: rows.iter().filter(|r| r.report.expected).count(),
            detected: rows
                .iter()
                .filter(|r| r.report.expected && !r.failed() && !r.inconclusive())
                .count(),
            failed: names(&|r| r.failed()),
            inconclusive: names(&|r| r.inconclusive()),
            missed_as_expected: names(&|r| !r.report.expected && r.detected() == Some(false)),
        }
    }
}

/// The exit status `umn coverage` gives for `rows` and the `remove-race` row: 0 when every case
/// ran and every expected kind was detected with no stale use, 1 for a miss, a stale use or a
/// problem, 3 when nothing failed but some case was inconclusive (the run says nothing about it:
/// run it again).
pub fn exit_status(rows: &[Row], race: &RaceRow) -> u8 {
    if rows.iter().any(Row::failed) || race.failed() {
        1
    } else if rows.iter().any(Row::inconclusive) || race.inconclusive() {
        3
    } else {
        0
    }
}

/// Which backend `asked` resolves to here (Auto: userfaultfd where it starts, else hooks), by
/// starting a notifier on it; the error says why it can not start.
pub fn resolve(asked: Backend) -> Result<Backend, ummunotify::Error> {
    Notifier::with_backend(asked).map(|n| n.backend())
}

/// The name `umn coverage` prints (and puts in its JSON `"backend"`) for a backend that ran.
pub fn backend_label(backend: Backend) -> &'static str {
    match backend {
        Backend::Hooks => "hooks",
        Backend::Hybrid => "hybrid",
        Backend::Ebpf => "ebpf",
        Backend::Kernel => "kernel",
        Backend::Perf => "perf",
        Backend::Tracepoint => "tracepoint",
        _ => "userfaultfd",
    }
}

/// Runs every kind on `backend` (as [`resolve`] returned it), each in a child process started as
/// `exe CHILD_SUBCOMMAND` with `UMN_BACKEND` naming the backend.
pub fn run_all(exe: &std::path::Path, backend: Backend) -> Vec<Row> {
    ChangeKind::ALL
        .iter()
        .map(|&kind| {
            let mut cmd = Command::new(exe);
            cmd.arg(CHILD_SUBCOMMAND)
                .env(ummunotify::BACKEND_ENV, backend.name());
            Row::new(kind, run_in_child(kind, cmd), expects(backend, kind))
        })
        .collect()
}

/// The `--json` form: `{"backend": ..., "cases": [{"kind", "detected", "expected", "stale_uses",
/// "inconclusive", "problems", ...}], "remove_race": {"verdict", "stale", "removes_by_grace",
/// "kinds": [...], ...}, "summary": {"exit_status", "expected", "detected", "failed",
/// "inconclusive", "missed_as_expected"}}`: each case is the testkit's report
/// (`ummunotify_testkit::changes::case_json`), `detected` `null` for an inconclusive one; then
/// the `remove-race` row ([`RaceRow::json`]); then what the run means, as the table's closing
/// lines say it: a kind in `missed_as_expected` (with its stale uses) is one this backend can not
/// see, kept in the table, not a failure of the run.
pub fn to_json(backend: &str, rows: &[Row], race: &RaceRow) -> String {
    let sum = Summary::of(rows);
    let doc = CoverageJson {
        backend,
        cases: rows.iter().map(|r| CaseJson::from(&r.report)).collect(),
        remove_race: race.json(),
        summary: SummaryJson {
            exit_status: exit_status(rows, race),
            expected: sum.expected,
            detected: sum.detected,
            failed: sum.failed,
            inconclusive: sum.inconclusive,
            missed_as_expected: sum.missed_as_expected,
        },
    };
    // Strings, integers, booleans and vectors of them: serializing can not fail.
    serde_json::to_string(&doc).expect("coverage JSON serializes")
}

/// `umn coverage --json`'s document, its fields in the order printed.
#[derive(Serialize)]
struct CoverageJson<'a> {
    backend: &'a str,
    cases: Vec<CaseJson>,
    remove_race: RaceJson<'a>,
    summary: SummaryJson<'a>,
}

/// The JSON's `"summary"`.
#[derive(Serialize)]
struct SummaryJson<'a> {
    exit_status: u8,
    expected: usize,
    detected: usize,
    failed: Vec<&'a str>,
    inconclusive: Vec<&'a str>,
    missed_as_expected: Vec<&'a str>,
}

/// The human form: a table (the `remove-race` row last), then what the run means.
pub fn to_table(backend: &str, rows: &[Row], race: &RaceRow) -> String {
    let mut out = format!(
        "backend: {backend}\n{:<22} {:<12} {:<9} {:<6} {:<11} notes\n",
        "kind", "detected", "expected", "stale", "oracle"
    );
    for r in rows {
        let rep = &r.report;
        let note = match (&rep.inconclusive, rep.problems.is_empty()) {
            (Some(reason), _) => reason.clone(),
            (None, true) => rep.notes.join("; "),
            (None, false) => rep.problems.join("; "),
        };
        let detected = match r.detected() {
            None => "inconclusive",
            Some(true) => "yes",
            Some(false) if rep.expected => "NO",
            Some(false) => "no (missed)",
        };
        out.push_str(&format!(
            "{:<22} {:<12} {:<9} {:<6} {:<11} {}\n",
            r.kind.name(),
            detected,
            if rep.expected { "yes" } else { "no" },
            r.stale_uses(),
            rep.oracle,
            note
        ));
    }
    out.push_str(&race.to_table());
    let sum = Summary::of(rows);
    out.push_str(&format!(
        "\n{} of {} kinds this backend is expected to see: detected with no stale use; \
         {} failed; {} inconclusive (could not run: not a verdict).\n",
        sum.detected,
        sum.expected,
        sum.failed.len(),
        sum.inconclusive.len(),
    ));
    out.push_str(&format!(
        "madvise REMOVE racing a registration ({}): {}; {} stale use(s), {} REMOVE(s) settled \
         by grace rather than by acknowledgement.\n",
        crate::remove_race::NAME,
        race.verdict().name(),
        race.stale(),
        race.kinds.iter().map(|k| k.by_grace).sum::<u64>()
    ));
    if !sum.missed_as_expected.is_empty() {
        out.push_str(&format!(
            "Not seen by this backend, so a registration over such memory stays valid: {}.\n",
            sum.missed_as_expected.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remove_race::KindResult;

    /// Rows that reach every branch of the writer: detected, inconclusive (with characters that
    /// need escaping), missed as expected, failed; a race row with a skipped and an unseen kind.
    fn sample() -> (Vec<Row>, RaceRow) {
        let mut hit = CaseReport::new(ChangeKind::LibcMunmap, true);
        hit.detected = true;
        hit.oracle = "pfn+device".into();
        hit.events = vec![(4096..8192, true), (0..1, false)];
        hit.counter_moved = true;
        hit.oracle_changed = Some(true);
        hit.device_bytes_stale = Some(false);
        hit.pinned = true;
        hit.notes = vec!["a note".into()];
        let mut odd = CaseReport::new(ChangeKind::PartialOverlap, true);
        odd.inconclusive = Some("taken by \"7f00\"\\ 7f01\n\ttab \u{1} é".into());
        let mut unseen = CaseReport::new(ChangeKind::MremapMove, false);
        unseen.stale_uses = 3;
        let mut miss = CaseReport::new(ChangeKind::MadvDontneed, true);
        miss.stale_uses = 1;
        miss.problems = vec!["stale".into(), "and \"more\"".into()];
        let rows = [hit, odd, unseen, miss]
            .into_iter()
            .map(|r| Row {
                kind: r.kind,
                report: r,
            })
            .collect();
        let k = |kind: &str, skipped: Option<&str>, unseen| KindResult {
            kind: kind.into(),
            skipped: skipped.map(Into::into),
            changes: 1,
            attempts: 2,
            racing: 3,
            judged: 4,
            stale: 5,
            confirmed: 6,
            by_grace: 7,
            unseen,
        };
        let race = RaceRow {
            kinds: vec![
                k("madv_dontneed", None, false),
                k("process_madvise", Some("process_madvise (ENOSYS)"), false),
                k("io_uring_madvise", None, true),
            ],
            ms: 250,
            reason: Some("child \"exited\"".into()),
            not_applicable: false,
        };
        (rows, race)
    }

    /// CI greps `^{"backend":"hooks",` and compares `"kind":...,"detected":...,"expected":...`
    /// between root and nobody; kernel/compare.py parses the whole object: the bytes are kept.
    #[test]
    fn json_is_unchanged() {
        let (rows, race) = sample();
        let json = to_json("hooks", &rows, &race);
        assert_eq!(json, GOLDEN, "\n{json}");
    }

    const GOLDEN: &str = r#"{"backend":"hooks","cases":[{"kind":"libc-munmap","detected":true,"expected":true,"stale_uses":0,"inconclusive":false,"reason":null,"oracle":"pfn+device","expected_event":true,"events":[{"start":4096,"end":8192,"hint":true},{"start":0,"end":1,"hint":false}],"counter_moved":true,"oracle_changed":true,"device_bytes_stale":false,"pinned":true,"problems":[],"notes":["a note"]},{"kind":"partial-overlap","detected":null,"expected":true,"stale_uses":0,"inconclusive":true,"reason":"taken by \"7f00\"\\ 7f01\n\ttab \u0001 é","oracle":"none","expected_event":true,"events":[],"counter_moved":false,"oracle_changed":null,"device_bytes_stale":null,"pinned":false,"problems":[],"notes":[]},{"kind":"mremap-move","detected":false,"expected":false,"stale_uses":3,"inconclusive":false,"reason":null,"oracle":"none","expected_event":true,"events":[],"counter_moved":false,"oracle_changed":null,"device_bytes_stale":null,"pinned":false,"problems":[],"notes":[]},{"kind":"madv-dontneed","detected":false,"expected":true,"stale_uses":1,"inconclusive":false,"reason":null,"oracle":"none","expected_event":true,"events":[],"counter_moved":false,"oracle_changed":null,"device_bytes_stale":null,"pinned":false,"problems":["stale","and \"more\""],"notes":[]}],"remove_race":{"name":"remove-race","verdict":"missed","ms_per_kind":250,"stale":10,"removes_confirmed":18,"removes_by_grace":21,"reason":"child \"exited\"","kinds":[{"kind":"madv_dontneed","expected":true,"skipped":null,"exercised":true,"changes":1,"attempts":2,"racing":3,"judged":4,"stale":5,"removes_confirmed":6,"removes_by_grace":7},{"kind":"process_madvise","expected":true,"skipped":"process_madvise (ENOSYS)","exercised":false,"changes":1,"attempts":2,"racing":3,"judged":4,"stale":5,"removes_confirmed":6,"removes_by_grace":7},{"kind":"io_uring_madvise","expected":false,"skipped":null,"exercised":true,"changes":1,"attempts":2,"racing":3,"judged":4,"stale":5,"removes_confirmed":6,"removes_by_grace":7}]},"summary":{"exit_status":1,"expected":3,"detected":1,"failed":["madv-dontneed"],"inconclusive":["partial-overlap"],"missed_as_expected":["mremap-move"]}}"#;
}

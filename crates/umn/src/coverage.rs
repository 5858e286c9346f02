//! `umn coverage`: every change kind against the notifier, each in a child process, judged by
//! the PFN oracle and the io_uring device view (see `ummunotify_testkit::changes`).
use std::io;
use std::process::Command;

use ummunotify::{Cookie, Notifier};
use ummunotify_testkit::changes::{
    json_string, print_child_report, run_case, run_in_child, CaseReport, ChangeKind,
};

use crate::watch::NotifierWatcher;

/// The hidden subcommand a child runs.
pub const CHILD_SUBCOMMAND: &str = "__coverage-case";

/// Runs `kind` in this process against a fresh notifier and prints the report line for the
/// parent. Used by the child side of [`run_all`].
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
    /// The report, or why the case could not run.
    pub report: io::Result<CaseReport>,
}

impl Row {
    /// Detected as the catalogue expects (for an untouched neighbour: correctly silent).
    pub fn detected(&self) -> bool {
        self.report.as_ref().is_ok_and(|r| r.detected)
    }
    /// Checks that passed although memory had changed.
    pub fn stale_uses(&self) -> u32 {
        self.report.as_ref().map_or(0, |r| r.stale_uses)
    }
    /// Whether the case passed every assertion of the catalogue.
    pub fn passed(&self) -> bool {
        self.report.as_ref().is_ok_and(|r| r.passed())
    }
}

/// Runs every kind, each in a child process started as `exe CHILD_SUBCOMMAND`.
pub fn run_all(exe: &std::path::Path) -> Vec<Row> {
    ChangeKind::ALL
        .iter()
        .map(|&kind| {
            let mut cmd = Command::new(exe);
            cmd.arg(CHILD_SUBCOMMAND);
            Row {
                kind,
                report: run_in_child(kind, cmd),
            }
        })
        .collect()
}

/// The `--json` form: `{"backend": ..., "cases": [{"kind", "detected", "stale_uses", ...}]}`.
pub fn to_json(backend: &str, rows: &[Row]) -> String {
    let cases: Vec<String> = rows
        .iter()
        .map(|r| {
            let problems = match &r.report {
                Ok(rep) => rep.problems.clone(),
                Err(e) => vec![e.to_string()],
            };
            let problems: Vec<String> = problems.iter().map(|p| json_string(p)).collect();
            format!(
                "{{\"kind\":{},\"detected\":{},\"stale_uses\":{},\"passed\":{},\"problems\":[{}]}}",
                json_string(r.kind.name()),
                r.detected(),
                r.stale_uses(),
                r.passed(),
                problems.join(",")
            )
        })
        .collect();
    format!(
        "{{\"backend\":{},\"cases\":[{}]}}",
        json_string(backend),
        cases.join(",")
    )
}

/// The human form: a table.
pub fn to_table(backend: &str, rows: &[Row]) -> String {
    let mut out = format!(
        "backend: {backend}\n{:<22} {:<9} {:<11} notes\n",
        "kind", "detected", "stale uses"
    );
    for r in rows {
        let note = match &r.report {
            Ok(rep) if rep.passed() => rep.notes.join("; "),
            Ok(rep) => rep.problems.join("; "),
            Err(e) => format!("could not run: {e}"),
        };
        out.push_str(&format!(
            "{:<22} {:<9} {:<11} {}\n",
            r.kind.name(),
            if r.detected() { "yes" } else { "NO" },
            r.stale_uses(),
            note
        ));
    }
    out
}

//! Running a case in a process of its own (required for [`ChangeKind::BrkShrink`]).
//!
//! The parent runs some program (typically its own test binary, filtered to one test) with
//! [`CHILD_CASE_ENV`] naming the case; the child notices via [`child_case_from_env`], builds its
//! own watcher, calls [`super::run_case`] and prints the result with [`print_child_report`]; the
//! parent parses the line. A test binary does it like this:
//!
//! ```no_run
//! use ummunotify_testkit::changes::*;
//!
//! // #[test]
//! fn child_entry() {
//!     if let Some(kind) = child_case_from_env() {
//!         print_child_report(&run_case(kind, &mut NaiveWatcher::new()));
//!     }
//! }
//!
//! // #[test]
//! fn brk_shrink() {
//!     let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
//!     cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"]);
//!     let report = run_in_child(ChangeKind::BrkShrink, cmd).unwrap();
//!     assert_eq!(report.oracle_changed, Some(true));
//! }
//! ```

use std::io;
use std::process::{Command, Stdio};

use super::json::{case_json, parse_case_json};
use super::{CaseReport, ChangeKind};
use crate::pagemap::{is_pfn_unavailable, PfnUnavailable};
use crate::require::{missing_feature, MissingFeature};

/// Environment variable naming (by [`ChangeKind::name`]) the case a child process must run.
pub const CHILD_CASE_ENV: &str = "UMN_TESTKIT_CASE";
/// Environment variable (`1`) declaring that this process runs nothing but one case, which
/// [`super::run_case`] requires for kinds with [`ChangeKind::needs_own_process`].
pub const OWN_PROCESS_ENV: &str = "UMN_TESTKIT_OWN_PROCESS";
/// Prefix of the stdout line carrying a child's report as JSON.
pub const REPORT_PREFIX: &str = "UMN-CASE-REPORT ";
/// Prefix of the stdout line carrying a child's error.
const ERROR_PREFIX: &str = "UMN-CASE-ERROR ";

/// Whether this process declared itself dedicated to one case.
pub(super) fn in_own_process() -> bool {
    std::env::var_os(OWN_PROCESS_ENV).is_some_and(|v| v == "1")
}

/// The case this process was started to run, if it is such a child.
pub fn child_case_from_env() -> Option<ChangeKind> {
    ChangeKind::from_name(&std::env::var(CHILD_CASE_ENV).ok()?)
}

/// Prints the outcome of [`super::run_case`] as one line on stdout for [`run_in_child`].
pub fn print_child_report(result: &io::Result<CaseReport>) {
    match result {
        Ok(report) => println!("{REPORT_PREFIX}{}", case_json(report)),
        Err(e) => {
            let tag = match missing_feature(e) {
                Some(m) => format!("missing={}", m.feature()),
                None if is_pfn_unavailable(e) => "pfn-unavailable".to_owned(),
                None => "other".to_owned(),
            };
            let msg = e.to_string().replace('\n', " ");
            println!("{ERROR_PREFIX}{tag}\t{msg}");
        }
    }
}

/// Runs `kind` in the process `cmd` starts (which must call [`print_child_report`] when
/// [`child_case_from_env`] names a case) and returns the report it printed.
///
/// Sets [`CHILD_CASE_ENV`] and [`OWN_PROCESS_ENV`] on `cmd`.
///
/// # Errors
///
/// The child's error (a [`MissingFeature`] or [`PfnUnavailable`] is rebuilt as such), or
/// `Other` if the child printed no report (its exit status and stderr are in the message).
pub fn run_in_child(kind: ChangeKind, mut cmd: Command) -> io::Result<CaseReport> {
    let out = cmd
        .env(CHILD_CASE_ENV, kind.name())
        .env(OWN_PROCESS_ENV, "1")
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        // The marker need not start the line: a test harness may print its own text first.
        if let Some(at) = line.find(REPORT_PREFIX) {
            return parse_case_json(&line[at + REPORT_PREFIX.len()..]);
        }
        if let Some(at) = line.find(ERROR_PREFIX) {
            let err = &line[at + ERROR_PREFIX.len()..];
            let (tag, msg) = err.split_once('\t').unwrap_or((err, ""));
            return Err(if let Some(feature) = tag.strip_prefix("missing=") {
                MissingFeature::error(feature, io::Error::other(msg.to_owned()))
            } else if tag == "pfn-unavailable" {
                io::Error::new(io::ErrorKind::PermissionDenied, PfnUnavailable)
            } else {
                io::Error::other(format!("{kind} in child: {msg}"))
            });
        }
    }
    Err(io::Error::other(format!(
        "{kind} in child printed no report ({}); stdout: {stdout}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    )))
}

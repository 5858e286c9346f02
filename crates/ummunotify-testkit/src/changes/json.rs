//! [`CaseReport`] as JSON (through serde), so a child process can hand its report over and
//! `umn coverage --json` can print it.
//!
//! Shape: `{"kind":"libc-munmap","detected":false,"expected":true,"stale_uses":2,
//! "inconclusive":false,"reason":null,"oracle":"pfn+device","expected_event":true,
//! "events":[{"start":4096,"end":8192,"hint":true}],"counter_moved":false,"oracle_changed":true,
//! "device_bytes_stale":true,"pinned":true,"problems":["…"],"notes":[]}`. `detected` is `null`
//! for an inconclusive case; `oracle_changed` is `null` where PFNs are hidden. The field order is
//! [`CaseJson`]'s: CI and `kernel/compare.py` read these objects, so it does not change.

use std::io;

use serde::{Deserialize, Serialize};

use super::{CaseReport, ChangeKind};

/// A [`CaseReport`] in its JSON form (the fields in the order printed).
///
/// Serialize it inside a larger document (as `umn coverage --json` does); [`case_json`] and
/// [`parse_case_json`] are the one-line forms.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseJson {
    kind: String,
    /// A verdict only for a case that ran: `null` when inconclusive.
    detected: Option<bool>,
    expected: bool,
    stale_uses: u32,
    inconclusive: bool,
    reason: Option<String>,
    oracle: String,
    expected_event: bool,
    events: Vec<EventJson>,
    counter_moved: bool,
    oracle_changed: Option<bool>,
    device_bytes_stale: Option<bool>,
    pinned: bool,
    problems: Vec<String>,
    notes: Vec<String>,
}

/// One event a watcher reported: its range and whether it carried a range hint.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct EventJson {
    start: usize,
    end: usize,
    hint: bool,
}

impl From<&CaseReport> for CaseJson {
    fn from(report: &CaseReport) -> CaseJson {
        CaseJson {
            kind: report.kind.name().to_owned(),
            detected: match report.inconclusive {
                Some(_) => None,
                None => Some(report.detected),
            },
            expected: report.expected,
            stale_uses: report.stale_uses,
            inconclusive: report.inconclusive.is_some(),
            reason: report.inconclusive.clone(),
            oracle: report.oracle.clone(),
            expected_event: report.expected_event,
            events: report
                .events
                .iter()
                .map(|(range, hint)| EventJson {
                    start: range.start,
                    end: range.end,
                    hint: *hint,
                })
                .collect(),
            counter_moved: report.counter_moved,
            oracle_changed: report.oracle_changed,
            device_bytes_stale: report.device_bytes_stale,
            pinned: report.pinned,
            problems: report.problems.clone(),
            notes: report.notes.clone(),
        }
    }
}

impl TryFrom<CaseJson> for CaseReport {
    type Error = io::Error;

    fn try_from(j: CaseJson) -> io::Result<CaseReport> {
        let kind = ChangeKind::from_name(&j.kind).ok_or_else(|| bad("unknown kind"))?;
        let inconclusive = match (j.inconclusive, j.reason) {
            (true, Some(reason)) => Some(reason),
            (false, None) => None,
            _ => return Err(bad("inconclusive and reason disagree")),
        };
        Ok(CaseReport {
            kind,
            detected: j.detected.unwrap_or(false),
            expected: j.expected,
            inconclusive,
            oracle: j.oracle,
            stale_uses: j.stale_uses,
            expected_event: j.expected_event,
            events: j.events.iter().map(|e| (e.start..e.end, e.hint)).collect(),
            counter_moved: j.counter_moved,
            oracle_changed: j.oracle_changed,
            device_bytes_stale: j.device_bytes_stale,
            pinned: j.pinned,
            problems: j.problems,
            notes: j.notes,
        })
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("case JSON: {what}"))
}

/// `report` as one line of JSON.
pub fn case_json(report: &CaseReport) -> String {
    // A struct of strings, integers, booleans and vectors of them: serializing it can not fail.
    serde_json::to_string(&CaseJson::from(report)).expect("CaseJson serializes")
}

/// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
pub fn quote(text: &str) -> String {
    serde_json::to_string(text).expect("a str serializes")
}

/// Parses what [`case_json`] produced.
///
/// # Errors
///
/// `InvalidData` naming what is malformed or missing.
pub fn parse_case_json(text: &str) -> io::Result<CaseReport> {
    let j: CaseJson = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    CaseReport::try_from(j)
}

#[cfg(test)]
mod tests {
    #[test]
    fn quote_escapes() {
        assert_eq!(super::quote("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(super::quote("\r\t"), "\"\\r\\t\"");
    }

    #[test]
    fn malformed_is_named() {
        let e = super::parse_case_json("{\"kind\":\"libc-munmap\"}").unwrap_err();
        assert!(e.to_string().contains("missing field"), "{e}");
        let e = super::parse_case_json("{\"kind\":\"no-such-kind\"").unwrap_err();
        assert!(e.to_string().starts_with("case JSON: "), "{e}");
    }
}

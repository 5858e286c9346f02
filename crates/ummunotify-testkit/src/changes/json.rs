//! [`CaseReport`] as JSON, hand-written (no serde), so a child process can hand its report over.
//!
//! Shape: `{"kind":"libc-munmap","detected":false,"expected":true,"stale_uses":2,
//! "inconclusive":false,"reason":null,"oracle":"pfn+device","expected_event":true,
//! "events":[{"start":4096,"end":8192,"hint":true}],"counter_moved":false,"oracle_changed":true,
//! "device_bytes_stale":true,"pinned":true,"problems":["…"],"notes":[]}`. `detected` is `null`
//! for an inconclusive case; `oracle_changed` is `null` where PFNs are hidden.

use std::fmt::Write as _;
use std::io;

use super::{CaseReport, ChangeKind};

/// `report` as one line of JSON.
pub fn case_json(report: &CaseReport) -> String {
    let mut s = String::new();
    let opt = |b: Option<bool>| b.map_or("null".to_owned(), |b| b.to_string());
    // `detected` is a verdict only for a case that ran.
    let detected = match report.inconclusive {
        Some(_) => "null".to_owned(),
        None => report.detected.to_string(),
    };
    let reason = report
        .inconclusive
        .as_deref()
        .map_or("null".to_owned(), quote);
    let _ = write!(
        s,
        "{{\"kind\":{},\"detected\":{detected},\"expected\":{},\"stale_uses\":{},\
         \"inconclusive\":{},\"reason\":{reason},\"oracle\":{},\"expected_event\":{},\"events\":[",
        quote(report.kind.name()),
        report.expected,
        report.stale_uses,
        report.inconclusive.is_some(),
        quote(&report.oracle),
        report.expected_event
    );
    for (i, (range, hint)) in report.events.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            s,
            "{sep}{{\"start\":{},\"end\":{},\"hint\":{hint}}}",
            range.start, range.end
        );
    }
    let _ = write!(
        s,
        "],\"counter_moved\":{},\"oracle_changed\":{},\"device_bytes_stale\":{},\"pinned\":{},\
         \"problems\":{},\"notes\":{}}}",
        report.counter_moved,
        opt(report.oracle_changed),
        opt(report.device_bytes_stale),
        report.pinned,
        strings(&report.problems),
        strings(&report.notes)
    );
    s
}

fn strings(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| quote(i)).collect();
    format!("[{}]", quoted.join(","))
}

/// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
pub fn quote(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Parses what [`case_json`] produced.
///
/// # Errors
///
/// `InvalidData` naming what is malformed or missing.
pub fn parse_case_json(text: &str) -> io::Result<CaseReport> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("case JSON: {what}"));
    let mut p = Parser { text, pos: 0 };
    let value = p.value().map_err(|e| bad(&e))?;
    p.skip_ws();
    if p.pos != text.len() {
        return Err(bad("trailing characters"));
    }
    let Value::Obj(fields) = value else {
        return Err(bad("not an object"));
    };
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| bad(&format!("missing {key}")))
    };
    let boolean = |key: &str| match get(key)? {
        Value::Bool(b) => Ok(*b),
        _ => Err(bad(&format!("{key} is not a boolean"))),
    };
    let number = |v: &Value, key: &str| match v {
        Value::Num(n) => Ok(*n),
        _ => Err(bad(&format!("{key} is not a number"))),
    };
    let string_list = |key: &str| match get(key)? {
        Value::Arr(items) => items
            .iter()
            .map(|v| match v {
                Value::Str(s) => Ok(s.clone()),
                _ => Err(bad(&format!("{key} holds a non-string"))),
            })
            .collect::<io::Result<Vec<_>>>(),
        _ => Err(bad(&format!("{key} is not an array"))),
    };
    let kind = match get("kind")? {
        Value::Str(name) => ChangeKind::from_name(name).ok_or_else(|| bad("unknown kind"))?,
        _ => return Err(bad("kind is not a string")),
    };
    let Value::Arr(raw_events) = get("events")? else {
        return Err(bad("events is not an array"));
    };
    let mut events = Vec::with_capacity(raw_events.len());
    for ev in raw_events {
        let Value::Obj(f) = ev else {
            return Err(bad("event is not an object"));
        };
        let field = |key: &str| {
            f.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .ok_or_else(|| bad(&format!("event misses {key}")))
        };
        let start = usize::try_from(number(field("start")?, "start")?).map_err(|_| bad("start"))?;
        let end = usize::try_from(number(field("end")?, "end")?).map_err(|_| bad("end"))?;
        let Value::Bool(hint) = field("hint")? else {
            return Err(bad("hint is not a boolean"));
        };
        events.push((start..end, *hint));
    }
    let maybe = |key: &str| match get(key)? {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        _ => Err(bad(&format!("{key} is not a boolean or null"))),
    };
    let inconclusive = match get("reason")? {
        Value::Str(r) if boolean("inconclusive")? => Some(r.clone()),
        Value::Null if !boolean("inconclusive")? => None,
        _ => return Err(bad("inconclusive and reason disagree")),
    };
    let oracle = match get("oracle")? {
        Value::Str(o) => o.clone(),
        _ => return Err(bad("oracle is not a string")),
    };
    Ok(CaseReport {
        kind,
        detected: maybe("detected")?.unwrap_or(false),
        expected: boolean("expected")?,
        inconclusive,
        oracle,
        stale_uses: u32::try_from(number(get("stale_uses")?, "stale_uses")?)
            .map_err(|_| bad("stale_uses out of range"))?,
        expected_event: boolean("expected_event")?,
        events,
        counter_moved: boolean("counter_moved")?,
        oracle_changed: maybe("oracle_changed")?,
        device_bytes_stale: maybe("device_bytes_stale")?,
        pinned: boolean("pinned")?,
        problems: string_list("problems")?,
        notes: string_list("notes")?,
    })
}

/// The JSON values [`case_json`] emits (numbers are non-negative integers).
enum Value {
    Null,
    Bool(bool),
    Num(u64),
    Str(String),
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        let rest = &self.text[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.text[self.pos..].starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &str) -> Result<(), String> {
        self.skip_ws();
        if self.eat(token) {
            Ok(())
        } else {
            Err(format!("expected {token:?} at byte {}", self.pos))
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        self.skip_ws();
        match self.peek() {
            Some(b'n') if self.eat("null") => Ok(Value::Null),
            Some(b't') if self.eat("true") => Ok(Value::Bool(true)),
            Some(b'f') if self.eat("false") => Ok(Value::Bool(false)),
            Some(b'"') => self.string().map(Value::Str),
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_ws();
                if self.eat("]") {
                    return Ok(Value::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.skip_ws();
                    if self.eat("]") {
                        return Ok(Value::Arr(items));
                    }
                    self.expect(",")?;
                }
            }
            Some(b'{') => {
                self.pos += 1;
                let mut fields = Vec::new();
                self.skip_ws();
                if self.eat("}") {
                    return Ok(Value::Obj(fields));
                }
                loop {
                    self.skip_ws();
                    let key = self.string()?;
                    self.expect(":")?;
                    fields.push((key, self.value()?));
                    self.skip_ws();
                    if self.eat("}") {
                        return Ok(Value::Obj(fields));
                    }
                    self.expect(",")?;
                }
            }
            Some(b'0'..=b'9') => {
                let rest = &self.text[self.pos..];
                let len = rest.bytes().take_while(u8::is_ascii_digit).count();
                self.pos += len;
                rest[..len]
                    .parse()
                    .map(Value::Num)
                    .map_err(|e| format!("bad number: {e}"))
            }
            _ => Err(format!("unexpected input at byte {}", self.pos)),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if !self.eat("\"") {
            return Err(format!("expected a string at byte {}", self.pos));
        }
        let mut out = String::new();
        let mut chars = self.text[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next().map(|(_, e)| e) {
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('/') => out.push('/'),
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    Some('u') => {
                        let hex: String = (0..4)
                            .filter_map(|_| chars.next().map(|(_, h)| h))
                            .collect();
                        let code = u32::from_str_radix(&hex, 16).map_err(|e| e.to_string())?;
                        out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                    _ => return Err("bad escape".into()),
                },
                c => out.push(c),
            }
        }
        Err("unterminated string".into())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quote_escapes() {
        assert_eq!(super::quote("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(super::quote("\r\t"), "\"\\r\\t\"");
    }
}

//! The JSON of `umn bench --json` and `umn bench --backends --json`: `{"results": [` then one
//! row object per line, `]}`, written through serde with the layout these outputs always had.
//!
//! The layout is an interface: CI greps `"backend": "uffd", "name": "munmap_registered_4k_cold"`
//! (a space after each `:` and `,`), docs/DESIGNS.md quotes rows, and numbers keep a fixed number
//! of decimals ([`fixed2`], [`fixed3`]). serde_json's compact and pretty formatters give neither,
//! so [`RowsFormatter`] writes it.
use std::io;

use serde::Serialize;
use serde_json::ser::Formatter;
use serde_json::value::RawValue;

/// `{"results": [rows...]}` in the rows layout.
pub fn results<T: Serialize>(rows: &[T]) -> String {
    #[derive(Serialize)]
    struct Results<'a, T> {
        results: &'a [T],
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, RowsFormatter::default());
    // Rows are strings and numbers written to memory: serializing them can not fail.
    Results { results: rows }
        .serialize(&mut ser)
        .expect("rows serialize");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// `v` with `decimals` digits after the point; `null` for a NaN or an infinity (which JSON has
/// no literal for: a zero baseline's ratio).
fn fixed<S: serde::Serializer>(v: f64, decimals: usize, s: S) -> Result<S::Ok, S::Error> {
    if !v.is_finite() {
        return s.serialize_none();
    }
    RawValue::from_string(format!("{v:.decimals$}"))
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

/// A number with two decimals (`serialize_with`).
pub fn fixed2<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    fixed(*v, 2, s)
}

/// A number with three decimals (`serialize_with`).
pub fn fixed3<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    fixed(*v, 3, s)
}

/// `": "` after a key, `", "` between members; the outer object's array gets one element per
/// line, indented by two spaces (an empty one keeps its blank line, as it always had).
#[derive(Default)]
pub struct RowsFormatter {
    /// Objects and arrays open around the next token.
    depth: usize,
}

impl RowsFormatter {
    /// The array of the outermost object (`"results"`): one element per line.
    fn in_results(&self) -> bool {
        self.depth == 2
    }
}

impl Formatter for RowsFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        w.write_all(if self.in_results() { b"[\n  " } else { b"[" })
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        let results = self.in_results();
        self.depth -= 1;
        w.write_all(if results { b"\n]" } else { b"]" })
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        match (first, self.in_results()) {
            (true, _) => Ok(()),
            (false, true) => w.write_all(b",\n  "),
            (false, false) => w.write_all(b", "),
        }
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth -= 1;
        w.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct R {
        name: &'static str,
        #[serde(serialize_with = "fixed2")]
        v: f64,
        #[serde(serialize_with = "fixed3")]
        r: f64,
    }

    #[test]
    fn layout_and_decimals() {
        let rows = [
            R {
                name: "a",
                v: 1.0,
                r: 2.0 / 3.0,
            },
            R {
                name: "b\"",
                v: f64::INFINITY,
                r: f64::NAN,
            },
        ];
        assert_eq!(
            results(&rows),
            "{\"results\": [\n  {\"name\": \"a\", \"v\": 1.00, \"r\": 0.667},\n  \
             {\"name\": \"b\\\"\", \"v\": null, \"r\": null}\n]}"
        );
        let none: [R; 0] = [];
        assert_eq!(results(&none), "{\"results\": [\n  \n]}");
    }
}

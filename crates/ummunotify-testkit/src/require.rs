//! Missing kernel features: a typed error, and the SKIP-or-fail policy of the real-kernel tests.

use std::fmt;
use std::io;

/// Environment variable that turns every SKIP into a failure when set to `1`.
pub const REQUIRE_ALL_ENV: &str = "UMN_REQUIRE_ALL";

/// A kernel feature this crate needs is not available (not compiled in, disabled, or too old).
///
/// It travels inside an [`io::Error`] of kind [`io::ErrorKind::Unsupported`]; recover it with
/// [`missing_feature`].
#[derive(Debug)]
pub struct MissingFeature {
    feature: String,
    source: io::Error,
}

impl MissingFeature {
    /// Wraps the OS error `source` that showed `feature` is missing into an [`io::Error`].
    pub fn error(feature: impl Into<String>, source: io::Error) -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            MissingFeature {
                feature: feature.into(),
                source,
            },
        )
    }

    /// The name of the missing feature, e.g. `"io_uring"` or `"MREMAP_DONTUNMAP"`.
    pub fn feature(&self) -> &str {
        &self.feature
    }
}

impl fmt::Display for MissingFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel feature missing: {} ({})",
            self.feature, self.source
        )
    }
}

impl std::error::Error for MissingFeature {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The [`MissingFeature`] inside `err`, if `err` reports one.
pub fn missing_feature(err: &io::Error) -> Option<&MissingFeature> {
    err.get_ref()?.downcast_ref::<MissingFeature>()
}

/// Whether `UMN_REQUIRE_ALL=1` is set, i.e. whether a missing feature must fail the test.
pub fn require_all() -> bool {
    std::env::var_os(REQUIRE_ALL_ENV).is_some_and(|v| v == "1")
}

/// Reports that `test` could not run because `what` is missing.
///
/// Prints a loud `SKIP` line on stderr, or panics when [`require_all`] is true.
///
/// # Panics
///
/// When `UMN_REQUIRE_ALL=1`.
pub fn skip_or_fail(test: &str, what: &str) {
    if require_all() {
        panic!("{test}: required but missing: {what} ({REQUIRE_ALL_ENV}=1)");
    }
    eprintln!(
        "**************** SKIP {test}: missing {what} (set {REQUIRE_ALL_ENV}=1 to fail instead)"
    );
}

/// The value of a real-kernel step, or `None` after a loud skip (a failure under
/// `UMN_REQUIRE_ALL=1`) when the error says a kernel feature or the PFN oracle is missing; any
/// other error panics, naming `test`.
pub fn or_skip<T>(test: &str, r: io::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            if let Some(m) = missing_feature(&e) {
                skip_or_fail(test, &m.to_string());
            } else if crate::pagemap::is_pfn_unavailable(&e) {
                skip_or_fail(test, "real PFNs in /proc/self/pagemap (run as root)");
            } else {
                panic!("{test}: {e}");
            }
            None
        }
    }
}

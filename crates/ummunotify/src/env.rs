//! The library's environment variables (`UMN_BACKEND`, `UMN_SIGNAL`, `UMN_EBPF_SOCKET`), read
//! the way glibc's `secure_getenv` reads them: not at all in secure-execution mode
//! (`AT_SECURE`: a setuid, setgid or file-capability program), so that a user who starts a
//! privileged program that links the library can not point it at another daemon, signal or
//! backend (docs/SECURITY.md). Compiled in every configuration (the loom model's too).
#![allow(unsafe_code)] // getauxval.

use std::ffi::OsString;

/// The environment variable `name`, or `None` when it is unset or the process runs in
/// secure-execution mode.
///
/// # References
/// `getauxval(3)`, `secure_getenv(3)`.
pub(crate) fn var(name: &str) -> Option<OsString> {
    // SAFETY: getauxval has no preconditions.
    if unsafe { libc::getauxval(libc::AT_SECURE) } != 0 {
        return None;
    }
    std::env::var_os(name)
}

//! Building and running the C programs of the C crates' tests (`ummunotify-capi`,
//! `ummunotify-compat`): one place for the cargo build of a cdylib/staticlib crate, the gcc
//! invocation with the project's warning flags, and the exit-code verdict (0 passes, 77 is a
//! missing kernel feature, anything else fails).
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::require::skip_or_fail;

/// Builds the library of `package` (whose manifest is in `manifest_dir`) into the target
/// directory and profile of the running test binary, and returns that profile directory.
///
/// Cargo does not rebuild a crate that is only a cdylib/staticlib before running its integration
/// tests, so its tests call this first.
///
/// # Panics
/// If the test binary is not in `<target>/<profile>/deps`, or the build fails.
pub fn build_lib(package: &str, manifest_dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary in <target>/<profile>/deps");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", package, "--lib"])
        .arg("--target-dir")
        .arg(dir.parent().expect("<target>/<profile>"))
        .current_dir(manifest_dir);
    if dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("run cargo build");
    assert!(st.success(), "cargo build -p {package} failed");
    dir.to_path_buf()
}

/// Compiles `source` into `out` with `gcc -std=gnu11 -Wall -Wextra -Werror -g -pthread`, then
/// `extra` (after the source, where link inputs such as `-l` and `.a` files must be).
///
/// # Panics
/// If gcc is missing or fails (its stderr is in the message).
pub fn gcc<S: AsRef<OsStr>>(source: &Path, out: &Path, extra: impl IntoIterator<Item = S>) {
    let mut cmd = Command::new("gcc");
    cmd.args([
        "-std=gnu11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
        "-pthread",
    ])
    .arg(source)
    .arg("-o")
    .arg(out)
    .args(extra);
    let res = cmd.output().expect("run gcc (apt-get install gcc)");
    assert!(
        res.status.success(),
        "gcc failed: {cmd:?}\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
}

/// Runs `exe` with `envs` under `timeout -k 5 <secs>` (a hang fails instead of stalling CI).
/// Returns true when it passed, false when it exited 77 (a missing feature: a loud SKIP, or a
/// panic under `UMN_REQUIRE_ALL=1`).
///
/// # Panics
/// On any other exit, with the program's stdout and stderr.
pub fn run(exe: &Path, timeout_secs: u32, envs: &[(&str, &str)]) -> bool {
    let out = Command::new("timeout")
        .args(["-k", "5", &timeout_secs.to_string()])
        .arg(exe)
        .envs(envs.iter().copied())
        .output()
        .expect("run test program (timeout is in coreutils)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            print!("{stdout}");
            true
        }
        Some(77) => {
            skip_or_fail(&exe.display().to_string(), stdout.trim());
            false
        }
        _ => panic!(
            "{} failed ({envs:?}): {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            exe.display(),
            out.status
        ),
    }
}

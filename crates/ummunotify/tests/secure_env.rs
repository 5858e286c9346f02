//! A privileged program that links the library ignores the library's environment variables
//! (docs/SECURITY.md, "The host program itself"): run setuid-root by `nobody` with
//! `UMN_BACKEND=bogus`, the library picks its default backend as if the variable were unset;
//! the same binary without the setuid bit, run by the same user, refuses the variable.
//!
//! The attacker is real: an unprivileged user who starts a setuid program with an environment
//! of their choosing (the same variables name a daemon socket, a signal and a library to load).

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const ROLE: &str = "UMN_SECURE_ENV_ROLE";

/// The child: reports what the library made of `UMN_BACKEND`, and whether the kernel ran it in
/// secure-execution mode. Does nothing unless started by [`setuid_programs_ignore_the_library_environment`].
#[test]
fn secure_env_child_role() {
    if std::env::var(ROLE).as_deref() != Ok("child") {
        return;
    }
    // SAFETY: getauxval has no preconditions.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    let backend = match ummunotify::Backend::from_env() {
        Ok(b) => format!("ok {b}"),
        Err(e) => format!("err {e}"),
    };
    println!("secure={secure} backend={backend}");
}

fn run_as_nobody(exe: &std::path::Path) -> String {
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(exe)
        .args([
            "--exact",
            "secure_env_child_role",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "child")
        .env("UMN_BACKEND", "bogus")
        .output()
        .expect("runuser");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints the test's name on the same line as the report.
    text.lines()
        .find_map(|l| l.find("secure=").map(|i| l[i..].to_string()))
        .unwrap_or_else(|| panic!("no report from the child: {text}"))
}

#[test]
fn setuid_programs_ignore_the_library_environment() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("runuser").arg("--help").output().is_err() {
        ummunotify_testkit::require::skip_or_fail(
            "secure_env",
            "root and runuser (to make a setuid-root copy and run it as nobody)",
        );
        return;
    }
    let dir = tempdir();
    let exe = dir.join("secure_env");
    std::fs::copy(std::env::current_exe().expect("current_exe"), &exe).expect("copy the test");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");

    // Without the setuid bit: an ordinary process, the variable is read and refused.
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
    let plain = run_as_nobody(&exe);
    assert!(
        plain.starts_with("secure=false backend=err") && plain.contains("bogus"),
        "an ordinary process must read UMN_BACKEND: {plain}"
    );

    // Setuid root: secure-execution mode, the variable is not read.
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).expect("chmod 4755");
    let setuid = run_as_nobody(&exe);
    let _ = std::fs::remove_dir_all(&dir);
    if setuid.starts_with("secure=false") {
        // A nosuid mount (the temporary directory's) or a no_new_privs parent.
        ummunotify_testkit::require::skip_or_fail(
            "secure_env",
            "a filesystem that honours the setuid bit for the temporary directory",
        );
        return;
    }
    assert_eq!(
        setuid, "secure=true backend=ok auto",
        "a setuid program must not read UMN_BACKEND"
    );
}

fn tempdir() -> std::path::PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("secure-env-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

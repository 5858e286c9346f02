//! The command line as a user meets it: `--version`, `--help` per command, an error that names
//! the bad argument (exit 2), completions and man pages. Needs no privilege and no kernel feature.
use std::process::{Command, Output};

fn umn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_umn"))
        .args(args)
        .env_remove("UMN_EBPF_SOCKET")
        // Help wraps at the terminal's width (COLUMNS when not a terminal): a fixed one.
        .env("COLUMNS", "100")
        .output()
        .expect("run umn")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_answers() {
    for args in [&["--version"][..], &["-V"], &["coverage", "--version"]] {
        let o = umn(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        // `umn coverage --version` says `umn-coverage 0.1.0`.
        let text = stdout(&o);
        assert!(text.starts_with("umn"), "{args:?}: {text}");
        assert!(
            text.trim_end()
                .ends_with(&format!(" {}", env!("CARGO_PKG_VERSION"))),
            "{args:?}: {text}"
        );
    }
}

#[test]
fn every_command_has_its_own_help() {
    let cases: &[(&str, &[&str])] = &[
        ("doctor", &["backends"]),
        ("coverage", &["--json", "--backend", "uffd", "Exit status"]),
        (
            "daemon",
            &["--socket", "UMN_EBPF_SOCKET", "/run/ummunotify/ebpf.sock"],
        ),
        ("demo", &["x == y"]),
        ("designs", &["--cycles", "--storm"]),
        (
            "bench",
            &[
                "--json",
                "--quick",
                "--ebpf",
                "--miss",
                "--backends",
                "--svg",
            ],
        ),
        ("completions", &["bash", "zsh", "fish"]),
        ("man", &["--dir"]),
    ];
    for (cmd, words) in cases {
        let o = umn(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd} --help: {}", stderr(&o));
        let text = stdout(&o);
        assert!(
            text.contains(&format!("Usage: umn {cmd}")),
            "{cmd} --help is not its own:\n{text}"
        );
        for w in *words {
            assert!(text.contains(w), "{cmd} --help lacks {w:?}:\n{text}");
        }
        // `umn help CMD` is the same text.
        assert_eq!(stdout(&umn(&["help", cmd])), text, "umn help {cmd}");
    }
    let top = stdout(&umn(&["--help"]));
    for (cmd, _) in cases {
        assert!(top.contains(cmd), "umn --help lacks {cmd}");
    }
    // The children coverage and bench start are not for users.
    assert!(!top.contains("__"), "{top}");
}

#[test]
fn errors_name_the_bad_argument() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["bogus"], &["unrecognized subcommand", "'bogus'"]),
        (
            &["coverage", "--bogus"],
            &["'--bogus'", "Usage: umn coverage"],
        ),
        (
            &["coverage", "--backend", "nope"],
            &["'nope'", "--backend", "uffd"],
        ),
        (&["coverage", "--backend"], &["--backend"]),
        (&["designs", "--cycles", "many"], &["'many'", "--cycles"]),
        (&["bench", "--svg", "plot.svg"], &["--backends"]),
        (&["bench", "--miss", "--ebpf"], &["--miss", "--ebpf"]),
        (&["daemon", "--socket"], &["--socket"]),
        (&["completions", "tcsh"], &["'tcsh'"]),
        (&["doctor", "extra"], &["'extra'"]),
    ];
    for (args, words) in cases {
        let o = umn(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        for w in *words {
            assert!(err.contains(w), "{args:?}: error lacks {w:?}:\n{err}");
        }
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
    // No command at all: the help, on stderr, and the usage status.
    let o = umn(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("Usage: umn <COMMAND>"));
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = umn(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        // (fish spells a long option `-l backend`.)
        for w in ["coverage", "backend", "socket", "backends", "completions"] {
            assert!(script.contains(w), "{shell} completions lack {w}");
        }
        assert!(
            !script.contains("coverage-case"),
            "{shell}: a hidden command"
        );
    }
}

#[test]
fn man_pages_for_every_command() {
    let o = umn(&["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.contains(".TH umn 1"), "{page}");
    assert!(page.contains("umn\\-coverage(1)"), "{page}");

    let dir = std::env::temp_dir().join(format!("umn-man-{}", std::process::id()));
    let o = umn(&["man", "--dir", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for cmd in [
        "",
        "-doctor",
        "-coverage",
        "-daemon",
        "-demo",
        "-designs",
        "-bench",
        "-man",
    ] {
        let path = dir.join(format!("umn{cmd}.1"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{path:?}");
    }
    let coverage = std::fs::read_to_string(dir.join("umn-coverage.1")).unwrap();
    assert!(coverage.contains("\\-\\-backend"), "{coverage}");
    let hidden = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().contains("__"));
    assert!(!hidden, "a man page for a hidden command");
    std::fs::remove_dir_all(&dir).unwrap();
}

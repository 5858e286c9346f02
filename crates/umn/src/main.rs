//! `umn`: the ummunotify command line.
use std::process::ExitCode;

use umn::{coverage, doctor};

const USAGE: &str = "\
usage: umn <command>

commands:
  doctor             which backends work here, which kernel features exist, what is missing
  coverage [--json]  run every kind of mapping change against the notifier (each in a child
                     process) and report: detected yes/no, stale uses
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["doctor"] => {
            let reports = ummunotify::probe();
            print!("{}", doctor::render(&reports));
            if doctor::any_available(&reports) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        ["coverage", rest @ ..] if rest.iter().all(|a| *a == "--json") => {
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("umn: can not find my own executable: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let rows = coverage::run_all(&exe);
            if rest.is_empty() {
                print!("{}", coverage::to_table("userfaultfd", &rows));
            } else {
                println!("{}", coverage::to_json("userfaultfd", &rows));
            }
            if rows.iter().all(coverage::Row::passed) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        [coverage::CHILD_SUBCOMMAND] => match ummunotify_testkit::changes::child_case_from_env() {
            Some(kind) => {
                coverage::child_main(kind);
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        ["help"] | ["--help"] | ["-h"] => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

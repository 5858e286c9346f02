//! `umn`: the ummunotify command line.
use std::process::ExitCode;

use umn::{coverage, doctor};

mod bench;
mod bench_c;
mod demo;

const USAGE: &str = "\
usage: umn <command>

commands:
  doctor             which backends work here, which kernel features exist, what is missing
  coverage [--json]  run every kind of mapping change against the notifier (each in a child
                     process) and report per kind: detected, expected (can this backend see
                     it at all), stale uses, which oracle judged; exit 0 = all expected kinds
                     detected with no stale use, 1 = a miss, stale use or problem,
                     3 = some case inconclusive (could not run; not a verdict)
  demo               the x == y story with io_uring fixed buffers: a naive cache writes stale
                     bytes, the ummunotify cache does not
  bench [--json]     cache and notifier costs as ratios to baselines measured in the same run
                     (build with --release)
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
            ExitCode::from(coverage::exit_status(&rows))
        }
        [coverage::CHILD_SUBCOMMAND] => match ummunotify_testkit::changes::child_case_from_env() {
            Some(kind) => {
                coverage::child_main(kind);
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        ["demo"] => match demo::run() {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("umn demo: {e}");
                ExitCode::FAILURE
            }
        },
        ["bench", rest @ ..] if rest.iter().all(|a| *a == "--json" || *a == "--quick") => {
            match bench::run(rest.contains(&"--quick")) {
                Ok(rows) => {
                    if rest.contains(&"--json") {
                        println!("{}", bench::to_json(&rows));
                    } else {
                        print!("{}", bench::to_table(&rows));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("umn bench: {e}");
                    ExitCode::FAILURE
                }
            }
        }
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

//! `umn`: the ummunotify command line. The commands and flags are declared in [`cli`].
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use umn::{coverage, doctor, remove_race};

use cli::{BenchArgs, Cli, Command, CoverageArgs, DesignsArgs, ManArgs};

mod backends;
mod bench;
mod bench_c;
mod bench_ebpf;
mod cli;
mod daemon;
mod demo;
mod designs;
mod floors;
mod rows_json;

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Doctor => {
            let reports = ummunotify::probe();
            print!("{}", doctor::render(&reports));
            if doctor::any_available(&reports) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Coverage(args) => run_coverage(&args),
        Command::Daemon(args) => match daemon::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("umn daemon: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Demo => match demo::run() {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("umn demo: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Designs(DesignsArgs { cycles, storm }) => {
            let rows = designs::run(cycles, storm);
            print!("{}", designs::to_table(&rows));
            if rows.is_empty() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Bench(args) if args.backends => run_bench_backends(&args),
        Command::Bench(args) => run_bench(&args),
        Command::Completions { shell } => {
            let mut cmd = cli::completion_command();
            clap_complete::generate(shell, &mut cmd, "umn", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man(args) => run_man(&args),
        Command::NoProcmapQuery { cmd } => {
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let e = umn::no_procmap_query::exec(&cmd);
            eprintln!("umn no-procmap-query: {e}");
            ExitCode::from(2)
        }
        Command::CoverageCase => match ummunotify_testkit::changes::child_case_from_env() {
            Some(kind) => {
                coverage::child_main(kind);
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        Command::RemoveRaceCase => {
            if remove_race::child_main() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::BenchBackend { name, quick } => match backends::child_main(&name, quick) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::GetpidLoop { n, munmap } => {
            backends::getpid_main(n, munmap);
            ExitCode::SUCCESS
        }
    }
}

/// `umn coverage`: the table or the JSON; the exit status says what the run means.
fn run_coverage(args: &CoverageArgs) -> ExitCode {
    let asked = ummunotify::Backend::from(args.backend);
    let exe = match own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let backend = match coverage::resolve(asked) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("umn coverage: backend {asked} can not start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rows = coverage::run_all(&exe, backend);
    let race = remove_race::run(&exe, backend);
    let label = coverage::backend_label(backend);
    if args.json {
        println!("{}", coverage::to_json(label, &rows, &race));
    } else {
        print!("{}", coverage::to_table(label, &rows, &race));
    }
    ExitCode::from(coverage::exit_status(&rows, &race))
}

/// `umn bench --backends`: every backend side by side, each in a child.
fn run_bench_backends(args: &BenchArgs) -> ExitCode {
    let exe = match own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let rows = backends::run(&exe, args.quick);
    if args.json {
        println!("{}", backends::to_json(&rows));
    } else {
        print!("{}", backends::to_table(&rows));
    }
    if let Some(f) = &args.svg {
        if let Err(e) = std::fs::write(f, backends::to_svg(&rows)) {
            eprintln!("umn bench --backends: {}: {e}", f.display());
            return ExitCode::FAILURE;
        }
    }
    if rows.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `umn bench` (and `--ebpf`, `--miss`).
fn run_bench(args: &BenchArgs) -> ExitCode {
    let _extra = bench::ExtraMappings::new(args.mappings);
    let result = if args.ebpf {
        bench_ebpf::rows(if args.quick { 200 } else { 2_000 })
    } else if args.miss {
        bench::miss_rows(if args.quick { 2 } else { 10 })
    } else {
        bench::run(args.quick)
    };
    match result {
        Ok(rows) => {
            if args.json {
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

/// `umn man`: umn.1 on stdout, or every page into a directory.
fn run_man(args: &ManArgs) -> ExitCode {
    let written = match &args.dir {
        Some(dir) => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(Cli::command(), dir)),
        None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("umn man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// This executable (children are started from it).
fn own_exe() -> Result<std::path::PathBuf, ExitCode> {
    std::env::current_exe().map_err(|e| {
        eprintln!("umn: can not find my own executable: {e}");
        ExitCode::FAILURE
    })
}

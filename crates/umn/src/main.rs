//! `umn`: the ummunotify command line.
use std::process::ExitCode;

use umn::{coverage, doctor, remove_race};

mod backends;
mod bench;
mod bench_c;
mod bench_ebpf;
mod demo;
mod designs;
mod floors;

const USAGE: &str = "\
usage: umn <command>

commands:
  doctor             which backends work here, which kernel features exist, what is missing
  coverage [--json] [--backend auto|uffd|hooks|hybrid|ebpf|kernel|perf]
                     run every kind of mapping change against the notifier (each in a child
                     process, on the backend asked for: auto = the /dev/ummunotify module
                     where loaded, else userfaultfd where it starts, else hooks) and report
                     per kind: detected, expected (can this backend see it at all), stale
                     uses, which oracle judged; then the remove-race row:
                     every REMOVE-producing kind racing registrations and re-arms for a
                     moment (stale uses, REMOVEs settled by grace); exit 0 = all expected kinds
                     detected with no stale use, 1 = a miss, stale use or problem,
                     3 = some case inconclusive (could not run; not a verdict)
  daemon [--socket PATH]
                     (root) load the eBPF programs once for this node and hand each process
                     that connects its area over a Unix socket (default
                     /run/ummunotify/ebpf.sock, or UMN_EBPF_SOCKET); runs in the foreground
                     until killed (a systemd unit: docs/umn-daemon.service)
  demo               the x == y story with io_uring fixed buffers: a naive cache writes stale
                     bytes, the ummunotify cache does not
  designs [--cycles N] [--storm N]
                     the designs side by side (kernel module, userfaultfd, hooks): munmap and
                     madvise of a registered and an unregistered page, the check, register +
                     unregister, a storm of N regions, each as a ratio to a baseline measured
                     in the same process just before (TSC ticks; for the guest of kernel/ci.sh)
  bench [--json] [--ebpf | --miss] [--mappings N]
                     cache and notifier costs as ratios to baselines measured in the same run
                     (build with --release); --ebpf: only the eBPF backend's rows (root);
                     --miss: only the cache miss against its kernel floor, 10 rounds, on
                     userfaultfd, then on hybrid (issue 23), each followed by the
                     notifier's registration alone against the same floor;
                     each backend's munmap/madvise costs: bench --backends;
                     --mappings N: N more mappings (VMAs) in the process first (issue 41)
  no-procmap-query [--] CMD [ARGS...]
                     run CMD with the PROCMAP_QUERY ioctl answered ENOTTY by a seccomp filter,
                     as a kernel before 6.11 answers it: the library's fallback paths
  bench --backends [--json] [--svg FILE]
                     every backend that starts here (and UCX 1.22's hooks + rcache) side by
                     side, each against its own baselines, in one run; --svg writes the plot
";

/// `umn daemon`: load, bind, say so on stderr (the journal), serve until killed.
fn daemon(path: &std::path::Path) -> std::io::Result<()> {
    use ummunotify::ebpf::Daemon;
    let d = Daemon::new()?;
    let listener = Daemon::bind(path)?;
    eprintln!(
        "umn daemon: {} tracepoints attached; serving areas on {}",
        d.programs().tracepoints().len(),
        path.display()
    );
    d.serve(listener)
}

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
        ["coverage", rest @ ..] => {
            let mut json = false;
            let mut asked = ummunotify::Backend::Auto;
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match *a {
                    "--json" => json = true,
                    "--backend" => {
                        match it.next().and_then(|b| ummunotify::Backend::from_name(b)) {
                            Some(b) => asked = b,
                            None => {
                                eprint!(
                                    "umn coverage: --backend needs auto, uffd, hooks, hybrid, ebpf, kernel or perf\n{USAGE}"
                                );
                                return ExitCode::from(2);
                            }
                        }
                    }
                    _ => {
                        eprint!("{USAGE}");
                        return ExitCode::from(2);
                    }
                }
            }
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
            if json {
                println!("{}", coverage::to_json(label, &rows, &race));
            } else {
                print!("{}", coverage::to_table(label, &rows, &race));
            }
            ExitCode::from(coverage::exit_status(&rows, &race))
        }
        [coverage::CHILD_SUBCOMMAND] => match ummunotify_testkit::changes::child_case_from_env() {
            Some(kind) => {
                coverage::child_main(kind);
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        [remove_race::CHILD_SUBCOMMAND] => {
            if remove_race::child_main() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        ["daemon", rest @ ..] => {
            let path = match rest {
                [] => std::env::var_os(ummunotify::ebpf::SOCKET_ENV)
                    .unwrap_or_else(|| ummunotify::ebpf::DEFAULT_SOCKET.into())
                    .into(),
                ["--socket", p] => std::path::PathBuf::from(p),
                _ => {
                    eprint!("{USAGE}");
                    return ExitCode::from(2);
                }
            };
            match daemon(&path) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("umn daemon: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        ["demo"] => match demo::run() {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("umn demo: {e}");
                ExitCode::FAILURE
            }
        },
        ["bench", "--backends", rest @ ..] => {
            let mut svg = None;
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match *a {
                    "--json" | "--quick" => {}
                    "--svg" => match it.next() {
                        Some(f) => svg = Some(*f),
                        None => {
                            eprint!("umn bench --backends: --svg needs a file\n{USAGE}");
                            return ExitCode::from(2);
                        }
                    },
                    _ => {
                        eprint!("{USAGE}");
                        return ExitCode::from(2);
                    }
                }
            }
            let exe = match own_exe() {
                Ok(e) => e,
                Err(code) => return code,
            };
            let rows = backends::run(&exe, rest.contains(&"--quick"));
            if rest.contains(&"--json") {
                println!("{}", backends::to_json(&rows));
            } else {
                print!("{}", backends::to_table(&rows));
            }
            if let Some(f) = svg {
                if let Err(e) = std::fs::write(f, backends::to_svg(&rows)) {
                    eprintln!("umn bench --backends: {f}: {e}");
                    return ExitCode::FAILURE;
                }
            }
            if rows.is_empty() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        [backends::CHILD, name, rest @ ..] => {
            match backends::child_main(name, rest.contains(&"--quick")) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        [backends::GETPID, n] => match n.parse() {
            Ok(n) => {
                backends::getpid_main(n);
                ExitCode::SUCCESS
            }
            Err(_) => ExitCode::from(2),
        },
        ["no-procmap-query", cmd @ ..] if !cmd.is_empty() => {
            let cmd = if cmd[0] == "--" { &cmd[1..] } else { cmd };
            let e = umn::no_procmap_query::exec(cmd);
            eprintln!("umn no-procmap-query: {e}");
            ExitCode::from(2)
        }
        ["bench", rest @ ..]
            if bench::mappings_arg(rest).is_some_and(|(_, rest)| {
                rest.iter()
                    .all(|a| matches!(*a, "--json" | "--quick" | "--ebpf" | "--miss"))
            }) =>
        {
            let (mappings, rest) = bench::mappings_arg(rest).expect("matched above");
            let rest = &rest[..];
            let _extra = bench::ExtraMappings::new(mappings);
            let quick = rest.contains(&"--quick");
            let result = if rest.contains(&"--ebpf") {
                bench_ebpf::rows(if quick { 200 } else { 2_000 })
            } else if rest.contains(&"--miss") {
                bench::miss_rows(if quick { 2 } else { 10 })
            } else {
                bench::run(quick)
            };
            match result {
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
        ["designs", rest @ ..] => {
            let num = |flag: &str, default: usize| {
                rest.iter()
                    .position(|a| *a == flag)
                    .and_then(|i| rest.get(i + 1))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default)
            };
            let rows = designs::run(num("--cycles", 2000), num("--storm", 100_000));
            print!("{}", designs::to_table(&rows));
            if rows.is_empty() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
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

/// This executable (children are started from it).
fn own_exe() -> Result<std::path::PathBuf, ExitCode> {
    std::env::current_exe().map_err(|e| {
        eprintln!("umn: can not find my own executable: {e}");
        ExitCode::FAILURE
    })
}

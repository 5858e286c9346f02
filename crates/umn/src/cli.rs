//! `umn`'s commands and flags, declared once (clap derive): parsing, `--help`, `--version`, the
//! error for a bad argument, the shell completions (`umn completions SHELL`) and the man pages
//! (`umn man`) all come from these definitions.
use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

/// ummunotify's command line: what works on this machine, coverage of every kind of mapping
/// change, the demo, the benchmarks, and the eBPF daemon.
#[derive(Debug, Parser)]
#[command(
    name = "umn",
    version,
    propagate_version = true,
    arg_required_else_help = true,
    after_help = "Each command has its own --help (umn coverage --help) and man page (umn man)."
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands. The `__...` ones are hidden: the children `coverage` and `bench` start from
/// their own executable.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Which backends work here, which kernel features exist, what is missing.
    ///
    /// Exit 0 when at least one backend can start here, else 1.
    Doctor,
    /// Run every kind of mapping change against the notifier and report, per kind, whether it
    /// was detected.
    ///
    /// Each kind runs in a child process on the backend asked for (auto = the /dev/ummunotify
    /// module where loaded, else userfaultfd where it starts, else hooks) and is reported as:
    /// detected, expected (can this backend see it at all), stale uses, which oracle judged.
    /// Then the remove-race row: every REMOVE-producing kind racing registrations and re-arms
    /// for a moment (stale uses, REMOVEs settled by grace).
    #[command(
        after_help = "Exit status: 0 = all expected kinds detected with no stale use; \
        1 = a miss, a stale use or a problem; 3 = some case inconclusive (could not run: not a \
        verdict)."
    )]
    Coverage(CoverageArgs),
    /// (root) Load the eBPF programs once for this node and serve each process that connects
    /// its area over a Unix socket.
    ///
    /// Runs in the foreground until killed (a systemd unit: packaging/systemd/umn-daemon.service).
    /// Who may talk to it and what they can learn: docs/SECURITY.md.
    Daemon(DaemonArgs),
    /// The x == y story with io_uring fixed buffers: a naive cache writes stale bytes, the
    /// ummunotify cache does not.
    Demo,
    /// The designs side by side (kernel module, userfaultfd, hooks), each as a ratio to a
    /// baseline measured in the same process just before.
    ///
    /// munmap and madvise of a registered and an unregistered page, the check, register +
    /// unregister, a storm of regions (TSC ticks; for the guest of kernel/ci.sh). Exit 1 when
    /// no design ran.
    Designs(DesignsArgs),
    /// Cache and notifier costs as ratios to baselines measured in the same run (build with
    /// --release).
    ///
    /// Without a mode flag: the cache and notifier rows. --ebpf: only the eBPF backend's rows
    /// (root). --miss: only the cache miss against its kernel floor, 10 rounds, on userfaultfd,
    /// then on hybrid (issue 23), each followed by the notifier's registration alone against the
    /// same floor. --backends: every backend that starts here (and UCX 1.22's hooks + rcache)
    /// side by side, each against its own baselines, in one run.
    Bench(BenchArgs),
    /// Print a shell's completion script for umn on stdout.
    ///
    /// bash: umn completions bash > /etc/bash_completion.d/umn (or
    /// ~/.local/share/bash-completion/completions/umn); zsh: into a directory of $fpath as _umn;
    /// fish: ~/.config/fish/completions/umn.fish.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print umn's man page (roff) on stdout, or write one page per command into a directory.
    ///
    /// man ./umn.1 reads it in place; packages install the pages into /usr/share/man/man1.
    Man(ManArgs),
    /// Run CMD with the PROCMAP_QUERY ioctl answered ENOTTY by a seccomp filter, as a kernel
    /// before 6.11 answers it: the library's fallback paths (issue 41).
    ///
    /// The filter is inherited by CMD's threads and children and across exec.
    NoProcmapQuery {
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// A coverage case in this process (the case is named by UMN_TESTKIT_CASE).
    #[command(name = umn::coverage::CHILD_SUBCOMMAND, hide = true)]
    CoverageCase,
    /// The remove-race row's stress in this process.
    #[command(name = umn::remove_race::CHILD_SUBCOMMAND, hide = true)]
    RemoveRaceCase,
    /// One backend's bench rows in this process.
    #[command(name = crate::backends::CHILD, hide = true)]
    BenchBackend {
        /// The backend.
        name: String,
        /// Fewer rounds.
        #[arg(long)]
        quick: bool,
    },
    /// getpid in a loop, printing ns per call (the other process of a bench row).
    #[command(name = crate::backends::GETPID, hide = true)]
    GetpidLoop {
        /// Calls.
        n: u64,
        /// mmap, touch and munmap one page per round instead (the invalidation path's tax).
        #[arg(long)]
        munmap: bool,
    },
}

/// [`Cli`] without the hidden subcommands, for the shell completions (clap_complete lists hidden
/// subcommands; clap can not remove one, so the top level, which has no flags of its own, is
/// rebuilt around the visible ones).
pub fn completion_command() -> clap::Command {
    let full = <Cli as clap::CommandFactory>::command();
    clap::Command::new("umn")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
}

/// `umn coverage`'s flags.
#[derive(Debug, Args)]
pub struct CoverageArgs {
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The backend the notifier runs on.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
}

/// A backend by name (`ummunotify::Backend::from_name`'s names; the aliases too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The kernel module where loaded, else userfaultfd where it starts, else hooks.
    Auto,
    /// userfaultfd's non-cooperative events.
    #[value(alias = "userfaultfd")]
    Uffd,
    /// libc's unmapping calls patched in the calling thread.
    Hooks,
    /// Hooks in front of userfaultfd.
    Hybrid,
    /// BPF programs on the syscall tracepoints (root, or a running umn daemon).
    #[value(alias = "bpf")]
    Ebpf,
    /// The /dev/ummunotify kernel module.
    Kernel,
    /// perf syscall tracepoints (tracefs and CAP_PERFMON).
    Perf,
    /// perf on the MMU-notifier invalidation tracepoints (a patched kernel, CAP_PERFMON).
    Tracepoint,
}

impl From<BackendArg> for ummunotify::Backend {
    fn from(b: BackendArg) -> ummunotify::Backend {
        use ummunotify::Backend;
        match b {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Uffd => Backend::Userfaultfd,
            BackendArg::Hooks => Backend::Hooks,
            BackendArg::Hybrid => Backend::Hybrid,
            BackendArg::Ebpf => Backend::Ebpf,
            BackendArg::Kernel => Backend::Kernel,
            BackendArg::Perf => Backend::Perf,
            BackendArg::Tracepoint => Backend::Tracepoint,
        }
    }
}

/// `umn daemon`'s options. New options (limits, ...) go here and into [`crate::daemon::run`].
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The Unix socket to serve on (created, with its directory).
    #[arg(
        long,
        value_name = "PATH",
        env = ummunotify::ebpf::SOCKET_ENV,
        default_value = ummunotify::ebpf::DEFAULT_SOCKET
    )]
    pub socket: PathBuf,
    /// Seconds a new connection may take to send the hello before it is closed.
    #[arg(long, value_name = "SECS", default_value_t = 2)]
    pub hello_timeout: u64,
    /// Connections (areas) one uid may hold open.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub per_uid: usize,
    /// Connections of one uid still owing the hello.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub per_uid_pending: usize,
    /// Connections in all (at most 4096, and lowered to what RLIMIT_NOFILE allows).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_clients: usize,
}

/// `umn designs`' options.
#[derive(Debug, Args)]
pub struct DesignsArgs {
    /// Cycles of each measured operation.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub cycles: usize,
    /// Regions in the storm.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub storm: usize,
}

/// `umn bench`'s flags: at most one of the modes --ebpf, --miss, --backends.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").args(["ebpf", "miss", "backends"])))]
pub struct BenchArgs {
    /// One JSON object on stdout (a row per line) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Fewer rounds (a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// Only the eBPF backend's rows (root).
    #[arg(long)]
    pub ebpf: bool,
    /// Only the cache miss against its kernel floor (and the registration alone).
    #[arg(long)]
    pub miss: bool,
    /// Every backend that starts here, side by side, each in a process of its own.
    #[arg(long)]
    pub backends: bool,
    /// With --backends: also write the plot as SVG to FILE.
    #[arg(long, value_name = "FILE", requires = "backends")]
    pub svg: Option<PathBuf>,
    /// N more mappings (VMAs) in the process first: what a miss costs as the process's
    /// mappings grow (issue 41). Not with --backends (each backend runs in a process of its own).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        conflicts_with = "backends"
    )]
    pub mappings: usize,
}

/// `umn man`'s options.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write umn.1 and one umn-COMMAND.1 per command into DIR instead of umn.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completions_name_every_visible_command_and_no_hidden_one() {
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut completion_command(),
            "umn",
            &mut script,
        );
        let script = String::from_utf8(script).unwrap();
        assert!(!script.contains("__coverage-case"), "{script}");
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
        {
            assert!(script.contains(sub.get_name()), "{}", sub.get_name());
        }
        assert!(script.contains("--backends") && script.contains("--socket"));
    }

    #[test]
    fn every_backend_name_the_library_knows_parses_to_the_same_backend() {
        for name in [
            "auto",
            "uffd",
            "userfaultfd",
            "hooks",
            "hybrid",
            "ebpf",
            "bpf",
            "kernel",
            "perf",
            "tracepoint",
        ] {
            let arg = BackendArg::from_str(name, false).unwrap();
            assert_eq!(
                Some(ummunotify::Backend::from(arg)),
                ummunotify::Backend::from_name(name),
                "{name}"
            );
        }
    }

    #[test]
    fn the_children_parse_as_their_parents_start_them() {
        let parse =
            |args: &[&str]| Cli::try_parse_from(["umn"].iter().chain(args)).map(|c| c.command);
        assert!(matches!(
            parse(&[umn::coverage::CHILD_SUBCOMMAND]),
            Ok(Command::CoverageCase)
        ));
        assert!(matches!(
            parse(&[umn::remove_race::CHILD_SUBCOMMAND]),
            Ok(Command::RemoveRaceCase)
        ));
        assert!(matches!(
            parse(&[crate::backends::CHILD, "uffd", "--quick"]),
            Ok(Command::BenchBackend { quick: true, .. })
        ));
        assert!(matches!(
            parse(&[crate::backends::GETPID, "1000"]),
            Ok(Command::GetpidLoop {
                n: 1000,
                munmap: false
            })
        ));
    }
}

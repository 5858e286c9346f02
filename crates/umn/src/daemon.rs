//! `umn daemon`: load the eBPF programs once for this node and serve each process that connects
//! its area. Its options are [`crate::cli::DaemonArgs`]: a new option goes there and is applied
//! here.
use ummunotify::ebpf::Daemon;

use crate::cli::DaemonArgs;

/// Load, bind, say so on stderr (the journal), serve until killed.
pub fn run(args: &DaemonArgs) -> std::io::Result<()> {
    let d = Daemon::new()?;
    let listener = Daemon::bind(&args.socket)?;
    eprintln!(
        "umn daemon: {} tracepoints attached; serving areas on {}",
        d.programs().tracepoints().len(),
        args.socket.display()
    );
    d.serve(listener)
}

//! `umn daemon`: load the eBPF programs once for this node and serve each process that connects
//! its area. Its options are [`crate::cli::DaemonArgs`]: a new option goes there and is applied
//! here.
use ummunotify::ebpf::{Daemon, DaemonConfig};

use crate::cli::DaemonArgs;

/// Load, bind, say so on stderr (the journal), serve until killed.
pub fn run(args: &DaemonArgs) -> std::io::Result<()> {
    let mut config = DaemonConfig::default();
    config.hello_timeout = std::time::Duration::from_secs(args.hello_timeout);
    config.per_uid_connections = args.per_uid;
    config.per_uid_pending = args.per_uid_pending;
    config.max_clients = args.max_clients;
    let d = Daemon::with_config(config)?;
    let listener = Daemon::bind(&args.socket)?;
    eprintln!(
        "umn daemon: {} tracepoints attached; serving areas on {}",
        d.programs().tracepoints().len(),
        args.socket.display()
    );
    d.serve(listener)
}

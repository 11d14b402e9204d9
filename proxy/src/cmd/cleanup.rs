//! `proxy cleanup`: removes what a backend installed, tolerating what is already gone.

use anyhow::Context;
use proxy::cli::CleanupArgs;
use proxy::dataplane::{self, BackendConfig};

pub fn run(args: &CleanupArgs) -> anyhow::Result<()> {
    let cfg = BackendConfig {
        cgroup_path: args.cgroup_path.clone(),
        bpffs_path: args.bpffs_path.clone(),
        iptables_mode: args.iptables_mode.clone(),
        ..BackendConfig::default()
    };
    let backends: Vec<&str> = match args.backend.as_str() {
        "all" => dataplane::BACKENDS.to_vec(),
        one => vec![one],
    };
    let mut failed = Vec::new();
    for b in backends {
        match dataplane::cleanup(b, &cfg) {
            Ok(()) => println!("{b}: cleaned up"),
            Err(e) => {
                eprintln!("{b}: {e}");
                failed.push(b);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("cleanup failed for {}", failed.join(", "))).context("proxy cleanup")
    }
}

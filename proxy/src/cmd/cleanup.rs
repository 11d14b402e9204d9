//! `proxy cleanup`: removes what a backend installed, tolerating what is already gone.

use anyhow::Context;
use proxy::cli::CleanupArgs;
use proxy::dataplane::ebpf::inspect::cgroup_programs;
use proxy::dataplane::{self, BackendConfig};
use proxy::error::DataplaneError;
use std::path::Path;
use std::time::{Duration, Instant};

/// Unpinned links are released after an RCU grace period: waits (up to 5 s) until the cgroup
/// has no socket program left, so "cleaned up" means detached.
fn wait_detached(cgroup: &Path) -> Result<(), DataplaneError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = cgroup_programs(cgroup)?
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(DataplaneError::Other(format!(
                "cgroup {}: programs still attached 5 s after unpinning (attach point, \
                 count): {left:?}",
                cgroup.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

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
        let done = dataplane::cleanup(b, &cfg).and_then(|()| match (b, &args.cgroup_path) {
            ("ebpf", Some(cgroup)) => wait_detached(cgroup),
            _ => Ok(()),
        });
        match done {
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

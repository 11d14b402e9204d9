//! `proxy cleanup`: removes what a backend installed, tolerating what is already gone.

use anyhow::Context;
use proxy::cli::CleanupArgs;
use proxy::dataplane::ebpf::inspect::cgroup_programs;
use proxy::dataplane::{self, Backend, BackendConfig};
use proxy::error::DataplaneError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Per cgroup attach point, how many programs may stay after cleanup: today's count, less one
/// where kpr pinned a link (`links/<attach point>`); other programs on the cgroup are not ours.
fn detach_target(cfg: &BackendConfig) -> Option<(PathBuf, Vec<(&'static str, u32)>)> {
    let cgroup = cfg.cgroup_path.as_ref()?;
    let links = cfg.bpffs_path.join("links");
    let now = cgroup_programs(cgroup).ok()?;
    let target = now
        .into_iter()
        .map(|(point, n)| {
            let ours = u32::from(links.join(point).exists());
            (point, n.saturating_sub(ours))
        })
        .collect();
    Some((cgroup.clone(), target))
}

/// Unpinned links are released after an RCU grace period: waits (up to 5 s) until kpr's
/// programs are gone from the cgroup, so "cleaned up" means detached.
fn wait_detached(cgroup: &Path, target: &[(&'static str, u32)]) -> Result<(), DataplaneError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = cgroup_programs(cgroup)?
            .into_iter()
            .zip(target)
            .filter(|((_, n), (_, want))| n > want)
            .map(|((point, n), _)| (point, n))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(DataplaneError::Other(format!(
                "cgroup {}: kpr's programs still attached 5 s after unpinning (attach point, \
                 count): {left:?}",
                cgroup.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn run(args: &CleanupArgs) -> anyhow::Result<()> {
    let failed: Vec<&str> = clean(&args.backend.backends(), &config(args))
        .into_iter()
        .filter_map(|(b, done)| match done {
            Ok(()) => {
                println!("{b}: cleaned up");
                None
            }
            Err(e) => {
                eprintln!("{b}: {e}");
                Some(b.as_str())
            }
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("cleanup failed for {}", failed.join(", "))).context("proxy cleanup")
    }
}

/// What cleaning up needs of a backend's configuration: where its pins and cgroup are, and
/// which iptables binaries it used.
pub fn config(args: &CleanupArgs) -> BackendConfig {
    BackendConfig {
        cgroup_path: args.cgroup_path.clone(),
        bpffs_path: args.bpffs_path.clone(),
        iptables_mode: args.iptables_mode.clone(),
        ..BackendConfig::default()
    }
}

/// Removes what each of `backends` installed; each one's outcome, in order.
pub fn clean(
    backends: &[Backend],
    cfg: &BackendConfig,
) -> Vec<(Backend, Result<(), DataplaneError>)> {
    backends
        .iter()
        .map(|&b| {
            let target = (b == Backend::Ebpf).then(|| detach_target(cfg)).flatten();
            let done = dataplane::cleanup(b, cfg).and_then(|()| match &target {
                Some((cgroup, target)) => wait_detached(cgroup, target),
                None => Ok(()),
            });
            (b, done)
        })
        .collect()
}

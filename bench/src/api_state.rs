//! The API states the proxies row keeps: after a size of at least [`KEEP_FROM`] Services, the
//! etcd data of its control plane (every Service and slice as written through the API, every
//! change undone) is kept under `<out>/api-state/<key>/`, and `--reuse-api-state` starts the next
//! run of the same size from it instead of writing the objects again. Writing 100,000 Services
//! through kube-apiserver 1.34 takes over an hour on a 2-core machine (its clusterIP allocator
//! is quadratic, see docs/BENCHMARKS.md); measuring an agent at that size takes minutes.
//!
//! Owns the directory layout, the key and the record of how a state was written. A state is only
//! used by the same loader ([`FORMAT`]), size, endpoint count, service range and Kubernetes
//! release; the heading of a run that reused one says so and gives the original write time.
//!
//! Must not touch the control plane itself (the caller stops it before [`keep`]).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// The smallest size whose state is kept: smaller ones are written again in under a few minutes.
pub const KEEP_FROM: usize = 20_000;

/// The loader's format: raise it whenever what `load` writes changes (names, addresses, ports,
/// slices), so no state written by an older loader is reused.
pub const FORMAT: u32 = 1;

/// What a kept state holds and how it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub services: usize,
    pub endpoints: usize,
    pub service_cidr: String,
    pub kubernetes: String,
    /// How long writing it through the API took, in seconds.
    pub load_s: f64,
    /// When and by which tree it was written.
    pub date: String,
    pub tree: String,
}

impl Record {
    /// The directory name of a state: everything that must match for it to be reused.
    pub fn key(&self) -> String {
        format!(
            "{}x{}-{}-k8s{}-format{}",
            self.services,
            self.endpoints,
            self.service_cidr.replace('/', "_"),
            self.kubernetes,
            self.format
        )
    }

    fn matches(&self, other: &Record) -> bool {
        self.key() == other.key()
    }
}

/// A kept state found for a size.
#[derive(Debug, Clone)]
pub struct Kept {
    pub dir: PathBuf,
    pub record: Record,
}

impl Kept {
    /// The etcd data directory to start the control plane from.
    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }
}

fn base(out: &Path) -> PathBuf {
    out.join("api-state")
}

/// The kept state for `wanted` (its `load_s`, `date` and `tree` are ignored), if there is one.
pub fn find(out: &Path, wanted: &Record) -> anyhow::Result<Option<Kept>> {
    let dir = base(out).join(wanted.key());
    let path = dir.join("record.json");
    if !path.is_file() || !dir.join("etcd").is_dir() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path)?;
    let record: Record =
        serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    if !record.matches(wanted) {
        anyhow::bail!(
            "{} describes {} rather than {}",
            path.display(),
            record.key(),
            wanted.key()
        );
    }
    Ok(Some(Kept { dir, record }))
}

/// Keeps a stopped control plane's etcd data as the state of `record`, replacing an older one of
/// the same key. The record is written last: a copy cut short is never found.
pub fn keep(out: &Path, etcd: &Path, record: &Record) -> anyhow::Result<PathBuf> {
    let dir = base(out).join(record.key());
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    controlplane::cluster::copy_dir(etcd, &dir.join("etcd"))?;
    std::fs::write(
        dir.join("record.json"),
        serde_json::to_string_pretty(record)?,
    )?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(services: usize) -> Record {
        Record {
            format: FORMAT,
            services,
            endpoints: 4,
            service_cidr: "10.96.0.0/12".into(),
            kubernetes: "v1.34.4".into(),
            load_s: 4000.0,
            date: "2026-11-27 12:00 UTC".into(),
            tree: "abc1234".into(),
        }
    }

    /// A scratch directory removed when the test ends, passed or not.
    struct Scratch(PathBuf);

    impl Scratch {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_kept_state_is_found_only_for_what_it_holds() {
        let out = Scratch(
            std::env::temp_dir().join(format!("kpr-bench-api-state-{}", std::process::id())),
        );
        let etcd = out.path().join("cp-etcd");
        std::fs::create_dir_all(etcd.join("member")).unwrap();
        std::fs::write(etcd.join("member/db"), b"data").unwrap();
        let kept = record(100_000);
        keep(out.path(), &etcd, &kept).unwrap();

        // How it was written does not take part in the match; what it holds does.
        let mut wanted = record(100_000);
        wanted.load_s = 0.0;
        wanted.tree = "other".into();
        let found = find(out.path(), &wanted).unwrap().expect("kept");
        assert_eq!(found.record, kept);
        assert_eq!(
            std::fs::read(found.etcd().join("member/db")).unwrap(),
            b"data"
        );
        assert!(find(out.path(), &record(20_000)).unwrap().is_none());
        let mut other_loader = record(100_000);
        other_loader.format = FORMAT + 1;
        assert!(find(out.path(), &other_loader).unwrap().is_none());

        // Keeping again replaces it.
        std::fs::write(etcd.join("member/db"), b"newer").unwrap();
        keep(out.path(), &etcd, &kept).unwrap();
        let found = find(out.path(), &wanted).unwrap().expect("kept");
        assert_eq!(
            std::fs::read(found.etcd().join("member/db")).unwrap(),
            b"newer"
        );
    }
}

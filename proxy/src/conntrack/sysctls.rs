//! The conntrack sysctls kube-proxy tunes when it starts, set the way it sets them: the table
//! size `nf_conntrack_max` (from `--conntrack-max-per-core` × CPUs, at least `--conntrack-min`;
//! the hash table grown to a quarter of it), the TCP established and CLOSE_WAIT timeouts, TCP
//! liberal mode, and the UDP timeouts.
//!
//! A timeout is written only when it differs from the current value, the table size and the hash
//! size only when they are smaller than wanted (never lowered: upstream's fix kubernetes#142035,
//! after v1.34, which wrote any differing value), and a zero setting leaves its sysctl alone
//! (kube-proxy's `0 to leave as-is`). The timeouts belong to the network namespace
//! of the calling thread (the node's); `nf_conntrack_max` and the hash size are the host's: the
//! kernel makes them read-only outside the host's namespace and container runtimes mount `/proc/sys`
//! and `/sys` read-only, so a write refused for that reason is skipped with a warning (kube-proxy
//! likewise goes on when sysfs is read-only) and any other failure is an error.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What to set (the `proxy run --conntrack-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Table entries per CPU; 0 leaves `nf_conntrack_max` as it is and ignores `min`.
    pub max_per_core: u32,
    pub min: u32,
    pub tcp_established_timeout: Duration,
    pub tcp_close_wait_timeout: Duration,
    pub tcp_be_liberal: bool,
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
}

/// The table size kube-proxy asks for: `max_per_core` × CPUs, at least `min`; `None` when
/// `max_per_core` is 0 (leave it).
pub fn conntrack_max(max_per_core: u32, min: u32, cpus: u32) -> Option<u64> {
    if max_per_core == 0 {
        return None;
    }
    Some((u64::from(max_per_core) * u64::from(cpus)).max(u64::from(min)))
}

/// The CPUs kube-proxy counts: the online CPUs of the machine (not this process's affinity).
pub fn cpu_count() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1)
}

/// What happened to one sysctl.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written: it was `from`.
    Set { from: u64 },
    /// Already the wanted value (for the table and hash sizes: at least it).
    Unchanged,
    /// Not writable here (read-only outside the host's namespace or a read-only mount).
    Skipped { reason: String },
}

/// One sysctl the settings asked for and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The file, e.g. `/proc/sys/net/netfilter/nf_conntrack_max`.
    pub path: PathBuf,
    pub value: u64,
    pub outcome: Outcome,
}

/// Where the files are: `/proc/sys/net/netfilter` and `/sys/module/nf_conntrack/parameters`
/// (tests point them elsewhere).
#[derive(Debug, Clone)]
pub struct Paths {
    pub netfilter: PathBuf,
    pub hashsize: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            netfilter: PathBuf::from("/proc/sys/net/netfilter"),
            hashsize: PathBuf::from("/sys/module/nf_conntrack/parameters/hashsize"),
        }
    }
}

/// Applies `settings` in the calling thread's network namespace. Fails when a sysctl that should
/// be written cannot be for another reason than a read-only namespace or mount, or nf_conntrack
/// not being loaded (no such file).
pub fn apply(settings: &ConntrackSettings, cpus: u32, paths: &Paths) -> io::Result<Vec<Applied>> {
    let mut done = Vec::new();
    if let Some(max) = conntrack_max(settings.max_per_core, settings.min, cpus) {
        let applied = set(&paths.netfilter.join("nf_conntrack_max"), max, Write::Raise)?;
        // Only after this agent raised the limit itself: `hashsize` is a module parameter, the
        // same for every network namespace, and an agent in a namespace where
        // nf_conntrack_max is read-only must not change the host's table.
        let grown = matches!(applied.outcome, Outcome::Set { .. });
        done.push(applied);
        // The hash table should hold a quarter of the entries (kube-proxy's rule); only
        // grown, never shrunk.
        if grown && read(&paths.hashsize)? < max / 4 {
            done.push(set(&paths.hashsize, max / 4, Write::Raise)?);
        }
    }
    let seconds = [
        (
            "nf_conntrack_tcp_timeout_established",
            settings.tcp_established_timeout,
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            settings.tcp_close_wait_timeout,
        ),
        ("nf_conntrack_udp_timeout", settings.udp_timeout),
        (
            "nf_conntrack_udp_timeout_stream",
            settings.udp_stream_timeout,
        ),
    ];
    for (name, timeout) in seconds {
        // Whole seconds, as kube-proxy truncates them; under a second leaves the sysctl alone.
        if timeout.as_secs() > 0 {
            done.push(set(
                &paths.netfilter.join(name),
                timeout.as_secs(),
                Write::Differs,
            )?);
        }
    }
    if settings.tcp_be_liberal {
        done.push(set(
            &paths.netfilter.join("nf_conntrack_tcp_be_liberal"),
            1,
            Write::Differs,
        )?);
    }
    Ok(done)
}

fn read(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {:?} is not a number: {e}", path.display(), text.trim()),
        )
    })
}

/// When a sysctl is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// When its value differs.
    Differs,
    /// When its value is smaller (a size).
    Raise,
}

fn set(path: &Path, value: u64, when: Write) -> io::Result<Applied> {
    let from = match read(path) {
        Ok(v) => v,
        // The conntrack sysctls exist once nf_conntrack is loaded (the rule backends load it);
        // a backend that does not use it has nothing to tune.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Applied {
                path: path.to_path_buf(),
                value,
                outcome: Outcome::Skipped {
                    reason: "no such file: nf_conntrack is not loaded".into(),
                },
            })
        }
        Err(e) => return Err(e),
    };
    let outcome = if from == value || (when == Write::Raise && from > value) {
        Outcome::Unchanged
    } else {
        match fs::write(path, value.to_string()) {
            Ok(()) => Outcome::Set { from },
            Err(e) if refused_here(&e) => Outcome::Skipped {
                reason: format!("{e} (it is {from})"),
            },
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("writing {value} to {}: {e}", path.display()),
                ))
            }
        }
    };
    Ok(Applied {
        path: path.to_path_buf(),
        value,
        outcome,
    })
}

/// A write refused because this namespace or mount may not change the file: EACCES/EPERM (host-wide
/// sysctls are mode 0444 outside the host's network namespace), EOPNOTSUPP (the hash size outside
/// it) or EROFS (a container's read-only `/proc/sys` or `/sys`).
fn refused_here(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EOPNOTSUPP | libc::EROFS)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_is_per_core_times_cpus_at_least_min() {
        assert_eq!(conntrack_max(32768, 131072, 2), Some(131072));
        assert_eq!(conntrack_max(32768, 131072, 8), Some(262144));
        assert_eq!(conntrack_max(32768, 0, 3), Some(98304));
        assert_eq!(conntrack_max(0, 131072, 64), None, "0 leaves it as is");
    }

    fn fake(max: u64, hashsize: u64, timeout: u64) -> (PathBuf, Paths) {
        let dir = std::env::temp_dir().join(format!(
            "kpr-sysctls-{}-{max}-{hashsize}-{timeout}",
            std::process::id()
        ));
        let netfilter = dir.join("netfilter");
        fs::create_dir_all(&netfilter).unwrap();
        fs::write(netfilter.join("nf_conntrack_max"), format!("{max}\n")).unwrap();
        for name in [
            "nf_conntrack_tcp_timeout_established",
            "nf_conntrack_tcp_timeout_close_wait",
            "nf_conntrack_udp_timeout",
            "nf_conntrack_udp_timeout_stream",
            "nf_conntrack_tcp_be_liberal",
        ] {
            fs::write(netfilter.join(name), format!("{timeout}\n")).unwrap();
        }
        fs::write(dir.join("hashsize"), format!("{hashsize}\n")).unwrap();
        let paths = Paths {
            netfilter,
            hashsize: dir.join("hashsize"),
        };
        (dir, paths)
    }

    #[test]
    fn writes_what_differs_and_leaves_zero_settings_alone() {
        let (dir, paths) = fake(65536, 16384, 120);
        let settings = ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: Duration::from_secs(86400),
            tcp_close_wait_timeout: Duration::from_secs(120),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::from_millis(900),
        };
        let done = apply(&settings, 2, &paths).unwrap();
        let outcome = |name: &str| {
            done.iter()
                .find(|a| a.path.ends_with(name))
                .map(|a| (a.value, a.outcome.clone()))
        };
        assert_eq!(
            outcome("nf_conntrack_max"),
            Some((131072, Outcome::Set { from: 65536 }))
        );
        assert_eq!(
            outcome("hashsize"),
            Some((32768, Outcome::Set { from: 16384 })),
            "grown to max/4"
        );
        assert_eq!(
            outcome("nf_conntrack_tcp_timeout_established"),
            Some((86400, Outcome::Set { from: 120 }))
        );
        assert_eq!(
            outcome("nf_conntrack_tcp_timeout_close_wait"),
            Some((120, Outcome::Unchanged))
        );
        assert_eq!(outcome("nf_conntrack_udp_timeout"), None, "0 leaves it");
        assert_eq!(outcome("nf_conntrack_udp_timeout_stream"), None, "< 1 s");
        assert_eq!(outcome("nf_conntrack_tcp_be_liberal"), None);
        assert_eq!(
            read(&paths.netfilter.join("nf_conntrack_max")).unwrap(),
            131072
        );
        assert_eq!(read(&paths.hashsize).unwrap(), 32768);
        assert_eq!(
            read(&paths.netfilter.join("nf_conntrack_udp_timeout")).unwrap(),
            120
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_larger_table_is_not_lowered_and_a_missing_sysctl_is_skipped() {
        let (dir, paths) = fake(262144, 65536, 1);
        let settings = ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::ZERO,
            tcp_be_liberal: true,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        };
        let done = apply(&settings, 1, &paths).unwrap();
        assert_eq!(done.len(), 2, "{done:?}");
        assert_eq!(
            done[0].outcome,
            Outcome::Unchanged,
            "262144 is more than 131072"
        );
        assert_eq!(
            read(&paths.netfilter.join("nf_conntrack_max")).unwrap(),
            262144
        );
        assert!(done[1].path.ends_with("nf_conntrack_tcp_be_liberal"));
        assert_eq!(done[1].outcome, Outcome::Unchanged, "already 1");
        fs::remove_file(paths.netfilter.join("nf_conntrack_tcp_be_liberal")).unwrap();
        let done = apply(&settings, 1, &paths).unwrap();
        assert!(
            matches!(&done[1].outcome, Outcome::Skipped { reason } if reason.contains("not loaded")),
            "{done:?}"
        );
        fs::write(paths.netfilter.join("nf_conntrack_tcp_be_liberal"), "yes").unwrap();
        let e = apply(&settings, 1, &paths).unwrap_err().to_string();
        assert!(e.contains("nf_conntrack_tcp_be_liberal"), "{e}");
        fs::remove_dir_all(dir).unwrap();
    }
}

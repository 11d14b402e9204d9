//! CPU and memory of the components kpr replaces and of kpr's own, in a running cluster:
//! kube-controller-manager, kube-scheduler and kube-proxy against kpr's controller-manager,
//! scheduler and agent (`proxy`). Read from `/proc`: a process belongs to the cluster when its
//! command line names the cluster's directory (the control plane's processes) or it lives in one of
//! the cluster's node network namespaces (the proxies, host-network Pods on the nodes).
//!
//! CPU is the processes' user and system time over a window (summed over a component's
//! instances: one proxy per node); memory is the highest peak resident set (`VmHWM`) of any one
//! instance, so a node agent is compared per node.
//!
//! Owns the reading only; the e2e matrix decides the windows and writes the tables.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Cluster;

/// Program names (the executable's file name) and the component each is.
const COMPONENTS: &[(&str, &str)] = &[
    ("kube-controller-manager", "kube-controller-manager"),
    ("kube-scheduler", "kube-scheduler"),
    ("kube-proxy", "kube-proxy"),
    ("controller-manager", "kpr controller-manager"),
    ("scheduler", "kpr scheduler"),
    ("proxy", "kpr proxy"),
];

/// One component's use over a window.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ComponentUsage {
    /// CPU seconds (user + system) over the window, all instances.
    pub cpu_seconds: f64,
    /// The highest peak resident set of one instance, MiB.
    pub peak_rss_mib: f64,
    /// Processes seen.
    pub instances: usize,
}

/// Every component's use over a window of `seconds`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub seconds: f64,
    pub components: BTreeMap<String, ComponentUsage>,
}

/// Per process: its component, CPU ticks when first and last seen, peak RSS.
#[derive(Debug, Clone)]
struct Seen {
    component: &'static str,
    first_ticks: u64,
    last_ticks: u64,
    peak_kib: u64,
}

/// The cluster's processes of the tracked components now: pid -> component.
fn processes(cluster: &Cluster) -> Vec<(u32, &'static str)> {
    let needle = format!("{}/", cluster.dir.to_string_lossy());
    let node_netns: Vec<u64> = fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{}-node-", cluster.name))
        })
        .filter_map(|e| fs::metadata(e.path()).ok().map(|m| m.ino()))
        .collect();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let base = super::program_name(&cmdline)?;
            let component = COMPONENTS.iter().find(|(p, _)| *p == base)?.1;
            let ours = String::from_utf8_lossy(&cmdline).contains(&needle)
                || fs::metadata(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|m| node_netns.contains(&m.ino()));
            ours.then_some((pid, component))
        })
        .collect()
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold spaces, in parentheses): state is field 3, utime
    // field 14 and stime field 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Peak resident set (`VmHWM`) of a process, KiB.
fn peak_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// A `/proc/<pid>/status` line of KiB (`VmHWM:`, `VmRSS:`, `RssAnon:`).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    kib_in(
        &fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        field,
    )
}

/// A line of KiB in a `/proc/<pid>/status` already read.
fn kib_in(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// One process of a tracked component now: its current resident set, the anonymous part of it
/// (heap and stacks, without the binary's file pages) and its open descriptors.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessNow {
    pub component: &'static str,
    pub pid: u32,
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub fds: u64,
}

/// Every tracked process of the cluster now (the soak's samples).
pub fn snapshot(cluster: &Cluster) -> Vec<ProcessNow> {
    processes(cluster)
        .into_iter()
        .filter_map(|(pid, component)| {
            // One read, so the resident set and its anonymous part are of the same moment.
            let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let rss_kib = kib_in(&status, "VmRSS:")?;
            let anon_kib = kib_in(&status, "RssAnon:")?;
            let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
            Some(ProcessNow {
                component,
                pid,
                rss_kib,
                anon_kib,
                fds,
            })
        })
        .collect()
}

/// Samples the cluster's components every second until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Usage>,
}

impl Sampler {
    pub fn start(cluster: &Cluster) -> Sampler {
        let cluster = Cluster {
            name: cluster.name.clone(),
            dir: cluster.dir.clone(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let handle = std::thread::spawn(move || {
            let started = Instant::now();
            let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
            loop {
                for (pid, component) in processes(&cluster) {
                    let (Some(ticks), Some(peak)) = (cpu_ticks(pid), peak_kib(pid)) else {
                        continue;
                    };
                    let entry = seen.entry(pid).or_insert(Seen {
                        component,
                        first_ticks: ticks,
                        last_ticks: ticks,
                        peak_kib: peak,
                    });
                    entry.last_ticks = ticks;
                    entry.peak_kib = entry.peak_kib.max(peak);
                }
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            summarize(started.elapsed(), seen.values())
        });
        Sampler { stop, handle }
    }

    /// Stops sampling (after one last sample) and returns the use over the window.
    pub fn stop(self) -> Usage {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap_or_default()
    }
}

fn summarize<'a>(took: Duration, seen: impl Iterator<Item = &'a Seen>) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut components: BTreeMap<String, ComponentUsage> = BTreeMap::new();
    for s in seen {
        let c = components.entry(s.component.to_string()).or_default();
        c.cpu_seconds += (s.last_ticks - s.first_ticks) as f64 / hz;
        c.peak_rss_mib = c.peak_rss_mib.max(s.peak_kib as f64 / 1024.0);
        c.instances += 1;
    }
    Usage {
        seconds: took.as_secs_f64(),
        components,
    }
}

/// Samples for `window` and returns the use over it.
pub fn measure(cluster: &Cluster, window: Duration) -> Usage {
    let sampler = Sampler::start(cluster);
    std::thread::sleep(window);
    sampler.stop()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process itself: its CPU ticks and peak RSS are read, and a window's CPU is the
    /// difference between the last and first reading, summed per component.
    #[test]
    fn reads_proc_and_sums_per_component() {
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(peak_kib(me).unwrap() > 0);
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let seen = [
            Seen {
                component: "kpr proxy",
                first_ticks: 10,
                last_ticks: 10 + 2 * hz,
                peak_kib: 2048,
            },
            Seen {
                component: "kpr proxy",
                first_ticks: 0,
                last_ticks: hz,
                peak_kib: 4096,
            },
        ];
        let usage = summarize(Duration::from_secs(5), seen.iter());
        let proxy = &usage.components["kpr proxy"];
        assert_eq!(proxy.cpu_seconds, 3.0);
        assert_eq!(proxy.peak_rss_mib, 4.0);
        assert_eq!(proxy.instances, 2);
    }
}

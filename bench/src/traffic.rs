//! Client-side measurements, run on threads inside a client namespace (and, for the eBPF socket
//! programs, with this process inside the test cgroup): request latency, short-connection request
//! rate, round-robin deviation and least-connection spread. Every connection is real TCP to the
//! pods' echo servers (connect, greeting, one echo round trip, close).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use kpr_tests::client::{tcp_hold_here, tcp_request_here};
use kpr_tests::{Cgroup, Netns};
use serde::Serialize;

const TIMEOUT: Duration = Duration::from_secs(2);

/// p50 and p99 of a latency sample, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub samples: usize,
}

/// The p-th percentile (0..=100) of `sorted`, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    Latency {
        p50_us: percentile(&samples, 50.0).as_secs_f64() * 1e6,
        p99_us: percentile(&samples, 99.0).as_secs_f64() * 1e6,
        samples: samples.len(),
    }
}

/// Fails when more than 1% of `attempts` failed (a few timeouts are noise, more is a broken path).
fn check_failures(
    what: &str,
    addr: SocketAddr,
    failures: &[String],
    attempts: usize,
) -> anyhow::Result<()> {
    if failures.len() * 100 > attempts {
        bail!(
            "{what} to {addr}: {} of {attempts} requests failed (first: {})",
            failures.len(),
            failures[0]
        );
    }
    Ok(())
}

/// `samples` sequential requests to `addr` from `ns`; connect-to-close time of each.
pub fn latency(ns: &Netns, addr: SocketAddr, samples: usize) -> anyhow::Result<Latency> {
    Ok(summarize(timed_requests(ns, addr, samples)?))
}

/// A Service and the pod behind it measured the same way from the same client, interleaved.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Paired {
    /// Every Service sample pooled.
    pub service: Latency,
    /// Every direct sample pooled.
    pub direct: Latency,
    /// Median over blocks of (Service block p50 / direct block p50).
    pub latency_ratio: f64,
    /// Requests per second, each side's total over its own time.
    pub service_rps: f64,
    pub direct_rps: f64,
}

/// How many alternating Service/direct blocks [`paired`] runs.
pub const BLOCKS: usize = 10;

/// Latency and request rate to `service` and straight to `direct` from the same namespace and
/// the same process (in whatever cgroup it is): `BLOCKS` alternating blocks of `samples / BLOCKS`
/// latency samples and `rate_time / BLOCKS` of short connections each, so the machine's noise
/// hits both sides alike. The latency ratio is the median of the per-block p50 ratios. A zero
/// `rate_time` measures latency only (the rates are then zero).
pub fn paired(
    ns: &Netns,
    service: SocketAddr,
    direct: SocketAddr,
    samples: usize,
    rate_time: Duration,
) -> anyhow::Result<Paired> {
    let per_block = (samples / BLOCKS).max(1);
    let slice = rate_time / BLOCKS as u32;
    let (mut svc_all, mut dir_all, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut svc_rate, mut dir_rate) = (Rate::default(), Rate::default());
    for _ in 0..BLOCKS {
        let s = timed_requests(ns, service, per_block)?;
        let d = timed_requests(ns, direct, per_block)?;
        let (sp, dp) = (summarize(s.clone()).p50_us, summarize(d.clone()).p50_us);
        if dp > 0.0 {
            ratios.push(sp / dp);
        }
        svc_all.extend(s);
        dir_all.extend(d);
        if !slice.is_zero() {
            svc_rate.add(rate_block(ns, service, slice)?);
            dir_rate.add(rate_block(ns, direct, slice)?);
        }
    }
    ratios.sort_by(f64::total_cmp);
    Ok(Paired {
        service: summarize(svc_all),
        direct: summarize(dir_all),
        latency_ratio: ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN),
        service_rps: svc_rate.per_second(),
        direct_rps: dir_rate.per_second(),
    })
}

/// Completed requests over elapsed time, summed over blocks.
#[derive(Debug, Default, Clone, Copy)]
struct Rate {
    done: usize,
    elapsed: Duration,
}

impl Rate {
    fn add(&mut self, other: Rate) {
        self.done += other.done;
        self.elapsed += other.elapsed;
    }

    fn per_second(self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `samples` sequential requests; the connect-to-close time of each (fails above 1% failures).
fn timed_requests(ns: &Netns, addr: SocketAddr, samples: usize) -> anyhow::Result<Vec<Duration>> {
    let (times, failures) = ns.run(|| {
        let mut times = Vec::with_capacity(samples);
        let mut failures = Vec::new();
        for _ in 0..samples {
            let start = Instant::now();
            match tcp_request_here(addr, TIMEOUT) {
                Ok(_) => times.push(start.elapsed()),
                Err(e) => failures.push(e.to_string()),
            }
        }
        (times, failures)
    })?;
    check_failures("latency", addr, &failures, samples)?;
    Ok(times)
}

/// Sequential short connections for `duration` (fails above 1% failures).
fn rate_block(ns: &Netns, addr: SocketAddr, duration: Duration) -> anyhow::Result<Rate> {
    let (done, failures, elapsed) = ns.run(|| {
        let start = Instant::now();
        let (mut done, mut failures) = (0usize, Vec::new());
        while start.elapsed() < duration {
            match tcp_request_here(addr, TIMEOUT) {
                Ok(_) => done += 1,
                Err(e) => failures.push(e.to_string()),
            }
        }
        (done, failures, start.elapsed())
    })?;
    check_failures("request rate", addr, &failures, done + failures.len())?;
    Ok(Rate { done, elapsed })
}

/// Sequential short connections to `addr` for `duration`: completed requests per second.
pub fn request_rate(ns: &Netns, addr: SocketAddr, duration: Duration) -> anyhow::Result<f64> {
    Ok(rate_block(ns, addr, duration)?.per_second())
}

/// Connections per pod over `conns` sequential requests.
pub fn distribution(
    ns: &Netns,
    addr: SocketAddr,
    conns: usize,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let (counts, failures) = ns.run(|| {
        let mut counts = BTreeMap::new();
        let mut failures = Vec::new();
        for _ in 0..conns {
            match tcp_request_here(addr, TIMEOUT) {
                Ok(r) => *counts.entry(r.pod).or_insert(0) += 1,
                Err(e) => failures.push(e.to_string()),
            }
        }
        (counts, failures)
    })?;
    check_failures("round-robin", addr, &failures, conns)?;
    Ok(counts)
}

/// The largest relative deviation from an even split over `endpoints`, in percent.
pub fn max_deviation_pct(counts: &BTreeMap<String, usize>, endpoints: usize) -> f64 {
    let total: usize = counts.values().sum();
    let expected = total as f64 / endpoints as f64;
    let missing = counts.len() < endpoints;
    let worst = counts
        .values()
        .map(|&c| (c as f64 - expected).abs())
        .fold(if missing { expected } else { 0.0 }, f64::max);
    100.0 * worst / expected
}

/// The skewed mix: `long` connections kept open, each followed by `short_per_long` short
/// requests. Returns the long connections held per pod (their spread is max - min).
pub fn held_spread(
    ns: &Netns,
    addr: SocketAddr,
    long: usize,
    short_per_long: usize,
) -> anyhow::Result<BTreeMap<String, usize>> {
    ns.run(|| -> anyhow::Result<BTreeMap<String, usize>> {
        let mut held = Vec::with_capacity(long);
        for _ in 0..long {
            let conn = tcp_hold_here(addr, TIMEOUT)
                .with_context(|| format!("opening a long connection to {addr}"))?;
            held.push(conn);
            for _ in 0..short_per_long {
                tcp_request_here(addr, TIMEOUT)
                    .with_context(|| format!("short request to {addr}"))?;
            }
        }
        let mut per_pod = BTreeMap::new();
        for conn in held {
            *per_pod.entry(conn.reply.pod.clone()).or_insert(0) += 1;
            conn.close();
        }
        Ok(per_pod)
    })?
}

/// max - min over `endpoints` pods (a pod that got nothing counts as 0).
pub fn spread(per_pod: &BTreeMap<String, usize>, endpoints: usize) -> usize {
    let max = per_pod.values().copied().max().unwrap_or(0);
    let min = if per_pod.len() < endpoints {
        0
    } else {
        per_pod.values().copied().min().unwrap_or(0)
    };
    max - min
}

/// While alive, this whole process is inside a test cgroup (so the eBPF socket programs attached
/// there see its connect() calls); dropping moves it back where it was.
pub struct InCgroup {
    home: PathBuf,
}

impl InCgroup {
    pub fn enter(cgroup: &Cgroup) -> anyhow::Result<InCgroup> {
        let mount = kpr_tests::cgroup::cgroup2_mount()?;
        let own = fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .context("/proc/self/cgroup has no cgroup2 (0::) line")?;
        let home = mount.join(rel.trim_start_matches('/')).join("cgroup.procs");
        let procs = cgroup.path().join("cgroup.procs");
        fs::write(&procs, std::process::id().to_string())
            .with_context(|| format!("moving this process into {}", procs.display()))?;
        Ok(InCgroup { home })
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.home, std::process::id().to_string()) {
            eprintln!(
                "warning: could not move back to {}: {e}",
                self.home.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&s, 50.0), Duration::from_micros(50));
        assert_eq!(percentile(&s, 99.0), Duration::from_micros(99));
        assert_eq!(percentile(&s[..1], 99.0), Duration::from_micros(1));
    }

    #[test]
    fn deviation_and_spread_count_missing_pods() {
        let even = BTreeMap::from([("a".into(), 50), ("b".into(), 50)]);
        assert_eq!(max_deviation_pct(&even, 2), 0.0);
        let skew = BTreeMap::from([("a".into(), 60), ("b".into(), 40)]);
        assert!((max_deviation_pct(&skew, 2) - 20.0).abs() < 1e-9);
        let one = BTreeMap::from([("a".into(), 100)]);
        assert!((max_deviation_pct(&one, 2) - 100.0).abs() < 1e-9);
        assert_eq!(spread(&skew, 2), 20);
        assert_eq!(spread(&one, 2), 100);
    }
}

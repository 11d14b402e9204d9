//! The benchmark's outputs: the table printed at the end, `target/bench/bench.json` (every
//! number), `target/bench/bench.svg` (a hand-written bar chart) and `target/bench/BENCHMARKS.md`
//! (a markdown summary to paste into docs/BENCHMARKS.md).

use std::fmt::Write as _;

use anyhow::Context as _;
use serde::Serialize;

use super::backend::BackendResult;
use super::baseline::BaselineResult;
use super::control_plane::ColdStart;
use super::traffic::Latency;
use super::{BenchArgs, Plan};

/// What happened to one kpr backend.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", content = "result", rename_all = "kebab-case")]
pub enum BackendRow {
    Measured(Box<BackendResult>),
    NotAvailable(String),
    Failed(String),
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub services: usize,
    pub endpoints: usize,
    pub seed: u64,
    pub quick: bool,
    pub kernel: String,
    pub date: String,
    /// `git rev-parse --short HEAD`, and the files that differed from it (the tree measured).
    pub commit: String,
    pub direct: Option<(Latency, f64)>,
    pub backends: Vec<(String, BackendRow)>,
    pub baselines: Vec<BaselineResult>,
    pub control_plane: Option<ColdStart>,
    /// Backends and baselines that errored.
    pub failures: Vec<String>,
    #[serde(skip)]
    out_dir: std::path::PathBuf,
}

pub(crate) fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn now_utc() -> String {
    xtask::exec::Cmd::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .read()
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The commit the run was built from, plus the tracked files that differed from it.
pub(crate) fn tree_state() -> String {
    let git = |args: &[&str]| {
        xtask::exec::Cmd::new("git")
            .args(args)
            .dir(xtask::workspace_root())
            .read()
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = git(&["diff", "--name-only", "HEAD"]);
    if dirty.is_empty() {
        head
    } else {
        format!(
            "{head} + uncommitted changes to {}",
            dirty.replace('\n', ", ")
        )
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn lat(l: &Option<Latency>) -> String {
    l.map_or("-".into(), |l| format!("{:.0} / {:.0}", l.p50_us, l.p99_us))
}

/// Latency at N over latency at 10 Services. Each side is first divided by the latency to the
/// pod client's loopback server measured interleaved with it (`n_vs_lo`, `ten_vs_lo`), so that
/// the machine getting faster or slower between the two measurements cancels while every cost
/// of the dataplane stays in (a direct-to-pod reference would not do: it crosses the node's nat
/// hooks too, and kube-proxy's rule list slows it down as much as the Service). The raw p50
/// ratio is the fallback when a side has no pairing.
fn growth(
    n: &Option<Latency>,
    ten: &Option<Latency>,
    n_vs_lo: Option<f64>,
    ten_vs_lo: Option<f64>,
) -> String {
    match (n_vs_lo, ten_vs_lo) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => {
            return format!("{:.2}", a / b)
        }
        _ => {}
    }
    match (n, ten) {
        (Some(a), Some(b)) if b.p50_us > 0.0 => format!("{:.2} (raw)", a.p50_us / b.p50_us),
        _ => "-".into(),
    }
}

impl Report {
    pub fn new(plan: &Plan, args: &BenchArgs) -> Report {
        let mut command = String::from("cargo xtask bench");
        if args.quick {
            command.push_str(" --quick");
        } else {
            write!(command, " --services {}", plan.services).unwrap();
        }
        write!(
            command,
            " --endpoints {} --backends {} --seed {}",
            plan.endpoints,
            args.backends.join(","),
            plan.seed
        )
        .unwrap();
        write!(command, " --ipv6-backends {}", args.ipv6_backends.join(",")).unwrap();
        if args.no_control_plane {
            command.push_str(" --no-control-plane");
        } else if !args.quick {
            write!(command, " --control-plane-services {}", plan.cp_services).unwrap();
        }
        if args.only_control_plane {
            command.push_str(" --only-control-plane");
        }
        if args.no_baselines {
            command.push_str(" --no-baselines");
        } else if !args.quick {
            write!(
                command,
                " --nft-baseline-max {} --ipt-nft-baseline-max {}",
                args.nft_baseline_max, args.ipt_nft_baseline_max
            )
            .unwrap();
        }
        Report {
            command,
            services: plan.services,
            endpoints: plan.endpoints,
            seed: plan.seed,
            quick: args.quick,
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            date: now_utc(),
            commit: tree_state(),
            direct: None,
            backends: Vec::new(),
            baselines: Vec::new(),
            control_plane: None,
            failures: Vec::new(),
            out_dir: plan.out_dir.clone(),
        }
    }

    /// The markdown table (also what is printed).
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        writeln!(s, "Command: `{}`  \nKernel: {}  \nDate: {}  \nTree: {}  \nServices: {} (ClusterIP; the last {} also NodePort), {} endpoints each; rows marked IPv6: the same Services IPv6-only (clusterIPs in fd00:10:96::/112, endpoints on the pods' IPv6 addresses, a dual-stack node)\n",
            self.command, self.kernel, self.date, self.commit, self.services, super::workload::NODE_PORTS.min(self.services), self.endpoints).unwrap();
        s.push_str("| dataplane | full sync/load (ms) | one change p50 / p99 (ms) | kernel mem Δ (KiB, approx.) | agent: first sync (s) / VmHWM (MiB) | latency@10 p50/p99 (µs) | latency@N p50/p99 (µs) | @N / @10 | vs direct: p50 / req/s | RR max dev (%) | LC held spread (RR) |\n");
        s.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
        if let Some((l, rps)) = &self.direct {
            writeln!(s, "| direct to pod (floor) | - | - | - | - | - | {:.0} / {:.0} | - | 1.00 / 1.00 ({rps:.0}/s) | - | - |", l.p50_us, l.p99_us).unwrap();
        }
        for (name, row) in &self.backends {
            match row {
                BackendRow::Measured(r) => writeln!(s, "| kpr {name} | {:.1} | {:.2} / {:.2} ({} changes) | {} | {} / {} | {} | {} | {} | {} | {} | {} |",
                    r.first_sync_ms, r.change_p50_ms, r.change_p99_ms, r.changes,
                    r.kernel_mem_kib.map_or("-".into(), |k| k.to_string()),
                    opt(r.agent_first_sync_s, 2), opt(r.agent_vmhwm_mib, 1),
                    lat(&r.latency_10), lat(&r.latency_n), growth(&r.latency_n, &r.latency_10, r.loopback_ratio_n, r.loopback_ratio_10),
                    vs_direct(r), opt(r.rr_deviation_pct, 1), r.lc_spread.as_deref().unwrap_or("-")).unwrap(),
                BackendRow::NotAvailable(why) => writeln!(s, "| kpr {name} | not available: {} |||||||||| ", why.replace('|', "/")).unwrap(),
                BackendRow::Failed(why) => writeln!(s, "| kpr {name} | FAILED: {} |||||||||| ", why.replace('|', "/").replace('\n', " ")).unwrap(),
            }
        }
        for b in &self.baselines {
            writeln!(
                s,
                "| {} @{} | {:.1} | {} ({}) | {} | n/a | {} | {} | {} | {} | {} | n/a |",
                b.name,
                b.services,
                b.load_ms,
                opt(b.change_ms, 1),
                b.change_what,
                b.kernel_mem_kib.map_or("-".into(), |k| k.to_string()),
                lat(&b.latency_10),
                lat(&b.latency_n),
                growth(
                    &b.latency_n,
                    &b.latency_10,
                    b.loopback_ratio_n,
                    b.loopback_ratio_10
                ),
                pair(b.direct_latency_ratio, b.rps_ratio),
                opt(b.rr_deviation_pct, 1)
            )
            .unwrap();
        }
        if let Some(c) = &self.control_plane {
            s.push_str(&control_plane_markdown(c));
        }
        s.push_str(&self.direct_notes());
        for (name, row) in &self.backends {
            if let BackendRow::Measured(r) = row {
                for note in &r.notes {
                    writeln!(s, "\nkpr {name}: {note}").unwrap();
                }
            }
        }
        for f in &self.failures {
            writeln!(s, "\nFAILED: {f}").unwrap();
        }
        for layout in [
            "kube-proxy nftables",
            "kube-proxy iptables (iptables-nft-restore)",
        ] {
            if let Some(g) = self.growth(layout) {
                s.push('\n');
                s.push_str(&g);
            }
        }
        s
    }

    /// Each backend's interleaved direct measurement (what its "vs direct" ratios divide by).
    fn direct_notes(&self) -> String {
        let mut s = String::new();
        for (name, row) in &self.backends {
            if let BackendRow::Measured(r) = row {
                if let (Some(d), Some(rps), Some(ratio)) = (r.direct, r.rps, r.rps_ratio) {
                    writeln!(s, "\nkpr {name}: direct to the pod from the same client (namespace and cgroup), interleaved with the Service in {} blocks: p50/p99 {:.0} / {:.0} µs, {:.0} req/s (Service {:.0} req/s).",
                        super::traffic::BLOCKS, d.p50_us, d.p99_us, rps / ratio, rps).unwrap();
                }
            }
        }
        s
    }

    /// The measured growth of a baseline's load time (the rows named `layout`, at growing sizes)
    /// and its extrapolation to N.
    fn growth(&self, layout: &str) -> Option<String> {
        let pts: Vec<(usize, f64)> = self
            .baselines
            .iter()
            .filter(|b| b.name == layout)
            .map(|b| (b.services, b.load_ms))
            .collect();
        let (&(n1, t1), &(n2, t2)) = (pts.get(pts.len().checked_sub(2)?)?, pts.last()?);
        if n2 <= n1 || t1 <= 0.0 {
            return None;
        }
        let k = (t2 / t1).ln() / (n2 as f64 / n1 as f64).ln();
        let at_n = t2 * (self.services as f64 / n2 as f64).powf(k);
        let listed: Vec<String> = pts
            .iter()
            .map(|(n, t)| format!("{n}: {:.0} ms", t))
            .collect();
        Some(format!("{layout} layout load time, measured: {}; growth exponent {k:.2} between {n1} and {n2}; extrapolated to {}: {:.0} s (not measured).\n",
            listed.join(", "), self.services, at_n / 1e3))
    }

    /// A horizontal bar chart of p50 latency at N per dataplane, with the first sync/load time.
    pub fn svg(&self) -> String {
        let mut bars: Vec<(String, f64, String)> = Vec::new();
        if let Some((l, _)) = &self.direct {
            bars.push(("direct to pod".into(), l.p50_us, String::new()));
        }
        for (name, row) in &self.backends {
            if let BackendRow::Measured(r) = row {
                if let Some(l) = r.latency_n {
                    bars.push((
                        format!("kpr {name}"),
                        l.p50_us,
                        format!("sync {:.0} ms", r.first_sync_ms),
                    ));
                }
            }
        }
        for b in &self.baselines {
            if let Some(l) = b.latency_n {
                bars.push((
                    format!("{} @{}", b.name, b.services),
                    l.p50_us,
                    format!("load {:.0} ms", b.load_ms),
                ));
            }
        }
        let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
        let (w, row, left) = (1000.0, 28.0, 380.0);
        let h = 60.0 + row * bars.len() as f64;
        let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n");
        writeln!(s, "<text x=\"10\" y=\"20\" font-size=\"14\">p50 connect+request latency to the last Service of {} (µs), {}</text>", self.services, self.kernel).unwrap();
        for (k, (label, v, note)) in bars.iter().enumerate() {
            let y = 40.0 + row * k as f64;
            let len = (w - left - 180.0) * v / max;
            writeln!(
                s,
                "<text x=\"10\" y=\"{:.0}\">{}</text>",
                y + 15.0,
                xml(label)
            )
            .unwrap();
            writeln!(s, "<rect x=\"{left}\" y=\"{y:.0}\" width=\"{len:.1}\" height=\"20\" fill=\"#4878a8\"/>").unwrap();
            writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.0}\">{v:.0} µs {}</text>",
                left + len + 5.0,
                y + 15.0,
                xml(note)
            )
            .unwrap();
        }
        s.push_str("</svg>\n");
        s
    }

    /// Prints the table and writes bench.json, bench.svg and BENCHMARKS.md under the out dir.
    pub fn write(&self) -> anyhow::Result<()> {
        let md = self.markdown();
        println!("\n{md}");
        let json = serde_json::to_string_pretty(self)?;
        for (file, text) in [
            ("bench.json", json),
            ("bench.svg", self.svg()),
            ("BENCHMARKS.md", md),
        ] {
            let path = self.out_dir.join(file);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        Ok(())
    }
}

/// A backend's "vs direct" cell: median block p50 ratio / req/s ratio (paired measurement).
fn vs_direct(r: &BackendResult) -> String {
    pair(r.direct_latency_ratio, r.rps_ratio)
}

/// `a / b` with two decimals each, `-` where missing.
fn pair(a: Option<f64>, b: Option<f64>) -> String {
    format!("{} / {}", opt(a, 2), opt(b, 2))
}

/// `s` escaped for SVG text and attributes.
pub(crate) fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The control-plane row: each controller's cold start on the same seeded objects.
fn control_plane_markdown(c: &ColdStart) -> String {
    let mut s = String::new();
    writeln!(s, "\nControl plane: EndpointSlice cold start against the reference kube-apiserver {} (a fresh control plane per controller, seeded through the API with {} Services x {} Running, Ready Pods), from the controller's process start until every Service has all its ready endpoints in its slices:\n", c.kubernetes, c.services, c.pods_per_service).unwrap();
    s.push_str("| controller | cold start (s) | slices | seeding (s) |\n|---|---|---|---|\n");
    for r in &c.runs {
        let result = match (&r.seconds, &r.error) {
            (Some(secs), _) => format!("**{secs:.2}**"),
            (None, Some(e)) => format!("FAILED: {}", e.replace('|', "/").replace('\n', " ")),
            (None, None) => "-".into(),
        };
        writeln!(
            s,
            "| {} ({}) | {result} | {} | {:.1} |",
            r.controller, r.managed_by, r.slices, r.seed_seconds
        )
        .unwrap();
    }
    s
}

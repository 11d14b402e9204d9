//! `cargo xtask cluster e2e`: upstream's end-to-end suite (`e2e.test` of the pinned release, run by
//! the ginkgo CLI in parallel processes) against a running cluster with real nodes, and the
//! report of what passed, failed and was skipped (with the reason the suite gave).
//!
//! The suite runs inside the cluster network's namespace, as upstream runs it on a host of kind's
//! Docker network: some tests connect to node IPs and NodePorts from the test process itself.
//!
//! Owns: `<cluster dir>/e2e` (the suite's reports) and the reading of ginkgo's JSON report.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};
use clap::Args;
use controlplane::network::netns_path;
use serde_json::Value;

use super::{usage, Cluster};
use crate::exec::Cmd;

/// The Services tests the issue's table covers.
pub const SERVICES_FOCUS: &str = r"\[sig-network\] Services ";

#[derive(Debug, Clone, Args)]
pub struct E2eArgs {
    /// Which specs (a ginkgo regular expression over the full spec text).
    #[arg(long, default_value = SERVICES_FOCUS)]
    pub focus: String,
    /// Which specs not to run.
    #[arg(long)]
    pub skip: Option<String>,
    /// Parallel ginkgo processes.
    #[arg(long, default_value_t = 4)]
    pub procs: usize,
}

/// One spec's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub name: String,
    /// passed, failed, skipped, panicked, timedout, interrupted.
    pub state: String,
    /// The failure or skip message (first line).
    pub message: String,
}

/// Runs the suite and returns every spec that ran or was skipped at run time.
pub fn run(cluster: &Cluster, args: &E2eArgs) -> anyhow::Result<Vec<Outcome>> {
    let state = super::read_state(cluster)?;
    let kubeconfig = state["kubeconfig"]
        .as_str()
        .context("the cluster's state names no kubeconfig")?
        .to_string();
    let nodes = state["nodes"].as_u64().unwrap_or(0);
    if nodes == 0 {
        bail!(
            "cluster {} has no real nodes: `cargo xtask cluster up --nodes N`",
            cluster.name
        );
    }
    let bin = crate::k8s::bin_dir();
    let out = cluster.dir.join("e2e");
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    fs::create_dir_all(&out)?;
    let hub = netns_path(&format!("{}-net", cluster.name));
    let started = Instant::now();
    let mut cmd = Cmd::new("nsenter")
        .arg(format!("--net={}", hub.display()))
        .arg("--")
        .arg(bin.join("ginkgo"))
        .arg(format!("--procs={}", args.procs.max(1)))
        .arg(format!("--focus={}", args.focus))
        .args([
            "--no-color",
            "--succinct",
            "--timeout=3h",
            "--json-report=report.json",
        ])
        .arg(format!("--output-dir={}", out.display()));
    if let Some(skip) = &args.skip {
        cmd = cmd.arg(format!("--skip={skip}"));
    }
    let ran = cmd
        .arg(bin.join("e2e.test"))
        .arg("--")
        .arg(format!("--kubeconfig={kubeconfig}"))
        .args(["--provider=local", "--e2e-verify-service-account=false"])
        // Without it the framework takes the node count as unknown and skips multi-node specs.
        .arg(format!("--num-nodes={nodes}"))
        .arg(format!("--report-dir={}", out.display()))
        .env("KUBECONFIG", &kubeconfig)
        .dir(&out)
        .run();
    let mut outcomes = read_report(&out.join("report.json")).with_context(|| match &ran {
        Ok(()) => "the suite passed but left no report".to_string(),
        Err(e) => format!("the suite failed ({e:#}) and left no report"),
    })?;
    outcomes.extend(panics_outcome(cluster));
    print_outcomes(&outcomes);
    println!(
        "e2e: {} passed, {} failed, {} skipped in {:.0} s (report: {})",
        count(&outcomes, "passed"),
        outcomes.iter().filter(|o| failed(o)).count(),
        count(&outcomes, "skipped"),
        started.elapsed().as_secs_f64(),
        out.join("report.json").display()
    );
    Ok(outcomes)
}

/// A failed outcome when a process of the cluster (kpr's controller-manager and scheduler, the
/// proxies, ...) printed a Rust panic since `cluster up`: the suite may pass over a panic the
/// controllers' workers caught and retried past, and that is still a bug.
fn panics_outcome(cluster: &Cluster) -> Option<Outcome> {
    let logs = cluster.dir.join("logs");
    let found = controlplane::PanicGuard::from_start(&logs, "the cluster's life")
        .into_result()
        .err()?;
    eprintln!("{found}");
    Some(Outcome {
        name: format!("(no Rust panic in the process logs of {})", logs.display()),
        state: "failed".into(),
        message: found.replace('\n', " | "),
    })
}

fn count(outcomes: &[Outcome], state: &str) -> usize {
    outcomes.iter().filter(|o| o.state == state).count()
}

pub fn failed(o: &Outcome) -> bool {
    !matches!(o.state.as_str(), "passed" | "skipped")
}

fn print_outcomes(outcomes: &[Outcome]) {
    for o in outcomes {
        let mark = match o.state.as_str() {
            "passed" => "[pass]",
            "skipped" => "[skip]",
            _ => "[FAIL]",
        };
        if o.message.is_empty() {
            println!("{mark} {}", o.name);
        } else {
            println!("{mark} {}  -- {}", o.name, o.message);
        }
    }
}

/// Reads ginkgo's JSON report: the specs that ran, and those skipped at run time (they carry
/// the reason); specs the focus filtered out carry no message and are left out.
pub fn read_report(path: &Path) -> anyhow::Result<Vec<Outcome>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let suites: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let mut outcomes = Vec::new();
    for suite in suites.as_array().into_iter().flatten() {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"].as_str() != Some("It") {
                continue;
            }
            let state = spec["State"].as_str().unwrap_or("unknown").to_string();
            let message = spec["Failure"]["Message"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default()
                .trim()
                .to_string();
            if state == "skipped" && message.is_empty() {
                continue;
            }
            let mut words: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let leaf = spec["LeafNodeText"].as_str().unwrap_or_default();
            words.push(leaf);
            outcomes.push(Outcome {
                name: words.join(" "),
                state,
                message,
            });
        }
    }
    outcomes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(outcomes)
}

/// Where `cargo xtask cluster matrix` keeps each proxy's outcomes and the table.
pub fn results_dir() -> PathBuf {
    crate::target_dir().join("e2e")
}

/// Whole control planes the table can compare (`--proxies` takes them too): `upstream`, kube-proxy
/// (nftables), kube-controller-manager and kube-scheduler; `kpr-alone`, kpr's agent (nftables),
/// controller-manager (`--controllers kpr-only`) and scheduler, none of the three upstream
/// components (the harness checks). For upstream's `[Conformance]` suite side by side.
pub const PLANES: &[&str] = &["upstream", "kpr-alone"];

/// Every Service proxy the e2e table compares, as `--proxies` names them.
pub const PROXIES: &[&str] = &[
    "kube-proxy-iptables",
    "kube-proxy-nftables",
    "kpr-userspace",
    "kpr-iptables",
    "kpr-nftables",
    "kpr-ebpf",
];

#[derive(Debug, Clone, Args)]
pub struct MatrixArgs {
    /// Which proxies (or whole control planes: `upstream`, `kpr-alone`), comma-separated
    /// (default: every proxy).
    #[arg(long, value_delimiter = ',', default_values_t = PROXIES.iter().map(|p| p.to_string()))]
    pub proxies: Vec<String>,
    /// Real nodes per cluster (3: one spec needs three schedulable nodes).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Run nothing: write the table from the outcomes already in `<target>/e2e` (runs of
    /// several `--name`s side by side each write their proxies' files there).
    #[arg(long)]
    pub table_only: bool,
    /// Which build of kpr's binaries the clusters run.
    #[arg(long, value_enum, default_value_t = crate::Profile::Release)]
    pub binaries: crate::Profile,
    /// Deploy kind's default storage on every cluster (`cluster up --local-path`: the
    /// local-path-provisioner and its default WaitForFirstConsumer StorageClass `standard`), so
    /// the storage and StatefulSet specs that need a default class run instead of skipping.
    #[arg(long)]
    pub local_path: bool,
    /// Keep this run's outcomes and table in `<target>/e2e/<RESULTS>` instead of
    /// `<target>/e2e`, so a focused run (the storage specs, say) does not replace the files of a
    /// full one.
    #[arg(long)]
    pub results: Option<String>,
    #[command(flatten)]
    pub e2e: E2eArgs,
}

/// The cluster the matrix and the smoke use (never the user's default one).
const MATRIX_CLUSTER: &str = "e2e";

/// `cargo xtask cluster matrix`: for each proxy, a fresh cluster with it, the suite, the cluster
/// down; then the table of every spec by proxy (`<target>/e2e/E2E.md`).
pub fn matrix(name: &str, args: &MatrixArgs) -> anyhow::Result<()> {
    // Never the user's default cluster.
    let cluster = Cluster::named(if name == "kpr" { MATRIX_CLUSTER } else { name })?;
    let dir = match &args.results {
        Some(sub) => results_dir().join(sub),
        None => results_dir(),
    };
    fs::create_dir_all(&dir)?;
    let mut columns = Vec::new();
    for proxy in args.proxies.iter().filter(|_| !args.table_only) {
        let up_args = super::UpArgs {
            local_path: args.local_path,
            ..up_args_for(proxy, args.nodes, args.binaries)?
        };
        let started = Instant::now();
        super::teardown(&cluster);
        let result = super::up(&cluster, &up_args).and_then(|()| {
            // The components' use idle (a minute after the cluster is up), then over the suite.
            let idle = usage::measure(&cluster, IDLE_WINDOW);
            let sampler = usage::Sampler::start(&cluster);
            let outcomes = run(&cluster, &args.e2e);
            let suite = sampler.stop();
            outcomes.map(|o| (o, Some((idle, suite))))
        });
        let took = started.elapsed().as_secs();
        super::down(&cluster)?;
        let (outcomes, used) = match result {
            Ok(ran) => ran,
            Err(e) => {
                // One proxy that cannot come up must not cost the others their run.
                eprintln!("error: the e2e run with {proxy}: {e:#}");
                let failed = vec![Outcome {
                    name: "(cluster up and suite run)".into(),
                    state: "failed".into(),
                    message: format!("{e:#}")
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                }];
                (failed, None)
            }
        };
        let json: Vec<Value> = outcomes
            .iter()
            .map(|o| serde_json::json!({"name": o.name, "state": o.state, "message": o.message}))
            .collect();
        fs::write(
            dir.join(format!("{proxy}.json")),
            serde_json::to_string_pretty(
                &serde_json::json!({"proxy": proxy, "seconds": took, "outcomes": json,
                    "usage": used.as_ref().map(|(idle, suite)| serde_json::json!({"idle": idle, "suite": suite}))}),
            )?,
        )?;
        if let Some((idle, suite)) = &used {
            println!("{}", usage_table(proxy, idle, suite));
        }
        columns.push((proxy.clone(), took, outcomes));
    }
    if args.table_only {
        columns = read_results(&dir)?;
    }
    let table = table(&columns);
    fs::write(dir.join("E2E.md"), &table)?;
    println!("{table}");
    println!("written to {}", dir.join("E2E.md").display());
    Ok(())
}

/// How long the components' idle use is measured for, once the cluster is up.
const IDLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Markdown: each component's CPU idle and over the suite, and its peak memory.
fn usage_table(cluster: &str, idle: &usage::Usage, suite: &usage::Usage) -> String {
    let mut out = format!(
        "| {cluster}: component | instances | idle CPU (% of a core) | CPU over the suite (s, {:.0} s) | peak RSS of one instance (MiB) |\n|---|---|---|---|---|\n",
        suite.seconds
    );
    for (name, s) in &suite.components {
        let idle_pct = idle
            .components
            .get(name)
            .map(|i| 100.0 * i.cpu_seconds / idle.seconds.max(1.0))
            .unwrap_or(0.0);
        out.push_str(&format!(
            "| {name} | {} | {idle_pct:.1} | {:.1} | {:.1} |\n",
            s.instances, s.cpu_seconds, s.peak_rss_mib
        ));
    }
    out
}

/// Every proxy's (and control plane's) outcomes saved in `dir`, in [`PROXIES`] then [`PLANES`]
/// order.
fn read_results(dir: &Path) -> anyhow::Result<Vec<(String, u64, Vec<Outcome>)>> {
    let mut columns = Vec::new();
    for proxy in PROXIES.iter().chain(PLANES) {
        let path = dir.join(format!("{proxy}.json"));
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let saved: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let outcomes = saved["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| Outcome {
                name: o["name"].as_str().unwrap_or_default().to_string(),
                state: o["state"].as_str().unwrap_or_default().to_string(),
                message: o["message"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        columns.push((
            proxy.to_string(),
            saved["seconds"].as_u64().unwrap_or(0),
            outcomes,
        ));
    }
    Ok(columns)
}

/// The `cluster up` arguments for a `--proxies` name.
fn up_args_for(
    proxy: &str,
    nodes: usize,
    binaries: crate::Profile,
) -> anyhow::Result<super::UpArgs> {
    use super::nodes::{Mode, Proxy};
    use super::{Controllers, Who};
    let mut controllers = Controllers::Upstream;
    let mut scheduler = Who::Upstream;
    let (proxy, backend, mode) = match proxy {
        "kube-proxy-iptables" => (Proxy::KubeProxy, "nftables", Mode::Iptables),
        "kube-proxy-nftables" | "upstream" => (Proxy::KubeProxy, "nftables", Mode::Nftables),
        "kpr-alone" => {
            controllers = Controllers::KprOnly;
            scheduler = Who::Kpr;
            (Proxy::Kpr, "nftables", Mode::Nftables)
        }
        kpr => match kpr.strip_prefix("kpr-") {
            Some(b) if crate::deploy::BACKENDS.contains(&b) => (Proxy::Kpr, b, Mode::Nftables),
            _ => bail!(
                "unknown proxy {kpr:?}: expected one of {}, or a control plane: {}",
                PROXIES.join(", "),
                PLANES.join(", ")
            ),
        },
    };
    Ok(super::UpArgs {
        controllers,
        scheduler,
        kwok_nodes: 0,
        nodes,
        proxy,
        backend: backend.to_string(),
        mode,
        binaries,
        ip_family: crate::deploy::IpFamilies::Ipv4,
        metrics_server: false,
        local_path: false,
    })
}

/// Markdown: totals per proxy, then one row per spec that any proxy did not pass.
fn table(columns: &[(String, u64, Vec<Outcome>)]) -> String {
    let mut out =
        String::from("| cluster | passed | failed | skipped | minutes |\n|---|---|---|---|---|\n");
    for (proxy, took, outcomes) in columns {
        out.push_str(&format!(
            "| {proxy} | {} | {} | {} | {:.1} |\n",
            count(outcomes, "passed"),
            outcomes.iter().filter(|o| failed(o)).count(),
            count(outcomes, "skipped"),
            *took as f64 / 60.0
        ));
    }
    let mut names: Vec<&str> = columns
        .iter()
        .flat_map(|(_, _, o)| o.iter().map(|o| o.name.as_str()))
        .collect();
    names.sort();
    names.dedup();
    out.push_str("\n| spec |");
    for (proxy, _, _) in columns {
        out.push_str(&format!(" {proxy} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(columns.len()));
    out.push('\n');
    for name in names {
        let short = name.trim_start_matches("[sig-network] Services ");
        out.push_str(&format!("| {short} |"));
        for (_, _, outcomes) in columns {
            let cell = match outcomes.iter().find(|o| o.name == name) {
                Some(o) if o.state == "passed" => "pass".to_string(),
                Some(o) if o.state == "skipped" => "skip".to_string(),
                Some(o) => format!("**{}**", o.state.to_uppercase()),
                None => "-".to_string(),
            };
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out
}

/// The e2e smoke of `cargo xtask test`: a one-node dual-stack cluster with kpr (nftables), a
/// handful of the Services specs, then `cluster smoke` (both families, client addresses), then
/// scenario 1 of `cluster chaos` (the agent's DaemonSet restarted under load: no failed or
/// broken TCP connection), the cluster down whatever happened.
pub fn smoke() -> anyhow::Result<()> {
    let cluster = Cluster::named("smoke")?;
    super::teardown(&cluster);
    // The debug binaries `cargo xtask test` built and tested: a release build only for this
    // would cost CI minutes and prove nothing more about the rules they program.
    let up_args = super::UpArgs {
        ip_family: crate::deploy::IpFamilies::Dual,
        ..up_args_for("kpr-nftables", 1, crate::Profile::Debug)?
    };
    let e2e_args = E2eArgs {
        focus: SMOKE_FOCUS.to_string(),
        skip: None,
        procs: 2,
    };
    let result = super::up(&cluster, &up_args)
        .and_then(|()| run(&cluster, &e2e_args))
        .and_then(|outcomes| super::smoke::run(&cluster).map(|()| outcomes))
        .and_then(|outcomes| {
            super::chaos::run(&cluster, &super::chaos::ChaosArgs::restart_smoke())?
                .check_tcp_unbroken()
                .context("`cluster chaos agent-restart` on the smoke cluster")?;
            Ok(outcomes)
        });
    let passed = matches!(&result, Ok(outcomes) if !outcomes.iter().any(failed));
    if !passed {
        // A failed smoke on a CI machine is only explainable from what the cluster's processes
        // were doing at that moment; after `down` it is gone.
        super::diagnose(&cluster);
    }
    super::down(&cluster)?;
    let outcomes = result?;
    let failures: Vec<&str> = outcomes
        .iter()
        .filter(|o| failed(o))
        .map(|o| o.name.as_str())
        .collect();
    if outcomes.iter().filter(|o| o.state == "passed").count() < 3 {
        bail!("the e2e smoke ran fewer specs than it selects: {outcomes:?}");
    }
    if !failures.is_empty() {
        bail!("e2e smoke failures: {failures:?}");
    }
    Ok(())
}

/// ClusterIP, multi-port, NodePort and session affinity: the paths every backend programs.
const SMOKE_FOCUS: &str = r"\[sig-network\] Services should (serve a basic endpoint from pods|serve multiport endpoints from pods|be able to create a functioning NodePort service|have session affinity work for service with type clusterIP)";

#[cfg(test)]
mod tests {
    use super::*;

    /// `kpr-alone` is kpr's agent, controller-manager alone and scheduler; `upstream` the three
    /// upstream components; a name that is neither is refused with both lists.
    #[test]
    fn control_planes_map_to_their_components() {
        use crate::cluster::nodes::Proxy;
        use crate::cluster::{Controllers, Who};
        let kpr = up_args_for("kpr-alone", 2, crate::Profile::Debug).unwrap();
        assert_eq!(
            (
                kpr.controllers,
                kpr.scheduler,
                kpr.proxy,
                kpr.backend.as_str()
            ),
            (Controllers::KprOnly, Who::Kpr, Proxy::Kpr, "nftables")
        );
        let up = up_args_for("upstream", 2, crate::Profile::Debug).unwrap();
        assert_eq!(
            (up.controllers, up.scheduler, up.proxy),
            (Controllers::Upstream, Who::Upstream, Proxy::KubeProxy)
        );
        let err = up_args_for("kpr-everything", 2, crate::Profile::Debug)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kpr-alone") && err.contains("kube-proxy-nftables"),
            "{err}"
        );
    }

    #[test]
    fn a_panic_in_a_cluster_process_log_is_a_failed_outcome() {
        let dir = std::env::temp_dir().join(format!("kpr-e2e-panics-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("logs")).unwrap();
        let cluster = Cluster {
            name: "t".into(),
            dir: dir.clone(),
        };
        fs::write(dir.join("logs/kube-apiserver.log"), "I0101 serving\n").unwrap();
        assert_eq!(panics_outcome(&cluster), None);
        fs::write(
            dir.join("logs/kpr-controller-manager.log"),
            "INFO synced\nthread 'w' panicked at controllers/src/x.rs:1:2:\nboom\n",
        )
        .unwrap();
        let o = panics_outcome(&cluster).expect("a failed outcome");
        fs::remove_dir_all(&dir).unwrap();
        assert!(failed(&o));
        assert!(o.message.contains("kpr-controller-manager.log"), "{o:?}");
        assert!(
            o.message.contains("x.rs:1:2: | ") || o.message.contains("boom"),
            "{o:?}"
        );
    }

    #[test]
    fn the_report_keeps_run_and_runtime_skipped_specs() {
        let dir = std::env::temp_dir().join(format!("kpr-e2e-report-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.json");
        let report = serde_json::json!([{"SpecReports": [
            {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-network] Services"],
             "LeafNodeText": "should serve", "State": "passed"},
            {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-network] Services"],
             "LeafNodeText": "needs ssh", "State": "skipped",
             "Failure": {"Message": "\nOnly supported for providers [gce gke]\n"}},
            {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-apps] Jobs"],
             "LeafNodeText": "filtered out", "State": "skipped"},
            {"LeafNodeType": "BeforeSuite", "State": "passed"},
            {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[sig-network] Services"],
             "LeafNodeText": "breaks", "State": "failed", "Failure": {"Message": "timed out"}}
        ]}]);
        fs::write(&path, report.to_string()).unwrap();
        let outcomes = read_report(&path).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        let summary: Vec<(&str, &str, &str)> = outcomes
            .iter()
            .map(|o| (o.name.as_str(), o.state.as_str(), o.message.as_str()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("[sig-network] Services breaks", "failed", "timed out"),
                (
                    "[sig-network] Services needs ssh",
                    "skipped",
                    "Only supported for providers [gce gke]"
                ),
                ("[sig-network] Services should serve", "passed", ""),
            ]
        );
    }
}

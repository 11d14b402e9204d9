//! The rig: one cluster, (for eBPF) one test cgroup, and one agent per test; runs the steps.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::family::{is_node_address, Family};
use super::trace;
use super::{Backend, Expect, From, Probe, Scenario, Src, Step, UdpFlow};
use crate::cluster::{ClusterSpec, CLIENT_IP, ECHO_PORT, NODE_IP, PODCLIENT_IP};
use crate::probe::{parse_probe_output, probe_command, run_probe, ProbeLine};
use crate::{Agent, AgentOptions, Cgroup, Cluster, HarnessError, Netns};

const MANIFEST: &str = "scenario.yaml";
/// How long an update may take to show in `/state`.
const CHANGE: Duration = Duration::from_secs(10);
/// Pause after `/state` shows a change, for the dataplane sync that follows it.
const SETTLE: Duration = Duration::from_millis(500);

/// The cluster every scenario runs in: 4 pods with echo servers (dual-stack for IPv6 runs).
pub fn cluster(family: Family) -> Result<Cluster, HarnessError> {
    match family {
        Family::V4 => Cluster::new(ClusterSpec::pods(4)),
        Family::V6 | Family::Dual => Cluster::new(ClusterSpec::pods(4).dual_stack()),
    }
}

/// A running backend for one scenario. Field order is drop order: held clients, agent, cgroup.
pub struct Rig<'c> {
    held: Mutex<Vec<Child>>,
    agent: Agent<'c>,
    cgroup: Option<Cgroup>,
    cluster: &'c Cluster,
    backend: Backend,
    family: Family,
}

impl<'c> Rig<'c> {
    /// The agent for `backend` in `cluster`'s node with the scenario's manifests.
    pub fn start(
        cluster: &'c Cluster,
        backend: Backend,
        family: Family,
        sc: &Scenario,
    ) -> Result<Rig<'c>, HarnessError> {
        let cgroup = match backend {
            Backend::Ebpf => Some(Cgroup::new("conformance")?),
            _ => None,
        };
        let args = backend.agent_args();
        let mut opts = args[1..]
            .iter()
            .fold(AgentOptions::backend(args[0]), |o, a| o.arg(*a));
        if let Some(cg) = &cgroup {
            opts = opts.cgroup(cg);
        }
        if family != Family::V4 {
            opts = opts.dual_stack();
        }
        let manifests = family.manifests(&(sc.manifests)());
        let agent = Agent::start(&cluster.node, &opts, &[(MANIFEST, manifests)])?;
        // The first sync has happened once /healthz is up; give the dataplane a moment.
        std::thread::sleep(SETTLE);
        Ok(Rig {
            held: Mutex::new(Vec::new()),
            agent,
            cgroup,
            cluster,
            backend,
            family,
        })
    }

    /// Runs every step; the error names the step and what was seen.
    pub fn run(&self, sc: &Scenario) -> Result<(), String> {
        for (i, step) in sc.steps.iter().enumerate() {
            self.step(step).map_err(|e| {
                format!(
                    "step {i} ({step:?}) on {} in {}: {e}",
                    self.backend, self.family
                )
            })?;
        }
        Ok(())
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        let log = self.agent.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn step(&self, step: &Step) -> Result<(), String> {
        // A connection step runs once per family of the run (twice for dual-stack Services).
        let each = |run: &dyn Fn(Family) -> Result<(), String>| {
            self.family
                .connections()
                .iter()
                .try_for_each(|&f| run(f).map_err(|e| format!("over {f}: {e}")))
        };
        match *step {
            Step::Probe(p) => each(&|f| self.probe(&p, f)),
            Step::Hold {
                from,
                to,
                count,
                pods,
            } => each(&|f| {
                let expect = Expect::Served {
                    pods: leak(pods),
                    all_seen: false,
                    src: Src::Any,
                };
                self.hold(from, to, count, expect, f)
            }),
            Step::Burst {
                from,
                to,
                count,
                pods,
                min,
                max,
            } => each(&|f| self.hold(from, to, count, Expect::Spread { pods, min, max }, f)),
            Step::Update {
                manifests,
                service,
                endpoints,
            } => self.update(manifests, service, endpoints),
            Step::State(expected) => self.state(expected),
            Step::Http {
                from,
                to,
                status,
                body,
            } => each(&|f| self.http(from, to, status, body, f)),
            Step::UdpFlow(flow) => self.udp_flow(&flow),
        }
    }

    fn http(&self, from: From, to: &str, status: u16, body: &str, f: Family) -> Result<(), String> {
        let (ns, cg, _) = self.source(from, f);
        let to = f.text(to);
        let args = ["http", &to, "--timeout", "2"];
        let out = run_probe(ns, cg, &args).map_err(|e| e.to_string())?;
        match out.lines.as_slice() {
            [ProbeLine::Http { status: s, body: b }] if *s == status && b.contains(body) => Ok(()),
            lines => Err(format!(
                "expected HTTP {status} with {body:?} in the body, got {lines:?} {}",
                out.stderr
            )),
        }
    }

    /// Requests of the flow before the update, and at the end of it (checked against `after`).
    const FLOW_BEFORE: usize = 4;
    const FLOW_AFTER: usize = 5;

    /// One flow per family of the run, all started before the update and checked after it.
    fn udp_flow(&self, flow: &UdpFlow) -> Result<(), String> {
        let parse = |t: &str| parse_probe_output(t).map_err(|e| e.to_string());
        let mut running = Vec::new();
        for &f in self.family.connections() {
            let (ns, cg, client) = self.source(flow.from, f);
            let to = f.text(flow.to);
            // 30 requests, 200 ms apart: about 6 s, long enough for the update to land in the
            // middle.
            let args = [
                "udp",
                &to,
                "--session",
                "--count",
                "30",
                "--every",
                "200",
                "--timeout",
                "1",
            ];
            let (child, stdout) = spawn_piped(ns, cg, &args)?;
            let mut lines = BufReader::new(stdout).lines();
            let mut text = String::new();
            for line in lines.by_ref().take(Self::FLOW_BEFORE) {
                text.push_str(&line.map_err(|e| e.to_string())?);
                text.push('\n');
            }
            check(&flow.before, &parse(&text)?, client)
                .map_err(|e| format!("over {f}, before the update: {e}"))?;
            running.push((f, child, lines, client));
        }
        self.update(flow.update, flow.service, flow.endpoints)?;
        for (f, mut child, lines, client) in running {
            let rest: Vec<String> = lines.map_while(Result::ok).collect();
            let _ = child.wait();
            let tail = rest[rest.len().saturating_sub(Self::FLOW_AFTER)..].join("\n");
            if rest.len() < Self::FLOW_AFTER {
                return Err(format!("over {f}: the flow ended early: {rest:?}"));
            }
            check(&flow.after, &parse(&tail)?, client).map_err(|e| {
                format!(
                    "over {f}: the flow's last {} requests after the update: {e}; after the \
                     update it saw {rest:?}",
                    Self::FLOW_AFTER
                )
            })?;
        }
        Ok(())
    }

    fn source(&self, from: From, f: Family) -> (&Netns, Option<&Cgroup>, Option<IpAddr>) {
        let c = self.cluster;
        let cg = self.cgroup.as_ref();
        match from {
            From::Pod => (&c.podclient, cg, Some(f.addr(PODCLIENT_IP))),
            From::Node => (&c.node, cg, None),
            From::External => (&c.client, None, Some(f.addr(CLIENT_IP))),
            From::Endpoint(i) => (&c.pods[i].ns, cg, Some(f.addr(c.pods[i].ip))),
        }
    }

    /// Traces the probe's connections (every backend, see [`trace`]), runs them, checks them
    /// against the scenario's expectation and then against the trace.
    fn probe(&self, p: &Probe, f: Family) -> Result<(), String> {
        let src = self.source_addr(p.from, f);
        let to = format!("{}/{}", f.text(p.to), p.proto.as_str());
        let extra = self.trace_source_args(p.from);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let text = self.trace(src, &to, &extra)?;
        let (lines, args) = self.probe_lines(p, f)?;
        let client = self.source(p.from, f).2;
        check(&p.expect, &lines, client).map_err(|e| format!("{e}; probe {args:?}"))?;
        let disagree = |e: String, text: &str| {
            format!(
                "proxy trace {src} {to} disagrees with the traffic: {e}; probe {args:?}: \
                 {lines:?}\n--- proxy trace ---\n{text}"
            )
        };
        let pod_addr = |name: &str| {
            self.cluster
                .pod(name)
                .map(|pod| SocketAddr::new(f.addr(pod.ip), ECHO_PORT))
        };
        let sticky = p.expect == Expect::Sticky;
        trace::parse(&text)
            .and_then(|t| trace::agree(&t, &pod_addr, &lines, sticky))
            .map_err(|e| disagree(e, &text))?;
        if sticky {
            // The connections made the client's affinity entry: the trace now names it.
            let after = self.trace(src, &to, &extra)?;
            trace::names_affinity(&after, &pod_addr, &lines).map_err(|e| disagree(e, &after))?;
        }
        Ok(())
    }

    /// `proxy trace` arguments naming where a connection from `from` starts: for eBPF the
    /// agent's pins and the client's network namespace (the socket path; its affinity entries
    /// are per namespace), or `--from-outside` (the tc path); nothing for the other backends,
    /// whose trace takes the source address alone.
    fn trace_source_args(&self, from: From) -> Vec<String> {
        let Some(pins) = self.agent.bpffs_path() else {
            return Vec::new();
        };
        let mut args = vec!["--bpffs-path".to_string(), pins.display().to_string()];
        match from {
            From::External => args.push("--from-outside".into()),
            _ => {
                let ns = self.source(from, Family::V4).0;
                args.extend(["--netns".into(), format!("/run/netns/{}", ns.name())]);
            }
        }
        args
    }

    /// Runs the probe's connections over `f` and returns what each got (and the probe's
    /// arguments, to name it), without checking them.
    pub fn probe_lines(&self, p: &Probe, f: Family) -> Result<(Vec<ProbeLine>, String), String> {
        let (ns, cg, _) = self.source(p.from, f);
        let count = p.count.to_string();
        let proto = p.proto.as_str();
        let timeout = match p.expect {
            Expect::Drop | Expect::NotServed | Expect::Reject | Expect::Error(_) => "1",
            _ => "2",
        };
        let every = p.every_ms.to_string();
        let to = f.text(p.to);
        let mut args = vec![proto, &to, "--count", &count, "--timeout", timeout];
        if p.every_ms > 0 {
            args.extend(["--every", &every]);
        }
        let out = run_probe(ns, cg, &args).map_err(|e| e.to_string())?;
        if !out.stderr.trim().is_empty() && out.lines.is_empty() {
            return Err(format!("probe {args:?} printed nothing: {}", out.stderr));
        }
        Ok((out.lines, format!("{args:?}")))
    }

    /// The address a connection from `from` leaves with over `f` (the node's: its address on
    /// the client side).
    pub fn source_addr(&self, from: From, f: Family) -> IpAddr {
        match self.source(from, f).2 {
            Some(ip) => ip,
            None => f.addr(NODE_IP),
        }
    }

    /// `proxy trace` of this rig's backend in the node's namespace for a new connection from
    /// `src` to `to` (`ADDR:PORT/PROTO`), with `extra` arguments; its output.
    pub fn trace(&self, src: IpAddr, to: &str, extra: &[&str]) -> Result<String, String> {
        let bin = crate::agent::proxy_binary().map_err(|e| e.to_string())?;
        let mut cmd = self.cluster.node.exec(bin).map_err(|e| e.to_string())?;
        cmd.arg("trace")
            .args(self.backend.trace_args())
            .args(extra)
            .arg(src.to_string())
            .arg(to);
        let out = cmd.output().map_err(|e| format!("proxy trace: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "proxy trace {src} {to} failed ({}): {}\n{text}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(text)
    }

    /// The cluster the rig runs in.
    pub fn cluster(&self) -> &Cluster {
        self.cluster
    }

    fn hold(
        &self,
        from: From,
        to: &str,
        count: usize,
        expect: Expect,
        f: Family,
    ) -> Result<(), String> {
        let (ns, cg, _) = self.source(from, f);
        let n = count.to_string();
        let to = f.text(to);
        let (child, stdout) = spawn_piped(ns, cg, &["tcp", &to, "--count", &n, "--hold", "60"])?;
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(child);
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().take(count) {
            text.push_str(&line.map_err(|e| e.to_string())?);
            text.push('\n');
        }
        let lines = parse_probe_output(&text).map_err(|e| e.to_string())?;
        check(&expect, &lines, None)?;
        if lines.len() != count {
            return Err(format!(
                "held {} of {count} connections: {text}",
                lines.len()
            ));
        }
        // Connection-tracking based accounting (least-connection) needs a moment.
        std::thread::sleep(SETTLE);
        Ok(())
    }

    fn update(&self, manifests: fn() -> String, service: &str, n: usize) -> Result<(), String> {
        self.agent
            .write_manifest(MANIFEST, &self.family.manifests(&manifests()))
            .map_err(|e| e.to_string())?;
        let n = self.family.endpoint_count(n);
        self.agent
            .wait_for(&format!("{n} endpoints for {service}"), CHANGE, |s| {
                s.service(service).is_some_and(|p| p.endpoints.len() == n)
            })
            .map_err(|e| e.to_string())?;
        std::thread::sleep(SETTLE);
        Ok(())
    }

    fn state(&self, expected: &[(&str, &[&str])]) -> Result<(), String> {
        let state = self.agent.state().map_err(|e| e.to_string())?;
        let seen: BTreeMap<String, Vec<String>> = state
            .services
            .iter()
            .map(|s| {
                let mut eps = s.endpoint_addrs();
                eps.sort();
                (s.name.clone(), eps)
            })
            .collect();
        let want: BTreeMap<String, Vec<String>> = expected
            .iter()
            .map(|(name, eps)| {
                let mut eps = self.family.state_endpoints(eps);
                eps.sort();
                (name.to_string(), eps)
            })
            .collect();
        if seen != want {
            return Err(format!("/state shows {seen:?}, expected {want:?}"));
        }
        Ok(())
    }
}

impl Drop for Rig<'_> {
    fn drop(&mut self) {
        for mut child in self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running `probe ARGS` whose output is read as it comes.
fn spawn_piped(
    ns: &Netns,
    cg: Option<&Cgroup>,
    args: &[&str],
) -> Result<(Child, std::process::ChildStdout), String> {
    let mut child = probe_command(ns, cg, args)
        .and_then(|mut c| {
            c.stdout(Stdio::piped());
            c.spawn().map_err(|e| HarnessError::Io {
                what: format!("spawning probe {args:?}"),
                source: e,
            })
        })
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("probe without stdout")?;
    Ok((child, stdout))
}

fn leak(pods: &[&str]) -> &'static [&'static str] {
    Box::leak(
        pods.iter()
            .map(|p| &*Box::leak(p.to_string().into_boxed_str()))
            .collect::<Vec<&'static str>>()
            .into_boxed_slice(),
    )
}

/// Checks probe output against `expect`; `client` is the source address for [`Src::Preserved`].
pub fn check(expect: &Expect, lines: &[ProbeLine], client: Option<IpAddr>) -> Result<(), String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut peers = Vec::new();
    for l in lines {
        match l {
            ProbeLine::Reply(r) => {
                *counts.entry(r.pod.as_str()).or_default() += 1;
                peers.push(r.peer.ip());
            }
            ProbeLine::Error(e) => errors.push(e.as_str()),
            _ => {}
        }
    }
    let n = lines.len();
    let summary = format!("answers {counts:?}, errors {errors:?}");
    let all_answered = || {
        if errors.is_empty() && n > 0 {
            Ok(())
        } else {
            Err(format!("not every request was answered: {summary}"))
        }
    };
    match *expect {
        Expect::Served {
            pods,
            all_seen,
            src,
        } => {
            all_answered()?;
            if let Some(p) = counts.keys().find(|p| !pods.contains(p)) {
                return Err(format!("{p} answered but only {pods:?} may: {summary}"));
            }
            if all_seen && counts.len() != pods.len() {
                return Err(format!("every one of {pods:?} should answer: {summary}"));
            }
            check_source(src, &peers, client)
        }
        Expect::Exact(pods) => {
            all_answered()?;
            let share = n / pods.len();
            let fair = |c: usize| c + 1 >= share && c <= share + 1;
            if counts.len() != pods.len() || !counts.values().all(|&c| fair(c)) {
                return Err(format!(
                    "{n} connections over {pods:?} should give {share} +-1 each: {summary}"
                ));
            }
            Ok(())
        }
        Expect::Spread { pods, min, max } => {
            all_answered()?;
            let outside: Vec<&&str> = counts.keys().filter(|p| !pods.contains(p)).collect();
            let within = pods
                .iter()
                .all(|p| (min..=max).contains(&counts.get(*p).copied().unwrap_or(0)));
            if !outside.is_empty() || !within {
                return Err(format!(
                    "{n} connections over {pods:?} should give each {min}..={max}: {summary}"
                ));
            }
            Ok(())
        }
        Expect::Sticky => {
            all_answered()?;
            if counts.len() != 1 {
                return Err(format!(
                    "all connections should stick to one endpoint: {summary}"
                ));
            }
            Ok(())
        }
        Expect::Reject => {
            let rejected = |e: &&str| matches!(*e, "refused" | "reset" | "unreachable");
            if !counts.is_empty() || errors.is_empty() || !errors.iter().all(rejected) {
                return Err(format!("expected an active rejection: {summary}"));
            }
            Ok(())
        }
        Expect::Drop => {
            if !counts.is_empty() || errors.is_empty() || !errors.iter().all(|e| *e == "timeout") {
                return Err(format!("expected a silent drop (timeout): {summary}"));
            }
            Ok(())
        }
        Expect::Error(kind) => {
            if !counts.is_empty()
                || errors.is_empty()
                || !errors.iter().all(|e| e.starts_with(kind))
            {
                return Err(format!(
                    "expected every request to fail with {kind:?}: {summary}"
                ));
            }
            Ok(())
        }
        Expect::NotServed => {
            if !counts.is_empty() || errors.is_empty() {
                return Err(format!("expected no endpoint to answer: {summary}"));
            }
            Ok(())
        }
    }
}

fn check_source(src: Src, peers: &[IpAddr], client: Option<IpAddr>) -> Result<(), String> {
    match src {
        Src::Any => Ok(()),
        Src::Preserved => {
            let client = client.ok_or("Src::Preserved needs a client address")?;
            match peers.iter().find(|p| **p != client) {
                Some(p) => Err(format!("the endpoint saw {p}, not the client {client}")),
                None => Ok(()),
            }
        }
        Src::Masqueraded => match peers.iter().find(|p| !is_node_address(**p)) {
            Some(p) => Err(format!(
                "the endpoint saw {p}, not a node address (masquerade)"
            )),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Reply;

    fn reply(pod: &str, peer: &str) -> ProbeLine {
        ProbeLine::Reply(Reply {
            pod: pod.into(),
            peer: peer.parse().unwrap(),
        })
    }

    #[test]
    fn checks_accept_the_right_outcome_and_reject_the_wrong_one() {
        let pc = Some(IpAddr::V4(PODCLIENT_IP));
        let ok = [
            reply("pod0", "10.244.200.2:1"),
            reply("pod1", "10.244.200.2:2"),
        ];
        let pods: &[&str] = &["pod0", "pod1"];
        let served = Expect::Served {
            pods,
            all_seen: true,
            src: Src::Preserved,
        };
        assert!(check(&served, &ok, pc).is_ok());
        let masq = Expect::Served {
            pods,
            all_seen: true,
            src: Src::Masqueraded,
        };
        assert!(check(&masq, &ok, pc).is_err());
        let natted = [reply("pod0", "192.0.2.1:1"), reply("pod1", "10.244.1.1:2")];
        assert!(check(&masq, &natted, pc).is_ok());
        assert!(check(&Expect::Exact(pods), &ok, pc).is_ok());
        assert!(check(&Expect::Sticky, &ok, pc).is_err());
        assert!(check(&Expect::Reject, &ok, pc).is_err());
        let refused = [ProbeLine::Error("refused".into())];
        let timeout = [ProbeLine::Error("timeout".into())];
        assert!(check(&Expect::Reject, &refused, pc).is_ok());
        assert!(check(&Expect::Drop, &refused, pc).is_err());
        assert!(check(&Expect::Drop, &timeout, pc).is_ok());
        assert!(check(&Expect::NotServed, &timeout, pc).is_ok());
        let uneven: Vec<_> = (0..4).map(|_| reply("pod0", "10.244.200.2:1")).collect();
        assert!(check(&Expect::Exact(pods), &uneven, pc).is_err());
    }
}

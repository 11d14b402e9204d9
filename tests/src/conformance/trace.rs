//! `proxy trace` against the traffic, on the conformance table: for each scenario of [`SCENARIOS`]
//! (round robin, NodePort, a single endpoint, session affinity, no endpoints, an unexposed port,
//! an unallocated address, loadBalancerSourceRanges, externalTrafficPolicy Local), each connection
//! step is traced first (`proxy trace` of the backend, in the node's namespace, for the step's
//! source and destination) and then run, and what the trace said is what the connections got:
//!
//! - `dnat to X (...)`: the first connection is answered by X; when the trace says X is the only
//!   endpoint or the client's affinity entry, every connection is; every connection is answered
//!   by an address the decision names (the userspace trace names the listener's candidates);
//! - `dnat to one of A, B, ...`: every connection is answered by one of them, and each of them
//!   answers when the step makes at least two connections per candidate (unless the Service has
//!   session affinity, where all stick to one);
//! - `reject (...)`: every connection is refused or reset; `drop (...)`: every one times out;
//!   `close (...)` (the userspace listener accepts, then closes): every one sees EOF.
//!
//! A step whose connections stick to one endpoint (session affinity) is traced again after it:
//! the trace must then name that endpoint, from the client's affinity entry.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::family::Family;
use super::{scenario, Backend, Expect, Rig, Step};
use crate::cluster::ECHO_PORT;
use crate::probe::ProbeLine;

/// The scenarios whose connection steps are traced.
pub const SCENARIOS: &[&str] = &[
    "cluster_ip_from_pod",
    "node_port_from_external",
    "ready_preferred_over_terminating",
    "session_affinity",
    "reject_without_endpoints",
    "port_not_exposed_is_rejected",
    "drop_unallocated_service_address",
    "load_balancer_source_range_denies",
    "external_traffic_local",
    "external_traffic_local_none_here_drops",
];

/// What the `decision:` line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Traced {
    /// `dnat to X (...)`: X, and every address the line names (X first).
    One {
        pick: SocketAddr,
        named: Vec<SocketAddr>,
        sticky: bool,
    },
    /// `dnat to one of ...`.
    OneOf(Vec<SocketAddr>),
    Reject,
    Drop,
    Close,
    Untouched,
}

/// Every `ADDR:PORT` in `text` (words trimmed of list punctuation).
fn addresses(text: &str) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for w in text.split_whitespace() {
        let w = w.trim_matches(|c| matches!(c, ',' | '(' | ')' | ';' | ':'));
        let w = w.trim_start_matches('[').trim_end_matches(']');
        let parsed = w
            .parse::<SocketAddr>()
            .or_else(|_| format!("[{w}").parse::<SocketAddr>())
            .or_else(|_| format!("{w}]").parse::<SocketAddr>());
        if let Ok(a) = parsed {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// Parses the `decision:` line of `proxy trace` output.
pub fn parse(text: &str) -> Result<Traced, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("decision: "))
        .ok_or_else(|| format!("no decision in:\n{text}"))?;
    // The rule backends translate (`dnat to`); the userspace listener opens its own connection
    // (`proxied to`).
    let line = line
        .strip_prefix("proxied to ")
        .map_or(line.to_string(), |rest| format!("dnat to {rest}"));
    let line = line.as_str();
    if let Some(rest) = line.strip_prefix("dnat to one of ") {
        let eps = addresses(rest);
        if eps.is_empty() {
            return Err(format!("no endpoint in `{line}`"));
        }
        return Ok(Traced::OneOf(eps));
    }
    if let Some(rest) = line.strip_prefix("dnat to ") {
        let named = addresses(rest);
        let pick = *named
            .first()
            .ok_or_else(|| format!("no endpoint in `{line}`"))?;
        let sticky = rest.contains("only endpoint") || rest.contains("affinity");
        return Ok(Traced::One {
            pick,
            named,
            sticky,
        });
    }
    for (prefix, t) in [
        ("reject", Traced::Reject),
        ("drop", Traced::Drop),
        ("close", Traced::Close),
        ("untouched", Traced::Untouched),
    ] {
        if line.starts_with(prefix) {
            return Ok(t);
        }
    }
    Err(format!("a decision this test does not know: `{line}`"))
}

/// A pod's endpoint address by its name (what the echo servers answer with).
pub type PodAddr<'a> = &'a dyn Fn(&str) -> Option<SocketAddr>;

/// The endpoint address of each answered connection (`None` for an error), in order.
fn answers(
    pod_addr: PodAddr<'_>,
    lines: &[ProbeLine],
) -> Result<Vec<Result<SocketAddr, String>>, String> {
    lines
        .iter()
        .filter_map(|l| match l {
            ProbeLine::Reply(r) => Some(
                pod_addr(&r.pod)
                    .map(Ok)
                    .ok_or_else(|| format!("{} answered: not a pod of the cluster", r.pod)),
            ),
            ProbeLine::Error(e) => Some(Ok(Err(e.clone()))),
            _ => None,
        })
        .collect()
}

/// Whether `lines` are what `traced` says a new connection gets; `sticky` when the Service keeps
/// a client on one endpoint.
pub fn agree(
    traced: &Traced,
    pod_addr: PodAddr<'_>,
    lines: &[ProbeLine],
    sticky_service: bool,
) -> Result<(), String> {
    let got = answers(pod_addr, lines)?;
    if got.is_empty() {
        return Err("the probe made no connection".into());
    }
    let errors_all = |kinds: &[&str]| -> Result<(), String> {
        match got
            .iter()
            .find(|g| !matches!(g, Err(e) if kinds.contains(&e.as_str())))
        {
            None => Ok(()),
            Some(g) => Err(format!(
                "expected every connection to end in {kinds:?}, one got {g:?}"
            )),
        }
    };
    let served: Vec<SocketAddr> = match traced {
        Traced::One { .. } | Traced::OneOf(_) => got
            .iter()
            .map(|g| {
                g.clone()
                    .map_err(|e| format!("a connection failed ({e}) where the trace translates it"))
            })
            .collect::<Result<_, _>>()?,
        Traced::Reject => return errors_all(&["refused", "reset", "unreachable"]),
        Traced::Drop => return errors_all(&["timeout"]),
        Traced::Close => return errors_all(&["closed"]),
        Traced::Untouched => {
            return match got.iter().find(|g| g.is_ok()) {
                None => Ok(()),
                Some(g) => Err(format!("the trace leaves it untouched, but {g:?} answered")),
            }
        }
    };
    match traced {
        Traced::One {
            pick,
            named,
            sticky,
        } => {
            if served[0] != *pick {
                return Err(format!(
                    "the first connection went to {}, the trace said {pick}",
                    served[0]
                ));
            }
            if let Some(e) = served.iter().find(|e| !named.contains(e)) {
                return Err(format!("{e} answered, the trace names only {named:?}"));
            }
            if *sticky {
                if let Some(e) = served.iter().find(|e| *e != pick) {
                    return Err(format!(
                        "{e} answered, the trace said every connection goes to {pick}"
                    ));
                }
            }
        }
        Traced::OneOf(set) => {
            if let Some(e) = served.iter().find(|e| !set.contains(e)) {
                return Err(format!("{e} answered, not one of the traced {set:?}"));
            }
            let seen: BTreeSet<&SocketAddr> = served.iter().collect();
            if !sticky_service && served.len() >= 2 * set.len() && seen.len() != set.len() {
                return Err(format!(
                    "{} connections reached only {seen:?} of the traced {set:?}",
                    served.len()
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Runs every scenario of [`SCENARIOS`] on `backend` in one cluster (an agent per scenario),
/// checking each connection step against its trace; panics naming the scenario and the step.
pub fn run(backend: Backend) {
    let cluster = super::rig::cluster(Family::V4).unwrap_or_else(|e| panic!("cluster: {e}"));
    let pod_addr = |name: &str| {
        cluster
            .pod(name)
            .map(|p| SocketAddr::new(p.ip.into(), ECHO_PORT))
    };
    for name in SCENARIOS {
        let sc = scenario(name).unwrap_or_else(|| panic!("no scenario {name}"));
        let rig = Rig::start(&cluster, backend, Family::V4, &sc)
            .unwrap_or_else(|e| panic!("{backend}::{name}: {e}"));
        for (i, step) in sc.steps.iter().enumerate() {
            let Step::Probe(p) = step else {
                panic!("{name}: step {i} is no connection step: the trace table takes probes only");
            };
            let src = rig.source_addr(p.from, Family::V4);
            let to = format!("{}/{}", p.to, p.proto.as_str());
            let fail = |what: String, trace: &str| -> ! {
                panic!(
                    "{backend}::{name} step {i} ({src} -> {to}): {what}\n--- proxy trace ---\n{trace}--- agent log (tail) ---\n{}",
                    rig.log_tail()
                )
            };
            let text = rig.trace(src, &to, &[]).unwrap_or_else(|e| fail(e, ""));
            let traced = parse(&text).unwrap_or_else(|e| fail(e, &text));
            let (lines, args) = rig
                .probe_lines(p, Family::V4)
                .unwrap_or_else(|e| fail(e, &text));
            let sticky = p.expect == Expect::Sticky;
            agree(&traced, &pod_addr, &lines, sticky)
                .unwrap_or_else(|e| fail(format!("{e}; probe {args}: {lines:?}"), &text));
            if sticky {
                // The connections made the client's affinity entry: the trace now names it.
                let after = rig.trace(src, &to, &[]).unwrap_or_else(|e| fail(e, ""));
                let traced = parse(&after).unwrap_or_else(|e| fail(e, &after));
                let first = answers(&pod_addr, &lines)
                    .ok()
                    .and_then(|a| a.first().cloned())
                    .and_then(Result::ok);
                match traced {
                    Traced::One {
                        pick, sticky: true, ..
                    } if Some(pick) == first => {}
                    other => fail(
                        format!(
                            "after the connections stuck to {first:?}, the trace says {other:?}"
                        ),
                        &after,
                    ),
                }
            }
            eprintln!("{backend}::{name} step {i}: {src} -> {to}: trace and traffic agree\n{text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_parse() {
        let t = parse("x\ndecision: dnat to one of 10.244.1.2:8080 25%, 10.244.2.2:8080 25% (statistic nth)\n").unwrap();
        assert_eq!(
            t,
            Traced::OneOf(vec![
                "10.244.1.2:8080".parse().unwrap(),
                "10.244.2.2:8080".parse().unwrap()
            ])
        );
        let t = parse("decision: dnat to 10.244.1.2:8080 (the listener's next pick of [10.244.1.2:8080, 10.244.2.2:8080]: round robin)").unwrap();
        assert!(matches!(t, Traced::One { sticky: false, ref named, .. } if named.len() == 2));
        let t = parse("decision: dnat to [fd00:10:244:1::2]:8080 (session affinity)").unwrap();
        assert!(matches!(t, Traced::One { sticky: true, .. }));
        assert_eq!(
            parse("decision: reject (the Service has no usable endpoint)").unwrap(),
            Traced::Reject
        );
        assert_eq!(
            parse("decision: drop (loadBalancerSourceRanges)").unwrap(),
            Traced::Drop
        );
        assert!(parse("no decision").is_err());
    }

    fn reply(pod: &str) -> ProbeLine {
        ProbeLine::Reply(crate::client::Reply {
            pod: pod.into(),
            peer: "10.244.200.2:1".parse().unwrap(),
        })
    }

    fn err(kind: &str) -> ProbeLine {
        ProbeLine::Error(kind.into())
    }

    /// The check fails whenever the connections did not get what the trace said.
    #[test]
    fn disagreement_fails() {
        let addr = |i: u8| -> SocketAddr { format!("10.244.{i}.2:8080").parse().unwrap() };
        let pods = |name: &str| {
            name.strip_prefix("pod")?
                .parse::<u8>()
                .ok()
                .map(|i| addr(i + 1))
        };
        let one = Traced::One {
            pick: addr(1),
            named: vec![addr(1), addr(2)],
            sticky: false,
        };
        assert!(agree(&one, &pods, &[reply("pod0"), reply("pod1")], false).is_ok());
        assert!(
            agree(&one, &pods, &[reply("pod1"), reply("pod0")], false).is_err(),
            "first"
        );
        assert!(
            agree(&one, &pods, &[reply("pod0"), reply("pod2")], false).is_err(),
            "named"
        );
        let sticky = Traced::One {
            pick: addr(1),
            named: vec![addr(1)],
            sticky: true,
        };
        assert!(agree(&sticky, &pods, &[reply("pod0"), reply("pod1")], true).is_err());
        let set = Traced::OneOf(vec![addr(1), addr(2)]);
        let rr = [reply("pod0"), reply("pod1"), reply("pod0"), reply("pod1")];
        assert!(agree(&set, &pods, &rr, false).is_ok());
        let one_only = [reply("pod0"), reply("pod0"), reply("pod0"), reply("pod0")];
        assert!(
            agree(&set, &pods, &one_only, false).is_err(),
            "each answers"
        );
        assert!(
            agree(&set, &pods, &one_only, true).is_ok(),
            "affinity sticks"
        );
        assert!(agree(&set, &pods, &[reply("pod0"), err("timeout")], false).is_err());
        assert!(agree(&Traced::Reject, &pods, &[err("reset")], false).is_ok());
        assert!(agree(&Traced::Reject, &pods, &[err("timeout")], false).is_err());
        assert!(agree(&Traced::Drop, &pods, &[err("refused")], false).is_err());
        assert!(agree(&Traced::Drop, &pods, &[reply("pod0")], false).is_err());
        assert!(agree(&Traced::Close, &pods, &[err("closed")], false).is_ok());
        assert!(agree(&Traced::Untouched, &pods, &[reply("pod0")], false).is_err());
    }
}

//! `proxy trace` against the traffic: every connection step ([`super::Step::Probe`]) of every
//! conformance scenario, on every backend, is traced first (`proxy trace` of
//! the backend, in the node's namespace, for the step's source and destination), then run and
//! checked against the scenario's expectation, and then against what the trace said
//! (`Rig::probe`):
//!
//! - `dnat to X (...)`: the first connection is answered by X; when the trace says X is the only
//!   endpoint or the client's affinity entry, every connection is; every connection is answered
//!   by an address the decision names (the userspace trace names the listener's candidates);
//! - `dnat to one of A, B, ...`: every connection is answered by one of them, and each of them
//!   answers when the step makes at least two connections per candidate (unless the Service has
//!   session affinity, where all stick to one);
//! - `reject (...)`: every connection is refused or reset; `drop (...)`: every one times out;
//!   `close (...)` (the userspace listener accepts, then closes): every one sees EOF;
//!   `untouched`: no endpoint answers.
//!
//! The eBPF backend's trace is read from its pins, for the client's network namespace (the
//! socket path, where session affinity is per namespace) or `--from-outside` (the tc path):
//! `<algorithm>: next connection -> X`: the first connection is X's; `affinity hit: -> X`: every
//! one is X's; `rejected`: refused; `dropped (... EPERM)`: connect() fails with EPERM (the socket
//! program refuses the call); `dropped` on the tc path: every one times out; `not a service`: no
//! endpoint answers.
//!
//! A step whose connections stick to one endpoint (session affinity) is traced again after it:
//! the trace must then name that endpoint, from the client's affinity entry.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use crate::probe::ProbeLine;

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
    /// The eBPF backend's `<algorithm>: next connection -> X`: the first connection is X's (the
    /// later ones are the algorithm's next picks, which the trace does not name).
    First(SocketAddr),
    /// Every connection fails with this probe error (the eBPF socket program refusing connect()
    /// with EPERM where a rule backend drops).
    Error(&'static str),
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

/// The probe's error for a connect() the socket program refused.
const EPERM: &str = "other: Operation not permitted";

/// Parses the `decision:` line of `proxy trace` output.
pub fn parse(text: &str) -> Result<Traced, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("decision: "))
        .ok_or_else(|| format!("no decision in:\n{text}"))?;
    if let Some(traced) = parse_ebpf(line)? {
        return Ok(traced);
    }
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

/// The eBPF backend's decisions (`dataplane::ebpf::trace::Decision`'s wording); `None` for
/// another backend's.
fn parse_ebpf(line: &str) -> Result<Option<Traced>, String> {
    let one = |rest: &str| {
        addresses(rest)
            .first()
            .copied()
            .ok_or_else(|| format!("no endpoint in `{line}`"))
    };
    if let Some(rest) = line.strip_prefix("affinity hit: -> ") {
        let pick = one(rest)?;
        return Ok(Some(Traced::One {
            pick,
            named: vec![pick],
            sticky: true,
        }));
    }
    if let Some((_, rest)) = line.split_once(": next connection -> ") {
        return Ok(Some(Traced::First(one(rest)?)));
    }
    if line.starts_with("rejected: ") {
        return Ok(Some(Traced::Reject));
    }
    if line.starts_with("dropped: ") {
        // The socket path refuses connect() (the decision says EPERM); the tc path drops.
        return Ok(Some(if line.contains("EPERM") {
            Traced::Error(EPERM)
        } else {
            Traced::Drop
        }));
    }
    if line.starts_with("not a service: ") {
        return Ok(Some(Traced::Untouched));
    }
    if line.starts_with("maglev: ") || line.starts_with("inconsistent maps: ") {
        return Err(format!("a decision this test cannot check: `{line}`"));
    }
    Ok(None)
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
    // Every connection failed, each with an error `matches` accepts (`expected` names them).
    let fails_all = |matches: &dyn Fn(&str) -> bool, expected: String| -> Result<(), String> {
        match got.iter().find(|g| !matches!(g, Err(e) if matches(e))) {
            None => Ok(()),
            Some(g) => Err(format!(
                "expected every connection to end in {expected}, one got {g:?}"
            )),
        }
    };
    let errors_all =
        |kinds: &[&str]| fails_all(&|e: &str| kinds.contains(&e), format!("{kinds:?}"));
    let served: Vec<SocketAddr> = match traced {
        Traced::One { .. } | Traced::OneOf(_) | Traced::First(_) => got
            .iter()
            .map(|g| {
                g.clone()
                    .map_err(|e| format!("a connection failed ({e}) where the trace translates it"))
            })
            .collect::<Result<_, _>>()?,
        Traced::Reject => return errors_all(&["refused", "reset", "unreachable"]),
        Traced::Drop => return errors_all(&["timeout"]),
        Traced::Close => return errors_all(&["closed"]),
        // The probe's text goes on with the OS error's number (`... (os error 1)`).
        Traced::Error(kind) => {
            return fails_all(&|e: &str| e.starts_with(kind), format!("{kind:?}..."))
        }
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
        Traced::First(pick) if served[0] != *pick => {
            return Err(format!(
                "the first connection went to {}, the trace said {pick}",
                served[0]
            ));
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

/// After connections that stuck to one endpoint (session affinity), the trace `after` names
/// that endpoint, from the client's affinity entry.
pub fn names_affinity(
    after: &str,
    pod_addr: PodAddr<'_>,
    lines: &[ProbeLine],
) -> Result<(), String> {
    let first = answers(pod_addr, lines)?
        .first()
        .cloned()
        .and_then(Result::ok);
    match parse(after)? {
        Traced::One {
            pick, sticky: true, ..
        } if Some(pick) == first => Ok(()),
        other => Err(format!(
            "after the connections stuck to {first:?}, the trace says {other:?}"
        )),
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

    /// The eBPF backend's wording (`dataplane::ebpf::trace::Decision`).
    #[test]
    fn ebpf_decisions_parse() {
        let ep: SocketAddr = "10.244.1.2:8080".parse().unwrap();
        assert_eq!(
            parse("decision: round-robin: next connection -> 10.244.1.2:8080 (slot 3)").unwrap(),
            Traced::First(ep)
        );
        assert_eq!(
            parse("decision: affinity hit: -> 10.244.1.2:8080").unwrap(),
            Traced::One {
                pick: ep,
                named: vec![ep],
                sticky: true
            }
        );
        assert_eq!(
            parse("decision: rejected: no endpoints (ECONNREFUSED)").unwrap(),
            Traced::Reject
        );
        assert_eq!(
            parse("decision: dropped: no endpoints usable here (Local traffic policy; connect() fails with EPERM)").unwrap(),
            Traced::Error(EPERM)
        );
        assert_eq!(
            parse("decision: dropped: no endpoints usable here (Local traffic policy; the packet is dropped)").unwrap(),
            Traced::Drop
        );
        assert_eq!(
            parse("decision: not a service: passed through unchanged").unwrap(),
            Traced::Untouched
        );
        assert!(parse("decision: maglev: the slot is the hash of the flow's 5-tuple").is_err());
        let eperm = [ProbeLine::Error(
            "other: Operation not permitted (os error 1)".into(),
        )];
        let none = |_: &str| None;
        assert!(agree(&Traced::Error(EPERM), &none, &eperm, false).is_ok());
        assert!(agree(&Traced::Drop, &none, &eperm, false).is_err());
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

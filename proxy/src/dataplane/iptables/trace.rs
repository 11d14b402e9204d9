//! `proxy trace` for the iptables backend: the path a new connection from a source to a
//! destination takes through kpr's `KPR-` chains as the kernel holds them (read with
//! `iptables-save` / `ip6tables-save` of the backend's mode in the caller's network namespace, so
//! it works while the agent is down).
//!
//! Owns a small evaluator of the rules [`compile`](super::compile) and the static rules write,
//! in the kernel's order for a new connection: nat PREROUTING (or OUTPUT for a source of this
//! node) into `KPR-SERVICES` (frontends, buckets, `KPR-NODEPORTS`, the loadBalancerSourceRanges
//! chain `KPR-FW-`, the per-class `KPR-EXT-` chain, the masquerade mark, the route's `KPR-SVC-`
//! chain or `KPR-LC-` pick), then the filter table's `KPR-FILTER` (the drop and reject marks, the
//! clusterIP ports the Service lacks, the unallocated addresses of the Service CIDR), then nat
//! POSTROUTING's `KPR-POSTROUTING` (masquerade, hairpin). Only the rules of the built-in chains
//! that jump to a `KPR-` chain are followed.
//!
//! Matches it understands: addresses and protocols, ports, `addrtype LOCAL` (this namespace's
//! addresses), `mark`, `conntrack --ctstate NEW/DNAT`, `statistic` (nth and random), `recent`
//! (the lists in `/proc/net/xt_recent`, with their entries' ages), `comment`. A rule with any other
//! match is reported by name, never guessed. A `statistic` rule forks the walk: the trace lists
//! every endpoint a new connection can get, each with its probability (for `--mode nth` the share
//! of new connections it gets; which one the next connection gets is the kernel's counter, which
//! `iptables-save` does not print). An affinity entry of the client, or a single endpoint, makes
//! it one endpoint. Only a Maglev port's `HMARK` target hashes the source port: with
//! `--src-port` the walk takes the flow's slot (`maglev::hmark_hash`, the kernel's hash), without
//! it one way per slot, merged into each endpoint's share of the table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::compile::{MARK_DROP, MARK_MASQ, MARK_REJECT};
use super::exec::Tool;
use crate::error::DataplaneError;
use crate::model::Protocol;

/// How deep jumps may nest before the walk gives up (the layout needs four).
const MAX_DEPTH: usize = 16;

/// One rule as `iptables-save` prints it: its text and what it matches and does.
#[derive(Debug, Clone, PartialEq)]
struct Rule {
    text: String,
    matches: Vec<Match>,
    target: Target,
}

#[derive(Debug, Clone, PartialEq)]
enum Match {
    Src(IpNet, bool),
    Dst(IpNet, bool),
    Proto(String, bool),
    DPort(u16, u16, bool),
    SPort(u16, u16, bool),
    /// `addrtype`: (source?, type, negated).
    AddrType(bool, String, bool),
    Mark(u32, u32, bool),
    CtState(Vec<String>, bool),
    /// `statistic --mode nth --every N --packet P`: matches one new connection in N.
    Nth(u32),
    /// `statistic --mode random --probability P`.
    Random(f64),
    Recent(Recent),
}

#[derive(Debug, Clone, PartialEq)]
struct Recent {
    name: String,
    /// `--rcheck` / `--update` (true) or `--set` (false).
    check: bool,
    seconds: Option<u64>,
    /// `--rdest`: the list holds destinations.
    rdest: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Target {
    Jump(String),
    Return,
    Accept,
    Drop,
    Reject(String),
    Dnat(SocketAddr),
    /// `MARK --set-xmark value/mask`.
    Mark(u32, u32),
    ConnMark(u32),
    /// `HMARK` over the flow's addresses, ports and protocol (the Maglev slot).
    Hmark(Hmark),
    Masquerade,
    /// No target (a counting rule) or one that does not change the path (LOG).
    None,
}

/// An `HMARK` target of the form kpr writes: every field of the flow hashed whole.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Hmark {
    rnd: u32,
    modulus: u32,
    offset: u32,
}

/// One table of `iptables-save`: chain -> rules.
#[derive(Debug, Clone, Default)]
pub struct Table {
    chains: HashMap<String, Vec<Rule>>,
}

/// The nat and filter tables of one family, as `iptables-save` printed them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    tables: HashMap<String, Table>,
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{s}` is not an address or prefix"))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("`{s}` is not a number"))
}

/// `value[/mask]` (mask all ones when absent).
fn parse_mark(s: &str) -> Result<(u32, u32), String> {
    match s.split_once('/') {
        Some((v, m)) => Ok((parse_u32(v)?, parse_u32(m)?)),
        None => Ok((parse_u32(s)?, u32::MAX)),
    }
}

fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let p = |x: &str| x.parse::<u16>().map_err(|_| format!("`{x}` is not a port"));
    match s.split_once(':') {
        Some((a, b)) => Ok((p(a)?, p(b)?)),
        None => Ok((p(s)?, p(s)?)),
    }
}

/// Splits a rule line into words, honouring double quotes (comments).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut any) = (false, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// Parses the words of one rule after `-A CHAIN`.
fn parse_rule(text: &str, w: &[String]) -> Result<Rule, String> {
    let mut matches = Vec::new();
    let mut target = Target::None;
    let mut neg = false;
    let mut module = String::new();
    let mut recent: Option<Recent> = None;
    let mut nth: Option<u32> = None;
    let mut i = 0;
    let arg = |i: usize| -> Result<&str, String> {
        w.get(i + 1)
            .map(String::as_str)
            .ok_or_else(|| format!("`{}` without its value", w[i]))
    };
    while i < w.len() {
        let word = w[i].as_str();
        let mut took = 1;
        match word {
            "!" => {
                neg = true;
                i += 1;
                continue;
            }
            "-s" | "--source" => {
                matches.push(Match::Src(parse_net(arg(i)?)?, neg));
                took = 2;
            }
            "-d" | "--destination" => {
                matches.push(Match::Dst(parse_net(arg(i)?)?, neg));
                took = 2;
            }
            "-p" | "--protocol" => {
                matches.push(Match::Proto(arg(i)?.to_string(), neg));
                took = 2;
            }
            "-m" | "--match" => {
                module = arg(i)?.to_string();
                took = 2;
                if !matches!(
                    module.as_str(),
                    "tcp"
                        | "udp"
                        | "sctp"
                        | "comment"
                        | "addrtype"
                        | "mark"
                        | "conntrack"
                        | "statistic"
                        | "recent"
                ) {
                    return Err(format!(
                        "match `-m {module}`, which the trace does not evaluate"
                    ));
                }
            }
            "--dport" | "--destination-port" => {
                let (a, b) = parse_ports(arg(i)?)?;
                matches.push(Match::DPort(a, b, neg));
                took = 2;
            }
            "--sport" | "--source-port" => {
                let (a, b) = parse_ports(arg(i)?)?;
                matches.push(Match::SPort(a, b, neg));
                took = 2;
            }
            "--comment" => took = 2,
            "--src-type" | "--dst-type" => {
                matches.push(Match::AddrType(
                    word == "--src-type",
                    arg(i)?.to_string(),
                    neg,
                ));
                took = 2;
            }
            "--mark" if module == "mark" => {
                let (v, m) = parse_mark(arg(i)?)?;
                matches.push(Match::Mark(v, m, neg));
                took = 2;
            }
            "--ctstate" => {
                let states = arg(i)?.split(',').map(str::to_string).collect();
                matches.push(Match::CtState(states, neg));
                took = 2;
            }
            "--mode" => took = 2,
            "--every" => {
                nth = Some(parse_u32(arg(i)?)?);
                took = 2;
            }
            "--packet" => {
                if parse_u32(arg(i)?)? != 0 {
                    return Err("statistic --packet other than 0".into());
                }
                took = 2;
            }
            "--probability" => {
                let p: f64 = arg(i)?
                    .parse()
                    .map_err(|_| format!("`{}` is not a probability", arg(i).unwrap_or("")))?;
                matches.push(Match::Random(p));
                took = 2;
            }
            "--rcheck" | "--update" | "--set" | "--seconds" | "--name" | "--reap" | "--rsource"
            | "--rdest" | "--mask"
                if module == "recent" =>
            {
                let r = recent.get_or_insert_with(|| Recent {
                    name: "DEFAULT".into(),
                    check: false,
                    seconds: None,
                    rdest: false,
                });
                match word {
                    "--rcheck" | "--update" => r.check = true,
                    "--set" => r.check = false,
                    "--seconds" => {
                        r.seconds = Some(
                            arg(i)?
                                .parse()
                                .map_err(|_| format!("--seconds `{}`", arg(i).unwrap_or("")))?,
                        );
                        took = 2;
                    }
                    "--name" => {
                        r.name = arg(i)?.to_string();
                        took = 2;
                    }
                    "--mask" => took = 2,
                    "--rdest" => r.rdest = true,
                    _ => {}
                }
            }
            "-j" | "--jump" => {
                let t = arg(i)?;
                took = 2;
                target = match t {
                    "RETURN" => Target::Return,
                    "ACCEPT" => Target::Accept,
                    "DROP" => Target::Drop,
                    "MASQUERADE" => Target::Masquerade,
                    "REJECT" => Target::Reject("icmp-port-unreachable".into()),
                    "DNAT" => Target::Dnat(SocketAddr::from(([0, 0, 0, 0], 0))),
                    "MARK" => Target::Mark(0, 0),
                    "CONNMARK" => Target::ConnMark(0),
                    "HMARK" => Target::Hmark(Hmark {
                        rnd: 0,
                        modulus: 0,
                        offset: 0,
                    }),
                    "LOG" => Target::None,
                    t if t.chars().all(|c| c.is_ascii_uppercase()) => {
                        return Err(format!(
                            "target `-j {t}`, which the trace does not evaluate"
                        ))
                    }
                    chain => Target::Jump(chain.to_string()),
                };
            }
            "-g" | "--goto" => {
                return Err("goto (`-g`), which kpr's chains do not use".into());
            }
            "--to-destination" => {
                let v = arg(i)?;
                let ep: SocketAddr = v
                    .parse()
                    .map_err(|_| format!("DNAT to `{v}`: not ADDR:PORT"))?;
                target = Target::Dnat(ep);
                took = 2;
            }
            "--set-xmark" | "--set-mark" => {
                let (v, m) = parse_mark(arg(i)?)?;
                target = match target {
                    Target::ConnMark(_) => Target::ConnMark(v),
                    _ if word == "--set-mark" => Target::Mark(v, u32::MAX),
                    _ => Target::Mark(v, m),
                };
                took = 2;
            }
            "--or-mark" => {
                let v = parse_u32(arg(i)?)?;
                target = Target::Mark(v, v);
                took = 2;
            }
            "--and-mark" => {
                let v = parse_u32(arg(i)?)?;
                target = Target::Mark(0, !v);
                took = 2;
            }
            w if w.starts_with("--hmark-") => {
                let Target::Hmark(h) = &mut target else {
                    return Err(format!("`{w}` outside an HMARK target"));
                };
                let v = arg(i)?;
                took = 2;
                // Only the whole-flow hash kpr writes is evaluated; other masks are refused.
                let whole = match w {
                    "--hmark-tuple" => v == "src,dst,sport,dport,proto",
                    "--hmark-src-prefix" | "--hmark-dst-prefix" => v == "32" || v == "128",
                    "--hmark-sport-mask" | "--hmark-dport-mask" => parse_u32(v)? == 0xffff,
                    "--hmark-proto-mask" => parse_u32(v)? & 0xff == 0xff,
                    "--hmark-rnd" => {
                        h.rnd = parse_u32(v)?;
                        true
                    }
                    "--hmark-mod" => {
                        h.modulus = parse_u32(v)?;
                        true
                    }
                    "--hmark-offset" => {
                        h.offset = parse_u32(v)?;
                        true
                    }
                    _ => false,
                };
                if !whole {
                    return Err(format!(
                        "HMARK `{w} {v}`: the trace evaluates the whole-flow hash kpr writes only"
                    ));
                }
            }
            "--reject-with" => {
                target = Target::Reject(arg(i)?.to_string());
                took = 2;
            }
            "--log-prefix" | "--log-level" => took = 2,
            other => return Err(format!("option `{other}`, which the trace does not know")),
        }
        neg = false;
        i += took;
    }
    if let Some(every) = nth {
        matches.push(Match::Nth(every));
    }
    if let Some(r) = recent {
        matches.push(Match::Recent(r));
    }
    Ok(Rule {
        text: text.to_string(),
        matches,
        target,
    })
}

impl Snapshot {
    /// Parses `iptables-save` output (every table it printed).
    pub fn parse(text: &str) -> Result<Snapshot, String> {
        let mut s = Snapshot::default();
        let mut table: Option<String> = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if let Some(t) = line.strip_prefix('*') {
                table = Some(t.to_string());
                s.tables.entry(t.to_string()).or_default();
                continue;
            }
            let Some(t) = &table else { continue };
            let tab = s.tables.entry(t.clone()).or_default();
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(chain) = decl.split_whitespace().next() {
                    tab.chains.entry(chain.to_string()).or_default();
                }
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let w = words(rest);
                let Some((chain, args)) = w.split_first() else {
                    continue;
                };
                let text = rest[chain.len()..].trim().to_string();
                // Rules of other programs in the built-in chains are not ours to evaluate.
                let ours = chain.starts_with("KPR-")
                    || args
                        .windows(2)
                        .any(|p| p[0] == "-j" && p[1].starts_with("KPR-"));
                let rule = match parse_rule(&text, args) {
                    Ok(r) => r,
                    Err(e) if ours => {
                        return Err(format!("line {}: -A {chain} {text}: {e}", n + 1))
                    }
                    Err(_) => continue,
                };
                if ours {
                    tab.chains.entry(chain.clone()).or_default().push(rule);
                }
            }
        }
        Ok(s)
    }

    /// Runs `<mode>-save` for `tool`'s family in this network namespace.
    pub fn read(tool: Tool) -> Result<Snapshot, DataplaneError> {
        let text = super::exec::save(tool)?;
        Snapshot::parse(&text)
            .map_err(|e| DataplaneError::Other(format!("{}: {e}", tool.binary("save"))))
    }

    fn chain(&self, table: &str, chain: &str) -> &[Rule] {
        self.tables
            .get(table)
            .and_then(|t| t.chains.get(chain))
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    fn has_chain(&self, table: &str, chain: &str) -> bool {
        self.tables
            .get(table)
            .is_some_and(|t| t.chains.contains_key(chain))
    }

    /// Whether any `KPR-` chain exists (the backend programmed this namespace).
    pub fn programmed(&self) -> bool {
        self.has_chain("nat", super::compile::SERVICES)
    }
}

/// One entry of an `xt_recent` list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecentEntry {
    pub addr: IpAddr,
    /// Seconds since the entry was last set or updated, when the kernel's clock could be read.
    pub age: Option<f64>,
}

/// What the evaluation needs from the namespace besides the rules.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// Addresses `addrtype LOCAL` matches (this namespace's addresses; 127.0.0.0/8 always).
    pub local: Vec<IpAddr>,
    /// `recent` list name -> its entries.
    pub recent: HashMap<String, Vec<RecentEntry>>,
}

impl Env {
    fn is_local(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) if v4.is_loopback() => true,
            _ => self.local.contains(&ip),
        }
    }

    /// This namespace's addresses and `recent` lists.
    pub fn read() -> Env {
        let local = nix::ifaddrs::getifaddrs()
            .map(|it| {
                it.filter_map(|a| {
                    let s = a.address?;
                    if let Some(v4) = s.as_sockaddr_in() {
                        Some(IpAddr::V4(v4.ip()))
                    } else {
                        s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                    }
                })
                .collect()
            })
            .unwrap_or_default();
        Env {
            local,
            recent: read_recent(),
        }
    }
}

/// The kernel's tick rate, worked out from its tick counter and the time since boot: the
/// counter starts at 2^32 - 300 s worth of ticks (`INITIAL_JIFFIES`).
fn jiffies_clock() -> Option<(u64, f64)> {
    let timers = std::fs::read_to_string("/proc/timer_list").ok()?;
    let now: u64 = timers
        .lines()
        .find_map(|l| l.strip_prefix("jiffies: "))?
        .trim()
        .parse()
        .ok()?;
    let up: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let hz = [100u64, 250, 300, 1000].into_iter().min_by_key(|&hz| {
        let start = (1u64 << 32).wrapping_sub(300 * hz);
        let expected = start.wrapping_add((up * hz as f64) as u64);
        expected.abs_diff(now)
    })?;
    Some((now, hz as f64))
}

/// Every list of `/proc/net/xt_recent` (this network namespace's).
fn read_recent() -> HashMap<String, Vec<RecentEntry>> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/net/xt_recent") else {
        return out;
    };
    let clock = jiffies_clock();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        out.insert(name, parse_recent(&text, clock));
    }
    out
}

/// Parses one list: `src=10.244.200.2 ttl: 64 last_seen: 4310499127 oldest_pkt: 1 ...`.
fn parse_recent(text: &str, clock: Option<(u64, f64)>) -> Vec<RecentEntry> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let addr: IpAddr = w.next()?.strip_prefix("src=")?.parse().ok()?;
            let last: Option<u64> = l
                .split("last_seen: ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok());
            let age = match (clock, last) {
                (Some((now, hz)), Some(last)) => Some(now.saturating_sub(last) as f64 / hz),
                _ => None,
            };
            Some(RecentEntry { addr, age })
        })
        .collect()
}

/// What a trace asks: a new connection from `src` to `dst:port/proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    pub src: IpAddr,
    pub src_port: Option<u16>,
    pub dst: IpAddr,
    pub port: u16,
    pub proto: Protocol,
}

/// The connection as the walk changes it.
#[derive(Debug, Clone, PartialEq)]
struct Packet {
    src: IpAddr,
    sport: Option<u16>,
    dst: IpAddr,
    dport: u16,
    proto: Protocol,
    mark: u32,
    /// The chain whose rule last set a mark bit (names the reason of a drop or reject).
    marked_in: Option<String>,
    dnat: Option<SocketAddr>,
    ctmark: Option<u32>,
}

/// How one branch of the walk ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    /// Fell off the end of the chain or RETURNed: the caller goes on.
    Continue,
    Accept,
    Drop,
    Reject(String),
    Masquerade,
}

/// One way through the rules: its probability, the rules it matched, where it ended.
#[derive(Debug, Clone, PartialEq)]
struct Branch {
    prob: f64,
    pkt: Packet,
    steps: Vec<String>,
    end: End,
}

/// Where a new connection goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Translated to one of `endpoints` (each with its share of new connections).
    Dnat {
        endpoints: Vec<(SocketAddr, f64)>,
        how: String,
    },
    Reject(String),
    Drop(String),
    /// Different branches end differently (a rule set kpr does not write).
    Mixed(Vec<(String, f64)>),
    /// Not a Service address kpr's rules translate.
    Untouched,
}

fn percent(p: f64) -> String {
    let v = p * 100.0;
    if (v - v.round()).abs() < 0.05 {
        format!("{v:.0}%")
    } else {
        format!("{v:.1}%")
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Dnat { endpoints, how } if endpoints.len() == 1 && how.is_empty() => {
                write!(f, "dnat to {}", endpoints[0].0)
            }
            Decision::Dnat { endpoints, how } if endpoints.len() == 1 => {
                write!(f, "dnat to {} ({how})", endpoints[0].0)
            }
            Decision::Dnat { endpoints, how } => {
                let list: Vec<String> = endpoints
                    .iter()
                    .map(|(e, p)| format!("{e} {}", percent(*p)))
                    .collect();
                write!(f, "dnat to one of {} ({how})", list.join(", "))
            }
            Decision::Reject(why) => write!(f, "reject ({why})"),
            Decision::Drop(why) => write!(f, "drop ({why})"),
            Decision::Mixed(list) => {
                let list: Vec<String> = list
                    .iter()
                    .map(|(d, p)| format!("{} {d}", percent(*p)))
                    .collect();
                write!(f, "depends on the statistic rules: {}", list.join("; "))
            }
            Decision::Untouched => write!(f, "untouched: not a Service address of kpr's rules"),
        }
    }
}

/// The walk and its result.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Rules matched by every branch.
    pub steps: Vec<String>,
    /// Where branches part (a statistic rule): each one's probability, own steps and result.
    pub branches: Vec<(f64, Vec<String>, String)>,
    pub decision: Decision,
    pub masquerade: bool,
}

enum Cond {
    Yes,
    No,
    /// Matches this share of the new connections that reach it.
    Fork(f64),
}

fn proto_matches(p: &str, proto: Protocol) -> bool {
    p == "all" || p == proto.lower() || p.parse::<u8>().ok() == Some(proto_number(proto))
}

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

struct Walker<'a> {
    snap: &'a Snapshot,
    env: &'a Env,
}

impl Walker<'_> {
    fn cond(&self, m: &Match, pkt: &Packet, notes: &mut Vec<String>) -> Cond {
        let yes = |b: bool| if b { Cond::Yes } else { Cond::No };
        match m {
            Match::Src(n, neg) => yes(n.contains(&pkt.src) != *neg),
            Match::Dst(n, neg) => yes(n.contains(&pkt.dst) != *neg),
            Match::Proto(p, neg) => yes(proto_matches(p, pkt.proto) != *neg),
            Match::DPort(a, b, neg) => yes((*a..=*b).contains(&pkt.dport) != *neg),
            Match::SPort(a, b, neg) => match pkt.sport {
                Some(s) => yes((*a..=*b).contains(&s) != *neg),
                None => {
                    notes.push("a rule matches the source port: pass --src-port".into());
                    Cond::No
                }
            },
            Match::AddrType(src, ty, neg) => {
                let ip = if *src { pkt.src } else { pkt.dst };
                let is = match ty.as_str() {
                    "LOCAL" => self.env.is_local(ip),
                    _ => false,
                };
                yes(is != *neg)
            }
            Match::Mark(v, mask, neg) => yes((pkt.mark & mask == *v) != *neg),
            Match::CtState(states, neg) => {
                let any = states.iter().any(|s| match s.as_str() {
                    "NEW" => true,
                    "DNAT" => pkt.dnat.is_some(),
                    _ => false,
                });
                yes(any != *neg)
            }
            Match::Nth(every) => {
                if *every <= 1 {
                    Cond::Yes
                } else {
                    Cond::Fork(1.0 / f64::from(*every))
                }
            }
            Match::Random(p) => Cond::Fork(*p),
            Match::Recent(r) if !r.check => Cond::Yes,
            Match::Recent(r) => {
                let key = if r.rdest { pkt.dst } else { pkt.src };
                let entry = self
                    .env
                    .recent
                    .get(&r.name)
                    .and_then(|l| l.iter().find(|e| e.addr == key));
                match entry {
                    None => Cond::No,
                    Some(e) => match (e.age, r.seconds) {
                        (Some(age), Some(s)) if age > s as f64 => {
                            notes.push(format!(
                                "recent {}: the entry of {key} is {age:.0}s old, past its \
                                 {s}s: not a hit",
                                r.name
                            ));
                            Cond::No
                        }
                        (age, _) => {
                            let age = age.map_or("age unknown".into(), |a| format!("{a:.0}s old"));
                            notes.push(format!(
                                "recent {}: {key} has an entry ({age}): session affinity",
                                r.name
                            ));
                            Cond::Yes
                        }
                    },
                }
            }
        }
    }

    /// Walks `chain` of `table` from branch `b`; returns every way it leaves the chain.
    fn chain(
        &self,
        table: &str,
        chain: &str,
        b: Branch,
        depth: usize,
    ) -> Result<Vec<Branch>, String> {
        if depth > MAX_DEPTH {
            return Err(format!("jumps nest deeper than {MAX_DEPTH} at {chain}"));
        }
        let mut active = vec![b];
        let mut done = Vec::new();
        for rule in self.snap.chain(table, chain) {
            let mut next = Vec::new();
            for mut b in active {
                let mut notes = Vec::new();
                let mut share = 1.0;
                let mut matched = true;
                for m in &rule.matches {
                    match self.cond(m, &b.pkt, &mut notes) {
                        Cond::Yes => {}
                        Cond::No => {
                            matched = false;
                            break;
                        }
                        Cond::Fork(p) => share *= p,
                    }
                }
                if !matched {
                    // Why a rule that nearly matched did not (an expired affinity entry).
                    b.steps.extend(notes);
                    next.push(b);
                    continue;
                }
                let mut taken = b.clone();
                if share < 1.0 {
                    let mut rest = b;
                    rest.prob *= 1.0 - share;
                    next.push(rest);
                    taken.prob *= share;
                }
                taken.steps.extend(notes);
                taken.steps.push(format!("{table} {chain}: {}", rule.text));
                self.target(table, chain, rule, taken, depth, &mut next, &mut done)?;
            }
            active = next;
            if active.is_empty() {
                break;
            }
        }
        done.extend(active.into_iter().map(|b| Branch {
            end: End::Continue,
            ..b
        }));
        Ok(done)
    }

    #[allow(clippy::too_many_arguments)]
    fn target(
        &self,
        table: &str,
        chain: &str,
        rule: &Rule,
        mut b: Branch,
        depth: usize,
        next: &mut Vec<Branch>,
        done: &mut Vec<Branch>,
    ) -> Result<(), String> {
        let end = |b: Branch, end: End| Branch { end, ..b };
        match &rule.target {
            Target::Jump(sub) => {
                for r in self.chain(table, sub, b, depth + 1)? {
                    if r.end == End::Continue {
                        next.push(r);
                    } else {
                        done.push(r);
                    }
                }
            }
            Target::Return => done.push(end(b, End::Continue)),
            Target::Accept => done.push(end(b, End::Accept)),
            Target::Drop => done.push(end(b, End::Drop)),
            Target::Reject(with) => done.push(end(b, End::Reject(with.clone()))),
            Target::Masquerade => done.push(end(b, End::Masquerade)),
            Target::Dnat(ep) => {
                b.pkt.dnat = Some(*ep);
                b.pkt.dst = ep.ip();
                b.pkt.dport = ep.port();
                done.push(end(b, End::Accept));
            }
            Target::Mark(v, m) => {
                b.pkt.mark = (b.pkt.mark & !m) ^ v;
                if v & (MARK_DROP | MARK_REJECT) != 0 {
                    b.pkt.marked_in = Some(chain.to_string());
                }
                next.push(b);
            }
            Target::ConnMark(v) => {
                b.pkt.ctmark = Some(*v);
                next.push(b);
            }
            Target::Hmark(h) => {
                let slots = |b: &Branch| -> Vec<u32> {
                    let Some(sport) = b.pkt.sport else {
                        return (0..h.modulus).collect();
                    };
                    let hash = crate::maglev::hmark_hash(
                        SocketAddr::new(b.pkt.src, sport),
                        SocketAddr::new(b.pkt.dst, b.pkt.dport),
                        proto_number(b.pkt.proto),
                        h.rnd,
                    );
                    vec![proxy_common::hash::slot_of(hash, h.modulus)]
                };
                let all = slots(&b);
                let share = 1.0 / all.len() as f64;
                for slot in &all {
                    let mut t = b.clone();
                    t.prob *= share;
                    t.pkt.mark = slot + h.offset;
                    if b.pkt.sport.is_some() {
                        t.steps
                            .push(format!("maglev table slot {slot} of {}", h.modulus));
                    }
                    next.push(t);
                }
            }
            Target::None => next.push(b),
        }
        Ok(())
    }
}

/// Why a drop or reject mark was set, from the chain that set it.
fn mark_reason(pkt: &Packet, verdict: &str) -> String {
    match pkt.marked_in.as_deref() {
        Some(c) if c.starts_with("KPR-FW-") => "loadBalancerSourceRanges".into(),
        Some(_) if verdict == "reject" => "the Service has no usable endpoint".into(),
        Some(_) => "no usable endpoint for this source (traffic policy Local)".into(),
        None => format!("the {verdict} mark"),
    }
}

/// Evaluates a new connection against one family's rules.
pub fn trace(snap: &Snapshot, env: &Env, req: &TraceRequest) -> Result<Trace, String> {
    let w = Walker { snap, env };
    let pkt = Packet {
        src: req.src,
        sport: req.src_port,
        dst: req.dst,
        dport: req.port,
        proto: req.proto,
        mark: 0,
        marked_in: None,
        dnat: None,
        ctmark: None,
    };
    let local_src = env.is_local(req.src);
    let hook = if local_src { "OUTPUT" } else { "PREROUTING" };
    let start = Branch {
        prob: 1.0,
        pkt,
        steps: vec![format!(
            "{} is {}: nat {hook}",
            req.src,
            if local_src {
                "this node's address"
            } else {
                "not this node's"
            }
        )],
        end: End::Continue,
    };
    let mut results: Vec<(f64, Vec<String>, Decision, bool)> = Vec::new();
    for b in w.chain("nat", hook, start, 0)? {
        // nat is done: the filter table's kpr-checks see the translated connection.
        let fhook = if local_src {
            "OUTPUT"
        } else if env.is_local(b.pkt.dst) {
            "INPUT"
        } else {
            "FORWARD"
        };
        let mut fb = b.clone();
        fb.end = End::Continue;
        let mut decided = Vec::new();
        for f in w.chain("filter", fhook, fb, 0)? {
            let decision = match &f.end {
                End::Drop => {
                    let why = if f.pkt.mark & MARK_DROP != 0 {
                        mark_reason(&f.pkt, "drop")
                    } else if f.pkt.dnat.is_none() {
                        "an unallocated address of the Service CIDR".into()
                    } else {
                        "dropped by the filter rules".into()
                    };
                    Decision::Drop(why)
                }
                End::Reject(with) => {
                    let why = if f.pkt.mark & MARK_REJECT != 0 {
                        mark_reason(&f.pkt, "reject")
                    } else if f.pkt.dnat.is_none() {
                        "a clusterIP port the Service does not have".into()
                    } else {
                        format!("rejected with {with}")
                    };
                    Decision::Reject(why)
                }
                _ => match f.pkt.dnat {
                    Some(ep) => Decision::Dnat {
                        endpoints: vec![(ep, f.prob)],
                        how: String::new(),
                    },
                    None => Decision::Untouched,
                },
            };
            decided.push((f, decision));
        }
        for (f, decision) in decided {
            let mut masquerade = false;
            let mut steps = f.steps.clone();
            if matches!(decision, Decision::Dnat { .. }) {
                let mut pb = f.clone();
                pb.end = End::Continue;
                pb.steps = Vec::new();
                for p in w.chain("nat", "POSTROUTING", pb, 0)? {
                    if p.end == End::Masquerade {
                        masquerade = true;
                        steps.extend(p.steps);
                        steps.push("the source is masqueraded".into());
                        break;
                    }
                }
                if !masquerade && f.pkt.mark & MARK_MASQ != 0 {
                    steps.push("masquerade mark set but no MASQUERADE rule matched".into());
                }
            }
            results.push((f.prob, steps, decision, masquerade));
        }
    }
    Ok(summarise(merge_same_ends(results)))
}

/// Merges the ways through the rules that end alike (the same decision and masquerade): a
/// Maglev HMARK without the source port forks into one way per slot of the table, and what
/// matters is each endpoint's share. Each merged way keeps the steps its members share.
fn merge_same_ends(
    results: Vec<(f64, Vec<String>, Decision, bool)>,
) -> Vec<(f64, Vec<String>, Decision, bool)> {
    let total = results.len();
    let mut merged: Vec<(f64, Vec<String>, Decision, bool, usize)> = Vec::new();
    for (p, steps, d, masq) in results {
        match merged.iter_mut().find(|m| m.2 == d && m.3 == masq) {
            Some(m) => {
                m.0 += p;
                let n = m.1.iter().zip(&steps).take_while(|(a, b)| a == b).count();
                m.1.truncate(n);
                m.4 += 1;
            }
            None => merged.push((p, steps, d, masq, 1)),
        }
    }
    merged
        .into_iter()
        .map(|(p, mut steps, d, masq, n)| {
            if n > 1 {
                steps.push(format!(
                    "({n} of the {total} slots of the Maglev table lead here)"
                ));
            }
            (p, steps, d, masq)
        })
        .collect()
}

/// Common steps, the branches, and one decision over them.
fn summarise(results: Vec<(f64, Vec<String>, Decision, bool)>) -> Trace {
    let mut common: Vec<String> = results.first().map(|r| r.1.clone()).unwrap_or_default();
    for r in &results[1.min(results.len())..] {
        let n = common.iter().zip(&r.1).take_while(|(a, b)| a == b).count();
        common.truncate(n);
    }
    let branches: Vec<(f64, Vec<String>, String)> = if results.len() > 1 {
        results
            .iter()
            .map(|(p, steps, d, _)| (*p, steps[common.len()..].to_vec(), d.to_string()))
            .collect()
    } else {
        Vec::new()
    };
    let masquerade = results.iter().any(|r| r.3);
    let all_dnat = results.iter().all(|r| matches!(r.2, Decision::Dnat { .. }));
    let decision = if results.is_empty() {
        Decision::Untouched
    } else if all_dnat {
        let mut eps: Vec<(SocketAddr, f64)> = Vec::new();
        for (p, _, d, _) in &results {
            if let Decision::Dnat { endpoints, .. } = d {
                for (e, _) in endpoints {
                    match eps.iter_mut().find(|(x, _)| x == e) {
                        Some((_, q)) => *q += p,
                        None => eps.push((*e, *p)),
                    }
                }
            }
        }
        let affinity = results
            .iter()
            .any(|r| r.1.iter().any(|s| s.contains("session affinity")));
        let slot = common
            .iter()
            .chain(results.iter().flat_map(|r| &r.1))
            .find(|s| s.starts_with("maglev table slot"));
        let maglev = common
            .iter()
            .chain(results.iter().flat_map(|r| &r.1))
            .any(|s| s.contains("-j HMARK"));
        let how = if let (Some(slot), 1) = (slot, eps.len()) {
            format!("maglev: the flow's {slot}")
        } else if maglev && eps.len() > 1 {
            "maglev: each endpoint its share of the table's slots; --src-port gives the flow's"
                .to_string()
        } else if eps.len() > 1 {
            let nth = common
                .iter()
                .chain(results.iter().flat_map(|r| &r.1))
                .any(|s| s.contains("--mode nth"));
            if nth {
                "statistic nth: round robin, each its share of new connections".to_string()
            } else {
                "statistic random: each with its probability".to_string()
            }
        } else if affinity {
            "session affinity: this client's recent entry".into()
        } else {
            "its only endpoint".into()
        };
        Decision::Dnat {
            endpoints: eps,
            how,
        }
    } else if results.len() == 1 || results.iter().all(|r| r.2 == results[0].2) {
        results[0].2.clone()
    } else {
        Decision::Mixed(
            results
                .iter()
                .map(|(p, _, d, _)| (d.to_string(), *p))
                .collect(),
        )
    };
    Trace {
        steps: common,
        branches,
        decision,
        masquerade,
    }
}

/// The trace as `proxy trace` prints it.
pub fn render(req: &TraceRequest, tool: Tool, t: &Trace) -> String {
    let mut out = format!(
        "{} -> {}/{}  {} (iptables-{})\n",
        req.src,
        SocketAddr::new(req.dst, req.port),
        req.proto.lower(),
        tool.binary("save"),
        match tool.mode {
            super::exec::Mode::Legacy => "legacy",
            super::exec::Mode::Nft => "nft",
        }
    );
    for s in &t.steps {
        let _ = writeln!(out, "{s}");
    }
    for (p, steps, d) in &t.branches {
        let _ = writeln!(out, "  {} of new connections:", percent(*p));
        for s in steps {
            let _ = writeln!(out, "    {s}");
        }
        let _ = writeln!(out, "    -> {d}");
    }
    if t.masquerade && t.branches.is_empty() {
        let _ = writeln!(out, "nat postrouting: the source is masqueraded");
    }
    let hashed = t
        .steps
        .iter()
        .chain(t.branches.iter().flat_map(|b| &b.1))
        .any(|s| s.contains("-j HMARK"));
    if req.src_port.is_some() && !hashed {
        let _ = writeln!(
            out,
            "(the source port does not change the path: no kpr iptables rule hashes it)"
        );
    }
    let _ = writeln!(out, "decision: {}", t.decision);
    out
}

#[cfg(test)]
mod tests;

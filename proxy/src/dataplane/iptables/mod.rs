//! The iptables dataplane: kube-proxy-style NAT chains (prefix `KPR-`), written with
//! `iptables-restore --noflush`.
//!
//! Owns every chain whose name starts with `KPR-` in the nat and filter tables and the jump rules
//! to them in the built-in chains; never touches anything else (a real kube-proxy's `KUBE-`
//! chains included). A full sync rewrites all our chains in one restore (and removes leftover
//! `KPR-` chains of a crashed run); an incremental sync rewrites only the chains of the changed
//! service ports (their own chains, their bucket, the hairpin chains of endpoint addresses that
//! came or went) and adds or deletes their single rules in the shared chains. Chains that are no
//! longer referenced are flushed at once and deleted after a grace period. Works with
//! iptables-legacy and iptables-nft (`--iptables-mode`, or detected). The layout and why it has
//! so few chains: [`compile`]. IPv4 only.

pub mod buckets;
pub mod compile;
pub mod exec;
pub mod hairpin;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conntrack::leastconn::{LcTable, LcWanted, PickChange, Steer};
use crate::dataplane::rules::driver::Planned;
use crate::dataplane::rules::{self, RuleBackend, RuleDataplane, TargetIds};
use crate::dataplane::{BackendConfig, Dataplane};
use crate::error::DataplaneError;
use crate::model::ServicePortName;
use crate::state::{ChangeSet, ProxyState};

use buckets::Buckets;
use compile::{
    Compiled, LcTarget, CLUSTER_IPS, FILTER, MARK_MASQ_CHAIN, MASQ_EXTERNAL, NODEPORTS,
    POSTROUTING, SERVICES,
};
pub use exec::Mode;
use hairpin::{Hairpin, HAIRPIN};

/// How long an unreferenced chain is kept (flushed) before it is deleted.
pub const DEFAULT_STALE_GRACE: Duration = Duration::from_secs(30);

/// Jump rules in built-in chains: (table, chain, rule).
const HOOKS: &[(&str, &str, &str)] = &[
    (
        "nat",
        "PREROUTING",
        "-m comment --comment kpr-services -j KPR-SERVICES",
    ),
    (
        "nat",
        "OUTPUT",
        "-m comment --comment kpr-services -j KPR-SERVICES",
    ),
    (
        "nat",
        "POSTROUTING",
        "-m comment --comment kpr-postrouting -j KPR-POSTROUTING",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -m comment --comment kpr-checks -j KPR-FILTER",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -m comment --comment kpr-checks -j KPR-FILTER",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -m comment --comment kpr-checks -j KPR-FILTER",
    ),
];

/// Removes everything this backend installs (`proxy cleanup`), with or without a running agent
/// and after a crash.
/// Without `--iptables-mode`, both modes are cleaned: a crashed run may have used either.
pub fn cleanup(cfg: &BackendConfig) -> Result<(), DataplaneError> {
    if cfg.iptables_mode.is_some() {
        return IptablesDataplane::new(cfg)?.cleanup();
    }
    for mode in ["nft", "legacy"] {
        let cfg = BackendConfig {
            iptables_mode: Some(mode.into()),
            ..cfg.clone()
        };
        IptablesDataplane::new(&cfg)?.cleanup()?;
    }
    Ok(())
}

/// The iptables dataplane: the shared rule driver around [`Iptables`].
pub type IptablesDataplane = RuleDataplane<Iptables>;

/// The iptables backend's plan and apply.
pub struct Iptables {
    cfg: BackendConfig,
    mode: Mode,
    ids: TargetIds,
    programmed: HashMap<ServicePortName, Compiled>,
    cluster_ip_refs: HashMap<Ipv4Addr, usize>,
    buckets: Buckets,
    hairpin: Hairpin,
    /// Least-connection targets by id, for [`IptSteer`] to write a moved pick.
    lc_targets: Arc<Mutex<HashMap<u32, LcTarget>>>,
    /// Flushed, unreferenced chains and when they became so.
    stale: BTreeMap<String, Instant>,
    grace: Duration,
    /// The node-wide inputs of the static rules at the last full sync.
    statics: Option<String>,
    last_restore: String,
    /// Our chains (nat, filter) as of the last successful restore; `None` until a full sync
    /// listed them, and again after a failed restore or cleanup. Full syncs use it instead of
    /// listing the whole table with `iptables-save`.
    existing: Option<[BTreeSet<String>; 2]>,
    /// What `existing` becomes once the planned restore succeeds.
    pending: Option<[BTreeSet<String>; 2]>,
}

impl Iptables {
    /// Picks the iptables mode (`cfg.iptables_mode` or detected) and checks the tools run.
    fn start(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        let mode = match cfg.iptables_mode.as_deref() {
            Some(m) => Mode::parse(m)?,
            None => Mode::detect(),
        };
        if !exec::iptables(mode, &["--version"])? {
            return Err(DataplaneError::Other(format!(
                "{} --version failed: iptables ({mode:?}) is not usable",
                mode.binary("")
            )));
        }
        Ok(Iptables {
            cfg: cfg.clone(),
            mode,
            ids: TargetIds::default(),
            programmed: HashMap::new(),
            cluster_ip_refs: HashMap::new(),
            buckets: Buckets::default(),
            hairpin: Hairpin::default(),
            lc_targets: Arc::default(),
            stale: BTreeMap::new(),
            grace: DEFAULT_STALE_GRACE,
            statics: None,
            last_restore: String::new(),
            existing: None,
            pending: None,
        })
    }

    /// The mode in use.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sets how long unreferenced chains are kept before deletion.
    pub fn set_stale_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// The `iptables-restore` input of the last sync.
    pub fn last_restore(&self) -> &str {
        &self.last_restore
    }

    /// Chains flushed and waiting for deletion.
    pub fn stale_chains(&self) -> Vec<String> {
        self.stale.keys().cloned().collect()
    }

    fn statics_key(&self, state: &ProxyState) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{}",
            state.node.cluster_cidrs,
            state.node.node_ips,
            self.cfg.nodeport_addresses,
            self.cfg.service_cidrs,
            state.node.masquerade_all
        )
    }

    /// Static rules of our shared chains (nat, filter).
    fn static_rules(&self, node: &crate::selection::NodeContext) -> (Vec<String>, Vec<String>) {
        let mut nat = vec![
            format!(
                "-A {MARK_MASQ_CHAIN} -j MARK --or-mark {:#x}",
                compile::MARK_MASQ
            ),
            format!("-A {POSTROUTING} -m conntrack --ctstate DNAT -j {HAIRPIN}"),
            format!(
                "-A {POSTROUTING} -m mark ! --mark {m:#x}/{m:#x} -j RETURN",
                m = compile::MARK_MASQ
            ),
            format!(
                "-A {POSTROUTING} -j MARK --xor-mark {:#x}",
                compile::MARK_MASQ
            ),
            format!("-A {POSTROUTING} -j MASQUERADE"),
            format!("-A {MASQ_EXTERNAL} -m addrtype --src-type LOCAL -j RETURN"),
        ];
        for c in &node.cluster_cidrs {
            if let ipnet::IpNet::V4(n) = c {
                nat.push(format!("-A {MASQ_EXTERNAL} -s {} -j RETURN", n.trunc()));
            }
        }
        nat.push(format!("-A {MASQ_EXTERNAL} -j {MARK_MASQ_CHAIN}"));
        let v4nets: Vec<String> = self
            .cfg
            .nodeport_addresses
            .iter()
            .filter_map(|n| match n {
                ipnet::IpNet::V4(n) if !n.network().is_loopback() => Some(n.trunc().to_string()),
                _ => None,
            })
            .collect();
        if v4nets.is_empty() {
            nat.push(format!(
                "-A {SERVICES} -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j {NODEPORTS}"
            ));
        } else {
            for n in v4nets {
                nat.push(format!("-A {SERVICES} -d {n} -j {NODEPORTS}"));
            }
        }
        let mut filter = vec![
            format!(
                "-A {FILTER} -m mark --mark {m:#x}/{m:#x} -j DROP",
                m = compile::MARK_DROP
            ),
            format!(
                "-A {FILTER} -p tcp -m mark --mark {m:#x}/{m:#x} -j REJECT --reject-with tcp-reset",
                m = compile::MARK_REJECT
            ),
            format!(
                "-A {FILTER} -m mark --mark {m:#x}/{m:#x} -j REJECT",
                m = compile::MARK_REJECT
            ),
        ];
        // Only destinations still inside a service CIDR after NAT were not translated: the
        // per-clusterIP list is walked for those alone, not for every new connection.
        let service_cidrs: Vec<String> = self
            .cfg
            .service_cidrs
            .iter()
            .filter_map(|c| match c {
                ipnet::IpNet::V4(n) => Some(n.trunc().to_string()),
                ipnet::IpNet::V6(_) => None,
            })
            .collect();
        if service_cidrs.is_empty() {
            filter.push(format!("-A {FILTER} -j {CLUSTER_IPS}"));
        }
        for n in &service_cidrs {
            filter.push(format!("-A {FILTER} -d {n} -j {CLUSTER_IPS}"));
        }
        for n in &service_cidrs {
            filter.push(format!("-A {FILTER} -d {n} -j DROP"));
        }
        (nat, filter)
    }

    fn cluster_ip_rules(ip: Ipv4Addr) -> [String; 2] {
        [
            format!("{CLUSTER_IPS} -d {ip}/32 -p tcp -j REJECT --reject-with tcp-reset"),
            format!("{CLUSTER_IPS} -d {ip}/32 -j REJECT"),
        ]
    }

    /// Builds the restore input of a sync and updates the bookkeeping as if it was applied.
    fn plan_restore(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        full: bool,
        lc: Option<&mut LcTable>,
    ) -> Result<(bool, String, usize), DataplaneError> {
        let key = self.statics_key(state);
        let full = full || self.statics.as_deref() != Some(&key);
        let spns: Vec<ServicePortName> = if full {
            state.names().cloned().collect()
        } else {
            changes.changed.iter().cloned().collect()
        };
        let mut p = Plan::default();
        if full {
            self.full_prologue(state, &mut p)?;
            self.missing_hooks(&mut p)?;
            self.statics = Some(key);
        }
        let mut lc_targets = Vec::new();
        for spn in &spns {
            if let Some(svc) = state.service(spn) {
                if !rules::is_ipv4(svc) {
                    tracing::warn!("iptables: Service port {spn} has no IPv4 address; IPv6 is not implemented by this backend");
                }
            }
            let new = compile::compile(state, spn, &mut self.ids);
            let old = self.programmed.remove(spn).unwrap_or_default();
            self.diff(&old, &new, full, &mut p);
            self.buckets
                .update(&spn.to_string(), old.bucket.as_ref(), new.bucket.as_ref());
            self.hairpin.update(&old.endpoint_ips, &new.endpoint_ips);
            lc_targets.extend(new.lc.iter().cloned());
            if new != Compiled::default() {
                self.programmed.insert(spn.clone(), new);
            }
        }
        self.shared_chains(&mut p);
        if let Some(table) = lc {
            self.lc_chains(table, &lc_targets, full, &mut p);
        }
        let now = Instant::now();
        let expired: Vec<String> = self
            .stale
            .iter()
            .filter(|(_, t)| now.duration_since(**t) >= self.grace)
            .map(|(c, _)| c.clone())
            .collect();
        for c in expired {
            self.stale.remove(&c);
            p.nat_delete_chains.push(c);
        }
        self.pending = Some(p.chains_after(self.existing.as_ref()));
        Ok((full, p.render(), spns.len()))
    }

    /// Full sync: every shared chain re-declared (flushed) with its static rules; leftovers of
    /// earlier runs flushed and deleted.
    fn full_prologue(&mut self, state: &ProxyState, p: &mut Plan) -> Result<(), DataplaneError> {
        self.programmed.clear();
        self.cluster_ip_refs.clear();
        self.buckets.clear();
        self.hairpin.clear();
        let (nat, filter) = self.static_rules(&state.node);
        for c in [
            SERVICES,
            NODEPORTS,
            MARK_MASQ_CHAIN,
            MASQ_EXTERNAL,
            POSTROUTING,
            HAIRPIN,
        ] {
            p.nat_declare.insert(c.to_string());
        }
        for c in [FILTER, CLUSTER_IPS] {
            p.filter_declare.insert(c.to_string());
        }
        p.nat_rules.extend(nat);
        p.filter_rules.extend(filter);
        // Whatever else of ours exists (a crashed run, chains waiting for their grace period)
        // is flushed now and deleted at the end of this restore unless the sync declares it.
        let [nat, filter] = match self.existing.take() {
            Some(known) => known,
            None => [
                exec::chains(self.mode, "nat", "KPR-")?
                    .into_iter()
                    .collect(),
                exec::chains(self.mode, "filter", "KPR-")?
                    .into_iter()
                    .collect(),
            ],
        };
        p.nat_leftovers = nat;
        p.filter_leftovers = filter;
        self.stale.clear();
        Ok(())
    }

    fn diff(&mut self, old: &Compiled, new: &Compiled, full: bool, p: &mut Plan) {
        for (name, rules) in &new.chains {
            if full || old.chains.get(name) != Some(rules) {
                p.nat_declare.insert(name.clone());
                p.nat_rules
                    .extend(rules.iter().map(|r| format!("-A {name} {r}")));
            }
            self.stale.remove(name);
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                p.nat_declare.insert(name.clone());
                self.stale.insert(name.clone(), Instant::now());
            }
        }
        for (chain, old_rules, new_rules) in [
            (SERVICES, &old.services, &new.services),
            (NODEPORTS, &old.nodeports, &new.nodeports),
        ] {
            for r in old_rules {
                if !new_rules.contains(r) && !full {
                    p.nat_deletes.push(format!("-D {chain} {r}"));
                }
            }
            for r in new_rules {
                if full || !old_rules.contains(r) {
                    p.nat_rules.push(format!("-A {chain} {r}"));
                }
            }
        }
        for ip in &old.cluster_ips {
            if full || new.cluster_ips.contains(ip) {
                continue;
            }
            let n = self.cluster_ip_refs.entry(*ip).or_default();
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.cluster_ip_refs.remove(ip);
                p.filter_deletes
                    .extend(Self::cluster_ip_rules(*ip).map(|r| format!("-D {r}")));
            }
        }
        for ip in &new.cluster_ips {
            if !full && old.cluster_ips.contains(ip) {
                continue;
            }
            let n = self.cluster_ip_refs.entry(*ip).or_default();
            *n += 1;
            if *n == 1 {
                p.filter_rules
                    .extend(Self::cluster_ip_rules(*ip).map(|r| format!("-A {r}")));
            }
        }
    }

    /// The bucket and hairpin chains the sync's service ports changed, rewritten whole; an
    /// emptied one is flushed and deleted after the grace period like any unreferenced chain.
    fn shared_chains(&mut self, p: &mut Plan) {
        for b in self.buckets.take_changes() {
            self.rewrite(p, b.chain, &b.rules);
        }
        for h in self.hairpin.take_changes() {
            if h.rules.is_empty() && h.dispatched {
                p.nat_deletes.push(format!("-D {HAIRPIN} {}", h.dispatch));
            } else if !h.rules.is_empty() && !h.dispatched {
                p.nat_rules.push(format!("-A {HAIRPIN} {}", h.dispatch));
            }
            self.rewrite(p, h.chain, &h.rules);
        }
    }

    /// Declares (flushes) `chain` and appends `rules`; an empty chain waits for deletion.
    fn rewrite(&mut self, p: &mut Plan, chain: String, rules: &[String]) {
        if rules.is_empty() {
            self.stale.insert(chain.clone(), Instant::now());
        } else {
            self.stale.remove(&chain);
            p.nat_rules
                .extend(rules.iter().map(|r| format!("-A {chain} {r}")));
        }
        p.nat_declare.insert(chain);
    }

    /// Least-connection chains: those of the service ports compiled in this sync, and of any
    /// other target whose pick moved, each pointing at its current pick.
    fn lc_chains(
        &self,
        table: &mut LcTable,
        compiled: &[compile::LcTarget],
        full: bool,
        p: &mut Plan,
    ) {
        let all: HashMap<u32, &LcTarget> = self
            .programmed
            .values()
            .flat_map(|c| c.lc.iter().map(|t| (t.id, t)))
            .collect();
        let wanted: Vec<LcWanted> = all
            .values()
            .map(|t| (t.id, lc_label(t), t.endpoints.clone()))
            .collect();
        let moved = table.reconcile(&wanted, full);
        let mut shared = self
            .lc_targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shared.retain(|id, _| all.contains_key(id));
        let mut write: BTreeMap<u32, &LcTarget> = compiled.iter().map(|t| (t.id, t)).collect();
        write.extend(
            moved
                .iter()
                .filter_map(|c| all.get(&c.id).map(|t| (c.id, *t))),
        );
        for t in write.into_values() {
            shared.insert(t.id, t.clone());
            p.nat_declare.insert(t.chain.clone());
            if let Some(pick) = table.pick(t.id) {
                p.nat_rules.push(t.pick_rule(pick));
            }
        }
    }
}

/// The label the least-connection table carries for a target: `<LC chain> <service port>`.
fn lc_label(t: &compile::LcTarget) -> String {
    format!("{} {}", t.chain, t.spn)
}

/// The pieces of one restore input, rendered table by table.
#[derive(Debug, Default)]
struct Plan {
    nat_declare: BTreeSet<String>,
    nat_leftovers: BTreeSet<String>,
    nat_deletes: Vec<String>,
    nat_rules: Vec<String>,
    nat_delete_chains: Vec<String>,
    filter_declare: BTreeSet<String>,
    filter_leftovers: BTreeSet<String>,
    filter_deletes: Vec<String>,
    filter_rules: Vec<String>,
}

impl Plan {
    /// Our chains (nat, filter) once this plan is applied, given those before it (`None`: only
    /// what the plan itself declares or lists as leftovers is known).
    fn chains_after(&self, before: Option<&[BTreeSet<String>; 2]>) -> [BTreeSet<String>; 2] {
        let after = |i: usize,
                     declare: &BTreeSet<String>,
                     leftovers: &BTreeSet<String>,
                     deleted: &[String]| {
            let mut set: BTreeSet<String> = before.map(|b| b[i].clone()).unwrap_or_default();
            set.retain(|c| !leftovers.contains(c) || declare.contains(c));
            set.extend(declare.iter().cloned());
            for c in deleted {
                set.remove(c);
            }
            set
        };
        [
            after(
                0,
                &self.nat_declare,
                &self.nat_leftovers,
                &self.nat_delete_chains,
            ),
            after(1, &self.filter_declare, &self.filter_leftovers, &[]),
        ]
    }

    fn render(&self) -> String {
        let mut out = String::new();
        render_table(
            &mut out,
            "nat",
            &self.nat_declare,
            &self.nat_leftovers,
            &self.nat_deletes,
            &self.nat_rules,
            &self.nat_delete_chains,
        );
        render_table(
            &mut out,
            "filter",
            &self.filter_declare,
            &self.filter_leftovers,
            &self.filter_deletes,
            &self.filter_rules,
            &[],
        );
        out
    }
}

fn render_table(
    out: &mut String,
    table: &str,
    declare: &BTreeSet<String>,
    leftovers: &BTreeSet<String>,
    deletes: &[String],
    rules: &[String],
    delete_chains: &[String],
) {
    let extra: Vec<&String> = leftovers.iter().filter(|c| !declare.contains(*c)).collect();
    if declare.is_empty()
        && extra.is_empty()
        && deletes.is_empty()
        && rules.is_empty()
        && delete_chains.is_empty()
    {
        return;
    }
    let _ = writeln!(out, "*{table}");
    for c in declare.iter().chain(extra.iter().copied()) {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for l in deletes.iter().chain(rules) {
        out.push_str(l);
        out.push('\n');
    }
    for c in extra.iter().copied().chain(delete_chains) {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n");
}

fn count_ops(script: &str) -> usize {
    script
        .lines()
        .filter(|l| {
            l.starts_with(':') || l.starts_with("-A") || l.starts_with("-D") || l.starts_with("-X")
        })
        .count()
}

/// Rewrites a least-connection chain when the controller moves its pick.
struct IptSteer {
    mode: Mode,
    targets: Arc<Mutex<HashMap<u32, LcTarget>>>,
}

impl Steer for IptSteer {
    fn steer(&mut self, changes: &[PickChange]) -> Result<(), DataplaneError> {
        let targets = self
            .targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut script = String::from("*nat\n");
        let mut rules = String::new();
        for c in changes {
            let Some(t) = targets.get(&c.id) else {
                continue;
            };
            let _ = writeln!(script, ":{} - [0:0]", t.chain);
            if let Some(pick) = c.new {
                rules.push_str(&t.pick_rule(pick));
                rules.push('\n');
            }
        }
        script.push_str(&rules);
        script.push_str("COMMIT\n");
        exec::restore(self.mode, &script)
    }
}

impl Iptables {
    /// Full syncs: the jumps from the built-in chains to ours that are missing go into the
    /// restore (`-I CHAIN 1`). Checked before the restore, while a starting agent's table is
    /// still empty: on iptables-legacy every `iptables -C`/`-I` reads (and `-I` rewrites) the
    /// whole table, about 0.5 s at 20,000 Services.
    fn missing_hooks(&self, p: &mut Plan) -> Result<(), DataplaneError> {
        for (table, chain, rule) in HOOKS {
            let mut check = vec!["-t", table, "-C", chain];
            check.extend(split_rule(rule));
            if exec::iptables(self.mode, &check)? {
                continue;
            }
            let insert = format!("-I {chain} 1 {rule}");
            if *table == "nat" {
                p.nat_rules.push(insert);
            } else {
                p.filter_rules.push(insert);
            }
        }
        Ok(())
    }
}

fn split_rule(rule: &str) -> Vec<&str> {
    rule.split_whitespace().collect()
}

impl RuleBackend for Iptables {
    const NAME: &'static str = "iptables";
    type Transaction = String;

    fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        Iptables::start(cfg)
    }

    fn plan(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        full: bool,
        lc: Option<&mut LcTable>,
    ) -> Result<Planned<String>, DataplaneError> {
        let (full, script, touched) = self.plan_restore(state, changes, full, lc)?;
        Ok(Planned {
            full,
            touched,
            transaction: script,
        })
    }

    fn apply(&mut self, planned: Planned<String>) -> Result<usize, DataplaneError> {
        let script = planned.transaction;
        let result = if script.is_empty() {
            Ok(())
        } else {
            exec::restore(self.mode, &script)
        };
        let pending = self.pending.take();
        self.existing = if result.is_ok() { pending } else { None };
        let operations = count_ops(&script);
        self.last_restore = script;
        result.map(|()| operations)
    }

    fn steer(&self) -> Box<dyn Steer> {
        Box::new(IptSteer {
            mode: self.mode,
            targets: Arc::clone(&self.lc_targets),
        })
    }

    fn service_ports(&self) -> usize {
        self.programmed.len()
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        for (table, chain, rule) in HOOKS {
            let mut del = vec!["-t", table, "-D", chain];
            del.extend(split_rule(rule));
            // A crashed run may have added a jump more than once.
            for _ in 0..16 {
                if !exec::iptables(self.mode, &del)? {
                    break;
                }
            }
        }
        let mut script = String::new();
        for table in ["nat", "filter"] {
            let chains = exec::chains(self.mode, table, "KPR-")?;
            if chains.is_empty() {
                continue;
            }
            let _ = writeln!(script, "*{table}");
            for c in &chains {
                let _ = writeln!(script, ":{c} - [0:0]");
            }
            for c in &chains {
                let _ = writeln!(script, "-X {c}");
            }
            script.push_str("COMMIT\n");
        }
        if !script.is_empty() {
            exec::restore(self.mode, &script)?;
        }
        self.programmed.clear();
        self.cluster_ip_refs.clear();
        self.buckets = Buckets::default();
        self.hairpin = Hairpin::default();
        self.stale.clear();
        self.statics = None;
        self.existing = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddrV4;

    #[test]
    fn restore_declares_chains_before_rules_and_deletes_last() {
        let mut p = Plan::default();
        p.nat_declare.insert("KPR-SVC-A".into());
        p.nat_rules.push("-A KPR-SVC-A -j KPR-SEP-B".into());
        p.nat_deletes
            .push("-D KPR-SERVICES -d 10.0.0.1/32 -j KPR-CIP-C".into());
        p.nat_delete_chains.push("KPR-SEP-OLD".into());
        assert_eq!(
            p.render(),
            "*nat\n:KPR-SVC-A - [0:0]\n-D KPR-SERVICES -d 10.0.0.1/32 -j KPR-CIP-C\n\
             -A KPR-SVC-A -j KPR-SEP-B\n-X KPR-SEP-OLD\nCOMMIT\n"
        );
    }

    #[test]
    fn known_chains_follow_the_plan_without_listing_the_table() {
        let set = |v: &[&str]| {
            v.iter()
                .map(|c| c.to_string())
                .collect::<BTreeSet<String>>()
        };
        // A full sync: the listed leftovers it does not declare are deleted.
        let full = Plan {
            nat_leftovers: set(&["KPR-SVC-A", "KPR-SVC-GONE"]),
            nat_declare: set(&["KPR-SERVICES", "KPR-SVC-A"]),
            filter_leftovers: set(&["KPR-OLD"]),
            ..Plan::default()
        };
        let after = full.chains_after(None);
        assert_eq!(after[0], set(&["KPR-SERVICES", "KPR-SVC-A"]));
        assert!(after[1].is_empty());
        // An incremental sync adds what it declares and drops the chains it deletes.
        let inc = Plan {
            nat_declare: set(&["KPR-SVC-B"]),
            nat_delete_chains: vec!["KPR-SVC-A".into()],
            ..Plan::default()
        };
        let after = inc.chains_after(Some(&after));
        assert_eq!(after[0], set(&["KPR-SERVICES", "KPR-SVC-B"]));
    }

    #[test]
    fn an_empty_plan_renders_nothing() {
        assert_eq!(Plan::default().render(), "");
    }

    #[test]
    fn affinity_list_names_are_stable_and_short() {
        let a = compile::affinity_list(
            "default/web/TCP",
            "10.244.1.2:8080".parse::<SocketAddrV4>().unwrap(),
        );
        assert_eq!(
            a,
            compile::affinity_list("default/web/TCP", "10.244.1.2:8080".parse().unwrap())
        );
        assert!(a.len() <= 28, "{a}");
    }
}

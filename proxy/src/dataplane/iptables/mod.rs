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
//! iptables-legacy and iptables-nft (`--iptables-mode`, or detected), and both address families:
//! IPv6 is the same layout written with `ip6tables-restore` by a second instance
//! ([`IptablesFamilies`]). The layout and why it has so few chains: [`compile`].
//!
//! Maglev (`kpr.io/balance: maglev`) hashes the flow with the kernel's HMARK target into the
//! packet mark and dispatches the slot through block chains (`compile`), about one rule per slot.
//!
//! Files: `compile` (the rules of one service port), `plan` (one sync's restore input and how it
//! renders), `ruleset` (the hooks and the node-wide rules), `steer` (moving a least-connection
//! pick), `buckets` and `hairpin` (the shared chains' bookkeeping), `exec` (running the tools),
//! `trace` (`proxy trace`: a new connection walked through the rules `iptables-save` prints).
//! The sync itself is the shared rule driver's (`dataplane::rules`).

pub mod buckets;
pub mod compile;
pub mod exec;
pub mod hairpin;
mod plan;
mod ruleset;
mod steer;
pub mod trace;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conntrack::leastconn::{LcTable, LcWanted, PickChange, Steer};
use crate::dataplane::rules::driver::Planned;
use crate::dataplane::rules::{RuleBackend, RuleDataplane, TargetIds};
use crate::dataplane::{BackendConfig, Dataplane};
use crate::error::DataplaneError;
use crate::model::{IpFamily, ServicePortName};
use crate::state::{ChangeSet, ProxyState};

use buckets::Buckets;
use compile::{
    Compiled, LcTarget, CLUSTER_IPS, FILTER, MARK_MASQ_CHAIN, MASQ_EXTERNAL, NODEPORTS,
    POSTROUTING, SERVICES,
};
pub use exec::Mode;
use hairpin::{Hairpin, HAIRPIN};
use plan::{count_ops, Plan};
use ruleset::HOOKS;
use steer::IptSteer;

/// Where the IPv6 instance's target ids start.
const V6_TARGET_IDS: u32 = 1 << 30;

/// How long an unreferenced chain is kept (flushed) before it is deleted.
pub const DEFAULT_STALE_GRACE: Duration = Duration::from_secs(30);

/// Removes everything this backend installs (`proxy cleanup`), with or without a running agent
/// and after a crash.
/// Without `--iptables-mode`, both modes are cleaned: a crashed run may have used either.
pub fn cleanup(cfg: &BackendConfig) -> Result<(), DataplaneError> {
    if cfg.iptables_mode.is_some() {
        return IptablesFamilies::new(cfg)?.cleanup();
    }
    for mode in ["nft", "legacy"] {
        let cfg = BackendConfig {
            iptables_mode: Some(mode.into()),
            ..cfg.clone()
        };
        IptablesFamilies::new(&cfg)?.cleanup()?;
    }
    Ok(())
}

/// One family's iptables dataplane: the shared rule driver around [`Iptables`] (IPv4 when built
/// with `new`).
pub type IptablesDataplane = RuleDataplane<Iptables>;

/// The iptables backend as the agent runs it: one [`IptablesDataplane`] per family, IPv4 always
/// and IPv6 where the kernel has it and `ip6tables-<mode>` runs. Each family has its own
/// restores, least-connection controller and conntrack cleanup; a dual-stack Service is a target
/// in each.
pub struct IptablesFamilies {
    v4: IptablesDataplane,
    v6: Option<IptablesDataplane>,
}

impl IptablesFamilies {
    pub fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        let v4 = IptablesDataplane::new(cfg)?;
        let v6 = if crate::dataplane::kernel_has_ipv6() {
            match Iptables::start(cfg, IpFamily::V6) {
                Ok(b) => Some(RuleDataplane::from_backend(b)),
                Err(e) => {
                    tracing::warn!("iptables: IPv6 Services are not programmed: {e}");
                    None
                }
            }
        } else {
            None
        };
        Ok(IptablesFamilies { v4, v6 })
    }
}

impl Dataplane for IptablesFamilies {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
    ) -> Result<crate::state::SyncStats, DataplaneError> {
        let mut stats = self.v4.sync(state, changes)?;
        if let Some(v6) = &mut self.v6 {
            let s6 = v6.sync(state, changes)?;
            stats.full |= s6.full;
            // A dual-stack port is programmed in both: count it once.
            stats.service_ports = stats.service_ports.max(s6.service_ports);
            stats.touched = stats.touched.max(s6.touched);
            stats.operations += s6.operations;
        }
        Ok(stats)
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        self.v4.cleanup()?;
        if let Some(v6) = &mut self.v6 {
            v6.cleanup()?;
        }
        Ok(())
    }

    fn live_view(&self) -> Option<Arc<dyn crate::state::LiveView>> {
        let views: Vec<Arc<dyn crate::state::LiveView>> = [Some(&self.v4), self.v6.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|d| d.live_view())
            .collect();
        (!views.is_empty()).then(|| Arc::new(Views(views)) as Arc<dyn crate::state::LiveView>)
    }

    fn families(&self) -> &'static [IpFamily] {
        if self.v6.is_some() {
            &IpFamily::ALL
        } else {
            &[IpFamily::V4]
        }
    }
}

/// Both families' live counters as one (their endpoints never overlap).
struct Views(Vec<Arc<dyn crate::state::LiveView>>);

impl crate::state::LiveView for Views {
    fn active_connections(&self) -> std::collections::BTreeMap<std::net::SocketAddr, u64> {
        self.0.iter().flat_map(|v| v.active_connections()).collect()
    }
}

/// The iptables backend's plan and apply.
pub struct Iptables {
    cfg: BackendConfig,
    mode: Mode,
    /// The family this instance programs (`ip6tables` for IPv6; a dual-stack node runs one
    /// instance per family, see [`IptablesDataplane`]).
    family: IpFamily,
    ids: TargetIds,
    programmed: HashMap<ServicePortName, Compiled>,
    cluster_ip_refs: HashMap<IpAddr, usize>,
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
    /// Picks the iptables mode (`cfg.iptables_mode` or detected) and checks that `family`'s tools
    /// run.
    fn start(cfg: &BackendConfig, family: IpFamily) -> Result<Self, DataplaneError> {
        let mode = match cfg.iptables_mode.as_deref() {
            Some(m) => Mode::parse(m)?,
            None => Mode::detect(),
        };
        let tool = mode.tool(family);
        if !exec::iptables(tool, &["--version"])? {
            return Err(DataplaneError::ToolUnavailable {
                tool: tool.binary(""),
                detail: format!("`--version` failed (iptables mode {mode:?})"),
            });
        }
        Ok(Iptables {
            cfg: cfg.clone(),
            mode,
            family,
            // Conntrack marks name least-connection targets in one controller per family; the
            // ranges keep them apart anyway (a mark read in the wrong family's events is unknown).
            ids: match family {
                IpFamily::V4 => TargetIds::default(),
                IpFamily::V6 => TargetIds::starting_at(V6_TARGET_IDS),
            },
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

    fn tool(&self) -> exec::Tool {
        self.mode.tool(self.family)
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
            if exec::iptables(self.tool(), &check)? {
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
        Iptables::start(cfg, IpFamily::V4)
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
            exec::restore(self.tool(), &script)
        };
        let pending = self.pending.take();
        self.existing = if result.is_ok() { pending } else { None };
        let operations = count_ops(&script);
        self.last_restore = script;
        result.map(|()| operations)
    }

    fn steer(&self) -> Box<dyn Steer> {
        Box::new(IptSteer {
            tool: self.tool(),
            targets: Arc::clone(&self.lc_targets),
        })
    }

    fn service_ports(&self) -> usize {
        self.programmed.len()
    }

    fn families(&self) -> &'static [IpFamily] {
        match self.family {
            IpFamily::V4 => &[IpFamily::V4],
            IpFamily::V6 => &[IpFamily::V6],
        }
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        for (table, chain, rule) in HOOKS {
            let mut del = vec!["-t", table, "-D", chain];
            del.extend(split_rule(rule));
            // A crashed run may have added a jump more than once.
            for _ in 0..16 {
                if !exec::iptables(self.tool(), &del)? {
                    break;
                }
            }
        }
        let mut script = String::new();
        for table in ["nat", "filter"] {
            let chains = exec::chains(self.tool(), table, "KPR-")?;
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
            exec::restore(self.tool(), &script)?;
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
    use std::net::SocketAddr;

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
            "10.244.1.2:8080".parse::<SocketAddr>().unwrap(),
        );
        assert_eq!(
            a,
            compile::affinity_list("default/web/TCP", "10.244.1.2:8080".parse().unwrap())
        );
        assert!(a.len() <= 28, "{a}");
    }
}

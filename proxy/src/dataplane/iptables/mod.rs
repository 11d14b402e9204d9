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
//!
//! Files: `compile` (the rules of one service port), `plan` (one sync's restore input and how it
//! renders), `ruleset` (the hooks and the node-wide rules), `steer` (moving a least-connection
//! pick), `buckets` and `hairpin` (the shared chains' bookkeeping), `exec` (running the tools).
//! The sync itself is the shared rule driver's (`dataplane::rules`).

pub mod buckets;
pub mod compile;
pub mod exec;
pub mod hairpin;
mod plan;
mod ruleset;
mod steer;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conntrack::leastconn::{LcTable, LcWanted, PickChange, Steer};
use crate::dataplane::rules::driver::Planned;
use crate::dataplane::rules::{RuleBackend, RuleDataplane, TargetIds};
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
use plan::{count_ops, Plan};
use ruleset::HOOKS;
use steer::IptSteer;

/// How long an unreferenced chain is kept (flushed) before it is deleted.
pub const DEFAULT_STALE_GRACE: Duration = Duration::from_secs(30);

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
            return Err(DataplaneError::ToolUnavailable {
                tool: mode.binary(""),
                detail: format!("`--version` failed (iptables mode {mode:?})"),
            });
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

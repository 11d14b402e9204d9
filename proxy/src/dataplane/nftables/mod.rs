//! The nftables dataplane: kernel NAT through data maps in two tables of our own, `ip kpr` for
//! IPv4 and `ip6 kpr` for IPv6, with the same layout.
//!
//! Owns those two tables and nothing else (it never lists or changes other tables). A full sync
//! re-creates both skeletons in place and reloads every element in one `nft -f` transaction; an
//! incremental sync recompiles only the service ports of the [`ChangeSet`] and applies the element
//! difference in one transaction, without listing anything. See `ruleset` for the layout.
//!
//! Why text and not JSON (the `nftables` crate): measured at 20,000 Services (140,000 elements)
//! on this kernel, `nft -j -f` loads in 0.72 s and `nft -f` in 0.98 s, but nft 1.0.6 has no JSON
//! form of the map-update statement session affinity needs (`update @aff { k : v }`), and one
//! transaction cannot mix both formats. Every script runs through `crate::nft`, which the
//! userspace backend's table uses too.
//!
//! Each address family of a Service is served by its table, with the endpoints of that family:
//! a dual-stack Service is two independent sets of targets (each with its own conntrack id). A
//! table exists only for a family the cluster declares or has Services of (see
//! `Nftables::tables_for` on what an unused table costs).

pub mod compile;
pub mod elements;
pub mod ops;
pub mod ruleset;
pub mod trace;
pub mod wire;

use std::collections::{BTreeSet, HashMap};

use crate::conntrack::leastconn::{LcTable, LcWanted, PickChange, Steer};
use crate::dataplane::rules::driver::Planned;
use crate::dataplane::rules::{RuleBackend, RuleDataplane, TargetIds};
use crate::dataplane::{BackendConfig, Dataplane};
use crate::error::DataplaneError;
use crate::model::{Algorithm, IpFamily, ServicePortName};
use crate::nft;
use crate::state::{ChangeSet, ProxyState};

use compile::{ChainNeed, Compiled, Sharing};
use elements::{Delta, ElementTable, Key, Value};
pub use ops::Op;
use ruleset::Skeleton;

/// Removes everything this backend installs (`proxy cleanup`), with or without a running agent
/// and after a crash.
pub fn cleanup(cfg: &BackendConfig) -> Result<(), DataplaneError> {
    NftablesDataplane::new(cfg)?.cleanup()
}

/// The nftables dataplane: the shared rule driver around [`Nftables`].
pub type NftablesDataplane = RuleDataplane<Nftables>;

/// The nftables backend's plan and apply.
pub struct Nftables {
    cfg: BackendConfig,
    ids: TargetIds,
    table: ElementTable,
    /// What each programmed service port compiled to, with its owner id in `table`.
    programmed: HashMap<ServicePortName, (u32, Compiled)>,
    /// The programmed service ports with a least-connection target (so a sync never walks all).
    lc_ports: BTreeSet<ServicePortName>,
    next_owner: u32,
    /// Chains created on demand since the last skeleton.
    chains: BTreeSet<ChainNeed>,
    /// The families programmed: both, or IPv4 alone where the kernel has no IPv6 (booted with
    /// `ipv6.disable=1`), whose nf_tables would refuse an `ip6` table and with it the whole
    /// transaction.
    families: &'static [IpFamily],
    /// The skeletons (one per programmed family) the tables were last built from; `None` before
    /// the first full sync.
    skeleton: Option<Vec<Skeleton>>,
    last_ops: Vec<Op>,
    /// The elements the last full sync wrote over netlink (0: it loaded them as text).
    netlink_elements: usize,
    /// Full syncs that could not reload the tables in place and replaced them whole.
    replaced: usize,
}

impl Nftables {
    fn empty(cfg: &BackendConfig) -> Self {
        Nftables {
            cfg: cfg.clone(),
            ids: TargetIds::default(),
            table: ElementTable::default(),
            programmed: HashMap::new(),
            lc_ports: BTreeSet::new(),
            next_owner: 1,
            chains: BTreeSet::new(),
            families: crate::dataplane::kernel_families(),
            skeleton: None,
            last_ops: Vec::new(),
            netlink_elements: 0,
            replaced: 0,
        }
    }

    /// The operations of the last incremental transaction that was applied (or attempted);
    /// empty after a full sync, whose elements are rendered from the bookkeeping
    /// ([`Op::LoadAll`]).
    pub fn last_transaction_ops(&self) -> &[Op] {
        &self.last_ops
    }

    /// How many elements the last full sync wrote over netlink: all but the interval sets' when
    /// it created the tables, 0 when it reloaded existing ones as text.
    pub fn netlink_elements(&self) -> usize {
        self.netlink_elements
    }

    /// How many full syncs replaced the tables whole because reloading them in place failed
    /// (which loses the affinity maps' clients).
    pub fn tables_replaced(&self) -> usize {
        self.replaced
    }

    /// The conntrack mark (target id) of each target of a service port, for tests and inspect.
    pub fn target_ids(&self, spn: &ServicePortName) -> Vec<u32> {
        self.programmed
            .get(spn)
            .map(|(_, c)| c.targets.iter().map(|t| t.id).collect())
            .unwrap_or_default()
    }

    /// Computes the element operations for `changes` (everything when `full`, or when the
    /// skeleton changed: then the skeletons, the chains and [`Op::LoadAll`]) and updates the
    /// bookkeeping as if they were applied.
    ///
    /// Pure with respect to the kernel: nothing runs. A test can call this directly to see which
    /// operations a change causes.
    pub fn plan_ops(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        full: bool,
    ) -> (bool, Vec<Op>, usize) {
        let families = self.tables_for(state, changes, full);
        let skel = self.skeletons_for(state, &families);
        let full = full || self.skeleton.as_ref() != Some(&skel);
        let mut head = Vec::new();
        let spns: Vec<ServicePortName> = if full {
            // The table of a family that no longer has Services goes.
            let dropped: Vec<IpFamily> = self
                .tables()
                .into_iter()
                .filter(|f| !families.contains(f))
                .collect();
            if !dropped.is_empty() {
                head.push(Op::Skeleton(ruleset::delete_tables(&dropped)));
            }
            head.extend(skel.iter().map(|s| Op::Skeleton(ruleset::skeleton(s))));
            self.table.clear();
            self.programmed.clear();
            self.lc_ports.clear();
            self.chains.clear();
            self.skeleton = Some(skel);
            state.names().cloned().collect()
        } else {
            changes.changed.iter().cloned().collect()
        };
        let mut delta = Delta::default();
        for spn in &spns {
            let new = compile::compile(state, spn, &mut self.ids, &families);
            self.apply_compiled(spn, new, &mut delta, &mut head, full);
            if full {
                // The elements are rendered from the bookkeeping (`LoadAll`), not listed.
                delta.clear();
            }
        }
        let touched = spns.len();
        let mut ops = head;
        if full {
            ops.push(Op::LoadAll);
        } else {
            ops.extend(delta.into_ops());
        }
        (full, ops, touched)
    }

    /// The families whose tables the last full sync built.
    fn tables(&self) -> Vec<IpFamily> {
        self.skeleton
            .iter()
            .flatten()
            .map(|s| s.fam.family)
            .collect()
    }

    /// The families that get a table: of those the kernel has, the ones the cluster declares (a
    /// `--service-cluster-ip-range` of the family) and the ones with a Service port in `state`
    /// (all of them read on a full sync; on an incremental one, the tables there are plus what a
    /// changed port needs, which makes the sync full when it adds one). A table costs every later
    /// transaction even when empty: libnftables reads the definitions of every table before it
    /// runs one (an empty `ip6` table took an IPv4 one-endpoint change from 0.35 to 0.68 ms on
    /// 6.18), so an IPv4-only cluster gets no `ip6` table.
    fn tables_for(&self, state: &ProxyState, changes: &ChangeSet, full: bool) -> Vec<IpFamily> {
        let read_all = full || self.skeleton.is_none();
        let current = self.tables();
        self.families
            .iter()
            .copied()
            .filter(|&f| {
                let declared = self
                    .cfg
                    .service_cidrs
                    .iter()
                    .any(|net| IpFamily::of(&net.addr()) == f);
                let used =
                    |spn: &ServicePortName| state.get(spn).is_some_and(|p| p.service.has_family(f));
                declared
                    || if read_all {
                        state.names().any(used)
                    } else {
                        current.contains(&f) || changes.changed.iter().any(used)
                    }
            })
            .collect()
    }

    fn skeletons_for(&self, state: &ProxyState, families: &[IpFamily]) -> Vec<Skeleton> {
        families
            .iter()
            .map(|&family| {
                Skeleton::from_config(
                    family,
                    &state.node.cluster_cidrs,
                    &state.node.node_ips,
                    &self.cfg.nodeport_addresses,
                    &self.cfg.service_cidrs,
                    compile::clusterip_masq(&state.node),
                    state.node.maglev_table_size.get(),
                )
            })
            .collect()
    }

    fn apply_compiled(
        &mut self,
        spn: &ServicePortName,
        new: Compiled,
        delta: &mut Delta,
        chain_ops: &mut Vec<Op>,
        full: bool,
    ) {
        for need in &new.chains {
            if self.chains.insert(*need) {
                let (name, commands) = match need {
                    ChainNeed::RoundRobin(f, n, b) => ruleset::rr_chain(*n, *b, &ruleset::fam(*f)),
                    ChainNeed::Affinity(f, secs) => {
                        ruleset::affinity_chains(*secs, &ruleset::fam(*f))
                    }
                };
                chain_ops.push(Op::EnsureChain { name, commands });
            }
        }
        let (owner, old) = match self.programmed.remove(spn) {
            Some((owner, old)) => (owner, old),
            None => {
                self.next_owner += 1;
                (self.next_owner, Compiled::default())
            }
        };
        let (old_shared, old_owned) = old.target_elements();
        let (new_shared, new_owned) = new.target_elements();
        self.table
            .replace(owner, &old.frontends, &new.frontends, delta);
        self.table.replace(owner, &old_shared, &new_shared, delta);
        if !full {
            // A full sync renders the owned elements from `programmed`; only shared keys need
            // the table.
            elements::diff_owned(&old_owned, &new_owned, delta);
        }
        // Targets that disappeared leave the least-connection table at `LcTable::reconcile`.
        if new
            .targets
            .iter()
            .any(|t| t.algorithm == Algorithm::LeastConn)
        {
            self.lc_ports.insert(spn.clone());
        } else {
            self.lc_ports.remove(spn);
        }
        if !new.frontends.is_empty() || !new.targets.is_empty() {
            self.programmed.insert(spn.clone(), (owner, new));
        }
    }

    /// The `nft -f` script of planned operations, as `apply` writes it (in parts).
    pub fn script(&self, ops: &[Op]) -> String {
        ops::render_parts(ops, &mut |parts| {
            self.render_all(parts);
        })
        .concat()
    }

    /// Renders every programmed element as `add element` commands, one part per set; returns
    /// how many elements.
    fn render_all(&self, parts: &mut Vec<String>) -> usize {
        let mut batches = ops::Batches::default();
        let mut n = 0;
        self.each_programmed(|family, set, key, value| {
            batches.add(family, set, key, value);
            n += 1;
        });
        batches.into_parts(parts);
        n
    }

    /// Every programmed element: the shared keys from the element table (each with its first
    /// owner's value), the rest from each service port's targets.
    fn each_programmed(&self, mut f: impl FnMut(IpFamily, &'static str, &Key, Option<Value>)) {
        for (family, set, key, value) in self.table.programmed() {
            f(family, set, key, value);
        }
        for (_, c) in self.programmed.values() {
            c.each_target_element(|e, sharing| {
                if sharing == Sharing::Owned {
                    f(e.family, e.set, &e.key, e.value);
                }
            });
        }
    }

    /// Loads a full sync into tables that do not exist yet: the skeleton, chains and the few
    /// elements that must stay text in one `nft` transaction, then every other element over
    /// netlink (`nft::netlink`), which at 100,000 Services takes a fraction of nft's time to
    /// parse the same elements as text. Not atomic, which is why it is only used when nothing
    /// was programmed: until the elements are in, no Service answers, as before the first sync.
    /// Returns the elements loaded over netlink and as text, or `None` when the tables exist
    /// (or cannot be checked) and the text path must be taken.
    fn load_fresh(&self, ops: &[Op]) -> Option<Result<(usize, usize), DataplaneError>> {
        let fresh = self.families.iter().all(|f| {
            matches!(
                nft::netlink::table_exists(wire::nfproto(*f), ruleset::TABLE_NAME),
                Ok(false)
            )
        });
        if !fresh {
            return None;
        }
        let mut text = 0;
        let parts = ops::render_parts(ops, &mut |parts| {
            let mut batches = ops::Batches::default();
            self.each_programmed(|family, set, key, value| {
                if wire::loads_as_text(key) {
                    batches.add(family, set, key, value);
                    text += 1;
                }
            });
            batches.into_parts(parts);
        });
        if let Err(e) = nft::apply_parts(&parts) {
            return Some(Err(e));
        }
        drop(parts);
        Some(self.write_elements().map(|n| (n, text)))
    }

    /// Writes every programmed element a key encoding exists for over netlink.
    fn write_elements(&self) -> Result<usize, DataplaneError> {
        let mut writer = nft::netlink::ElementWriter::new(ruleset::TABLE_NAME)?;
        let (mut key, mut scratch) = (Vec::new(), Vec::new());
        let mut chain = std::borrow::Cow::Borrowed("");
        let mut result = Ok(());
        self.each_programmed(|family, set, k, value| {
            if result.is_err() || !wire::key(k, &mut key) {
                return;
            }
            let data = value.map(|v| wire::data(&v, &mut scratch, &mut chain));
            result = writer.add(wire::nfproto(family), set, &key, data);
        });
        result?;
        writer.finish()
    }

    /// Applies a planned transaction as `nft -f` text (a full sync replaces tables that cannot
    /// be reloaded in place); returns the result and the elements `LoadAll` rendered.
    fn load_text(&mut self, planned: &Planned<Vec<Op>>) -> (Result<(), DataplaneError>, usize) {
        let mut elements = 0;
        let mut parts = ops::render_parts(&planned.transaction, &mut |parts| {
            elements += self.render_all(parts);
        });
        let mut result = nft::apply_parts(&parts);
        if let (true, Err(e)) = (planned.full, &result) {
            // The table in the kernel does not fit the skeleton (another version, a broken
            // leftover): replace it whole, still in one transaction.
            tracing::warn!("nftables: in-place reload failed ({e}); replacing the table");
            parts.insert(0, ruleset::delete_tables(self.families));
            result = nft::apply_parts(&parts);
            self.replaced += 1;
        }
        (result, elements)
    }

    /// The least-connection targets that have endpoints: (id, label, endpoints).
    fn lc_wanted(&self) -> Vec<LcWanted> {
        self.lc_ports
            .iter()
            .filter_map(|spn| self.programmed.get(spn).map(|p| (spn, p)))
            .flat_map(|(spn, (_, c))| {
                c.targets
                    .iter()
                    .filter(|t| t.algorithm == Algorithm::LeastConn && !t.endpoints.is_empty())
                    .map(move |t| (t.id, spn.to_string(), t.endpoints.clone()))
            })
            .collect()
    }
}

/// The element operations that move one target's picks: its `LC_SLOTS` slots hold the picks in
/// turn, and the `lc` chain's `numgen` walks the slots. Written to every protocol's pick map
/// (`ruleset::lc_pick_map`): a pick change does not know its target's protocol, and the target id
/// keeps targets apart in each.
fn pick_ops(c: &PickChange) -> Vec<Op> {
    let slot_key = |slot: usize| Key::Slot(c.id, slot as u32);
    // A target's endpoints are all of its table's family.
    let family = c
        .old
        .iter()
        .chain(&c.new)
        .next()
        .map_or(IpFamily::V4, |e| IpFamily::of(&e.ip()));
    let maps = ruleset::SLOT_PROTOCOLS.map(ruleset::lc_pick_map);
    let mut ops = Vec::new();
    if !c.old.is_empty() {
        for set in maps {
            ops.extend((0..ruleset::LC_SLOTS).map(|slot| Op::DeleteElement {
                family,
                set,
                key: slot_key(slot),
            }));
        }
    }
    if !c.new.is_empty() {
        // The `numgen` counter keeps its place across updates, so each endpoint owns fixed slots
        // (slot s: endpoint s mod n) and keeps them while it is tied for least; only the slots
        // of the others go to the ties. New connections then walk the ties round-robin even
        // while every update excludes the endpoint that just took one.
        // (A change with picks always carries its target's endpoints, of which they are part.)
        let picks: Vec<Value> = (0..ruleset::LC_SLOTS)
            .map(|slot| {
                let owner = c.endpoints[slot % c.endpoints.len()];
                let pick = if c.new.contains(&owner) {
                    owner
                } else {
                    c.new[slot % c.new.len()]
                };
                Value::Endpoint(pick.ip(), pick.port())
            })
            .collect();
        for set in maps {
            ops.extend(picks.iter().enumerate().map(|(slot, pick)| Op::AddElement {
                family,
                set,
                key: slot_key(slot),
                value: Some(*pick),
            }));
        }
    }
    ops
}

/// Moves least-connection picks with one `nft -f` transaction per batch of events.
struct NftSteer;

impl Steer for NftSteer {
    fn steer(&mut self, changes: &[PickChange]) -> Result<(), DataplaneError> {
        let ops: Vec<Op> = changes.iter().flat_map(pick_ops).collect();
        nft::apply(&ops::render(&ops))
    }
}

impl RuleBackend for Nftables {
    const NAME: &'static str = "nftables";
    type Transaction = Vec<Op>;

    /// Checks that `nft` runs; nothing is programmed until the first sync.
    fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        nft::query(&["--version"])?;
        Ok(Nftables::empty(cfg))
    }

    fn plan(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        full: bool,
        lc: Option<&mut LcTable>,
    ) -> Result<Planned<Vec<Op>>, DataplaneError> {
        let (full, mut ops, touched) = self.plan_ops(state, changes, full);
        if let Some(table) = lc {
            let picks = table.reconcile(&self.lc_wanted(), full);
            ops.extend(picks.iter().flat_map(pick_ops));
        }
        Ok(Planned {
            full,
            touched,
            transaction: ops,
        })
    }

    fn apply(&mut self, planned: Planned<Vec<Op>>) -> Result<usize, DataplaneError> {
        self.netlink_elements = 0;
        let fresh = if planned.full {
            self.load_fresh(&planned.transaction)
        } else {
            None
        };
        let (result, elements) = match fresh {
            Some(Ok((netlink, text))) => {
                self.netlink_elements = netlink;
                (Ok(()), netlink + text)
            }
            failed => {
                if let Some(Err(e)) = failed {
                    // A failed load leaves the tables partly filled: the text load reloads them
                    // whole, in place.
                    tracing::warn!("nftables: loading new tables over netlink failed ({e}); loading them as text");
                }
                self.load_text(&planned)
            }
        };
        // `LoadAll` counts as the elements it rendered.
        let listed = planned.transaction.iter().filter(|op| **op != Op::LoadAll);
        let operations = listed.count() + elements;
        self.last_ops = if planned.full {
            Vec::new()
        } else {
            planned.transaction
        };
        result.map(|()| operations)
    }

    fn steer(&self) -> Box<dyn Steer> {
        Box::new(NftSteer)
    }

    fn service_ports(&self) -> usize {
        self.programmed.len()
    }

    fn families(&self) -> &'static [IpFamily] {
        self.families
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        nft::apply(&ruleset::delete_tables(self.families))?;
        self.table.clear();
        self.programmed.clear();
        self.lc_ports.clear();
        self.chains.clear();
        self.skeleton = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures;

    /// The elements of `script`'s `add element` commands, as (table, set, element) text.
    fn added(script: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in script.lines() {
            let Some(rest) = line.strip_prefix("add element ") else {
                continue;
            };
            let (head, list) = rest.split_once(" { ").expect("an element list");
            let list = list.strip_suffix(" }").expect("a closed element list");
            out.extend(list.split(", ").map(|e| format!("{head} {e}")));
        }
        out.sort();
        out
    }

    /// A full sync renders every element from the bookkeeping (`Op::LoadAll`): the same
    /// elements, once each, that adding the ports one by one programs; and recompiling the same
    /// ports afterwards changes nothing.
    #[test]
    fn a_full_sync_renders_what_incremental_syncs_program() {
        let mut state = ProxyState::default();
        state.node.node_name = "me".into();
        let eps: Vec<_> = (1..=20)
            .map(|n| fixtures::endpoint([10, 244, 1, n].into(), "me"))
            .collect();
        // Two ports of one Service share its clusterIP; the endpoints are shared by all three.
        let mut http = fixtures::service_port("web", "10.96.0.10");
        http.name.port_name = "http".into();
        let mut https = http.clone();
        https.name.port_name = "https".into();
        https.port = 443;
        let mut sticky = fixtures::service_port("sticky", "10.96.0.11");
        sticky.affinity = Some(std::time::Duration::from_secs(30));
        sticky.node_port = 30080;
        sticky.external_local = true;
        // In name order, the order a full sync compiles them in (target ids are handed out in
        // compile order).
        let ports = [(sticky, 20), (http, 3), (https, 3)];
        for (svc, n) in &ports {
            state.set_port(svc.clone(), eps[..*n].to_vec());
        }
        // A declared service range: the IPv4 table exists before its first Service.
        let cfg = BackendConfig {
            service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
            ..BackendConfig::default()
        };
        let mut full = Nftables::empty(&cfg);
        full.families = &[IpFamily::V4];
        let (is_full, ops, _) = full.plan_ops(&state, &ChangeSet::default(), true);
        assert!(is_full && ops.contains(&Op::LoadAll));
        let loaded = added(&full.script(&ops));

        // The same ports added one at a time after an empty full sync.
        let mut one_by_one = Nftables::empty(&cfg);
        one_by_one.families = &[IpFamily::V4];
        let mut grown = ProxyState::default();
        grown.node = state.node.clone();
        let (_, ops, _) = one_by_one.plan_ops(&grown, &ChangeSet::default(), true);
        let mut incremental = added(&one_by_one.script(&ops));
        for (svc, n) in &ports {
            grown.set_port(svc.clone(), eps[..*n].to_vec());
            let changes = ChangeSet {
                changed: [svc.name.clone()].into(),
                ..Default::default()
            };
            let (is_full, ops, _) = one_by_one.plan_ops(&grown, &changes, false);
            assert!(!is_full);
            assert!(!ops.iter().any(|op| matches!(op, Op::DeleteElement { .. })));
            incremental.extend(added(&one_by_one.script(&ops)));
        }
        incremental.sort();
        assert_eq!(loaded, incremental);
        let mut unique = loaded.clone();
        unique.dedup();
        assert_eq!(unique, loaded, "every element once");
        assert!(loaded
            .iter()
            .any(|e| e.contains("hairpin 10.244.1.3 . 10.244.1.3")));

        let changes = ChangeSet {
            changed: ports.iter().map(|(svc, _)| svc.name.clone()).collect(),
            ..Default::default()
        };
        let (_, ops, touched) = full.plan_ops(&state, &changes, false);
        assert_eq!(touched, 3);
        assert!(ops.is_empty(), "{ops:?}");
    }

    /// Where the kernel has no IPv6 the `ip6` table is never named: nf_tables would refuse it
    /// and with it the whole transaction.
    #[test]
    fn without_kernel_ipv6_only_the_ip_table_is_programmed() {
        let mut state = ProxyState::default();
        let mut svc = fixtures::service_port("web", "10.96.0.10");
        svc.cluster_ips.push("fd00:10:96::10".parse().unwrap());
        state.set_port(
            svc,
            vec![fixtures::endpoint([10, 244, 1, 2].into(), "node")],
        );
        let mut v4 = Nftables::empty(&BackendConfig::default());
        v4.families = &[IpFamily::V4];
        let (_, ops, _) = v4.plan_ops(&state, &ChangeSet::default(), true);
        let script = v4.script(&ops);
        assert!(script.contains("add table ip kpr"));
        assert!(!script.contains("ip6"), "{script}");
        assert!(!ruleset::delete_tables(v4.families).contains("ip6"));
        let mut both = Nftables::empty(&BackendConfig::default());
        both.families = &IpFamily::ALL;
        let (_, ops, _) = both.plan_ops(&state, &ChangeSet::default(), true);
        let script = both.script(&ops);
        assert!(script.contains("add element ip6 kpr cluster_ips { fd00:10:96::10 }"));
    }
}

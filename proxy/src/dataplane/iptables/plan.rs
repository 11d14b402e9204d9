//! One sync's `iptables-restore` input: which chains are declared, rewritten, flushed and
//! deleted, planned from the compiled service ports and the bookkeeping of what the kernel holds,
//! then rendered table by table.

use super::*;

impl Iptables {
    /// Builds the restore input of a sync and updates the bookkeeping as if it was applied.
    pub(super) fn plan_restore(
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
            let new = compile::compile(state, spn, &mut self.ids, self.family);
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
                exec::chains(self.tool(), "nat", "KPR-")?
                    .into_iter()
                    .collect(),
                exec::chains(self.tool(), "filter", "KPR-")?
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
            p.nat_rules.extend(t.pick_rules(table.picks(t.id)));
        }
    }
}

/// The label the least-connection table carries for a target: `<LC chain> <service port>`.
fn lc_label(t: &compile::LcTarget) -> String {
    format!("{} {}", t.chain, t.spn)
}

/// The pieces of one restore input, rendered table by table.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) nat_declare: BTreeSet<String>,
    pub(super) nat_leftovers: BTreeSet<String>,
    pub(super) nat_deletes: Vec<String>,
    pub(super) nat_rules: Vec<String>,
    pub(super) nat_delete_chains: Vec<String>,
    pub(super) filter_declare: BTreeSet<String>,
    pub(super) filter_leftovers: BTreeSet<String>,
    pub(super) filter_deletes: Vec<String>,
    pub(super) filter_rules: Vec<String>,
}

impl Plan {
    /// Our chains (nat, filter) once this plan is applied, given those before it (`None`: only
    /// what the plan itself declares or lists as leftovers is known).
    pub(super) fn chains_after(
        &self,
        before: Option<&[BTreeSet<String>; 2]>,
    ) -> [BTreeSet<String>; 2] {
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

    pub(super) fn render(&self) -> String {
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

pub(super) fn count_ops(script: &str) -> usize {
    script
        .lines()
        .filter(|l| {
            l.starts_with(':') || l.starts_with("-A") || l.starts_with("-D") || l.starts_with("-X")
        })
        .count()
}

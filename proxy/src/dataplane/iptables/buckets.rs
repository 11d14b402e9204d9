//! Bucket chains of the iptables backend: which service ports' rules live in which
//! `KPR-SVCB-bb` chain, and which buckets a sync must rewrite.
//!
//! Pure bookkeeping (no I/O). A bucket is rewritten whole (declared, which flushes it, then every
//! member's rules, members in name order) whenever one of its members changes; at 20,000 Services
//! that is about 80 service ports, a few hundred rules.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::compile::{bucket_chain, Bucketed};

/// A bucket whose content changed: its chain and all its rules (none: the bucket is empty now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketChange {
    pub chain: String,
    /// Complete rules without `-A CHAIN`.
    pub rules: Vec<String>,
}

/// Every bucket's members and the buckets changed since the last [`Buckets::take_changes`].
#[derive(Debug, Default)]
pub struct Buckets {
    members: HashMap<u16, BTreeMap<String, Vec<String>>>,
    dirty: BTreeSet<u16>,
}

impl Buckets {
    /// Forgets every member (a full sync re-adds them all).
    pub fn clear(&mut self) {
        self.dirty.extend(self.members.keys().copied());
        self.members.clear();
    }

    /// Service port `spn` moves from `old` to `new` (either may be none).
    pub fn update(&mut self, spn: &str, old: Option<&Bucketed>, new: Option<&Bucketed>) {
        if old == new {
            return;
        }
        if let Some(o) = old {
            if let Some(m) = self.members.get_mut(&o.bucket) {
                m.remove(spn);
                if m.is_empty() {
                    self.members.remove(&o.bucket);
                }
            }
            self.dirty.insert(o.bucket);
        }
        if let Some(n) = new {
            self.members
                .entry(n.bucket)
                .or_default()
                .insert(spn.to_string(), n.rules.clone());
            self.dirty.insert(n.bucket);
        }
    }

    /// The buckets to rewrite, with their whole content.
    pub fn take_changes(&mut self) -> Vec<BucketChange> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|b| BucketChange {
                chain: bucket_chain(b),
                rules: self
                    .members
                    .get(&b)
                    .map(|m| m.values().flatten().cloned().collect())
                    .unwrap_or_default(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(bucket: u16, rule: &str) -> Bucketed {
        Bucketed {
            bucket,
            rules: vec![rule.to_string()],
        }
    }

    #[test]
    fn a_changed_member_rewrites_its_whole_bucket_in_name_order() {
        let mut b = Buckets::default();
        b.update("b/svc", None, Some(&member(3, "-d B")));
        b.update("a/svc", None, Some(&member(3, "-d A")));
        b.take_changes();
        b.update("b/svc", Some(&member(3, "-d B")), Some(&member(3, "-d B2")));
        assert_eq!(
            b.take_changes(),
            vec![BucketChange {
                chain: "KPR-SVCB-03".into(),
                rules: vec!["-d A".into(), "-d B2".into()],
            }]
        );
    }

    #[test]
    fn an_unchanged_member_rewrites_nothing_and_a_move_rewrites_both_buckets() {
        let mut b = Buckets::default();
        b.update("a/svc", None, Some(&member(1, "-d A")));
        b.take_changes();
        b.update("a/svc", Some(&member(1, "-d A")), Some(&member(1, "-d A")));
        assert!(b.take_changes().is_empty());
        b.update("a/svc", Some(&member(1, "-d A")), Some(&member(2, "-d A")));
        let changes = b.take_changes();
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].chain, "KPR-SVCB-01");
        assert!(changes[0].rules.is_empty(), "the old bucket is empty now");
        assert_eq!(changes[1].rules, vec!["-d A".to_string()]);
    }
}

//! The elements the kernel holds, with their owners, and the diff that turns a recompiled
//! service port into element operations.
//!
//! Owns [`ElementTable`]. Two service ports may need the same key (two ports of one Service share
//! a clusterIP in `cluster_ips`; two Services may claim one externalIP:port): the table keeps
//! every owner, programs the first owner's value, and deletes the key only when its last owner
//! goes. This is what lets a sync touch only the changed service ports without listing the table.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::compile::Element;
use super::ops::Op;
use crate::model::IpFamily;

/// An owner of a key and the value it wants.
type Owner = (u32, Option<Arc<str>>);

/// Owners of one key and the values they want; the first is programmed. Almost every key has
/// one owner, kept inline: a Vec would allocate room for four per element.
#[derive(Debug, Clone)]
enum Owners {
    One(Owner),
    Many(Vec<Owner>),
}

impl Owners {
    fn as_slice(&self) -> &[Owner] {
        match self {
            Owners::One(o) => std::slice::from_ref(o),
            Owners::Many(v) => v,
        }
    }

    fn push(&mut self, owner: Owner) {
        match self {
            Owners::One(first) => {
                let first = first.clone();
                *self = Owners::Many(vec![first, owner]);
            }
            Owners::Many(v) => v.push(owner),
        }
    }

    /// Removes the owner at `pos`; false when none is left.
    fn remove(&mut self, pos: usize) -> bool {
        match self {
            Owners::One(_) => false,
            Owners::Many(v) => {
                v.remove(pos);
                if let [only] = v.as_slice() {
                    *self = Owners::One(only.clone());
                }
                true
            }
        }
    }
}

/// What is programmed, keyed by (family, set, key).
#[derive(Debug, Clone, Default)]
pub struct ElementTable {
    keys: HashMap<(IpFamily, &'static str, Arc<str>), Owners>,
}

/// Operations collected by a diff: deletions are applied before additions so that a key whose
/// value changes is deleted and re-added in one transaction.
#[derive(Debug, Default)]
pub struct Delta {
    pub deletes: Vec<Op>,
    pub adds: Vec<Op>,
}

impl Delta {
    /// Deletions, then additions, each grouped by set (stable) so that `ops::render` batches
    /// them into few commands.
    pub fn into_ops(mut self) -> Vec<Op> {
        self.deletes.sort_by(|a, b| a.target().cmp(&b.target()));
        self.adds.sort_by(|a, b| a.target().cmp(&b.target()));
        if self.deletes.is_empty() {
            // A full sync: only additions, kept as they are rather than copied.
            return self.adds;
        }
        let mut ops = self.deletes;
        ops.extend(self.adds);
        ops
    }
}

impl ElementTable {
    /// Number of distinct programmed keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets everything (the kernel side was flushed).
    pub fn clear(&mut self) {
        self.keys.clear();
    }

    /// Replaces `owner`'s elements `old` by `new`, recording the kernel operations needed.
    pub fn replace(&mut self, owner: u32, old: &[Element], new: &[Element], delta: &mut Delta) {
        let old_set: HashSet<&Element> = old.iter().collect();
        let new_set: HashSet<&Element> = new.iter().collect();
        for e in old {
            if !new_set.contains(e) {
                self.remove(owner, e, delta);
            }
        }
        for e in new {
            if !old_set.contains(e) {
                self.add(owner, e, delta);
            }
        }
    }

    fn add(&mut self, owner: u32, e: &Element, delta: &mut Delta) {
        match self.keys.entry((e.family, e.set, e.key.clone())) {
            Entry::Occupied(mut o) => o.get_mut().push((owner, e.value.clone())),
            Entry::Vacant(v) => {
                v.insert(Owners::One((owner, e.value.clone())));
                delta.adds.push(add_op(e, e.value.clone()));
            }
        }
    }

    fn remove(&mut self, owner: u32, e: &Element, delta: &mut Delta) {
        let k = (e.family, e.set, e.key.clone());
        let Some(owners) = self.keys.get_mut(&k) else {
            return;
        };
        let Some(pos) = owners
            .as_slice()
            .iter()
            .position(|(o, v)| *o == owner && *v == e.value)
        else {
            return;
        };
        let active_before = owners.as_slice()[0].1.clone();
        let left = owners.remove(pos);
        match owners.as_slice().first().filter(|_| left) {
            None => {
                self.keys.remove(&k);
                delta.deletes.push(delete_op(e));
            }
            Some((_, v)) if pos == 0 && *v != active_before => {
                delta.deletes.push(delete_op(e));
                delta.adds.push(add_op(e, v.clone()));
            }
            Some(_) => {}
        }
    }
}

/// Adds `e`'s key with `value` (the programmed owner's, which may not be `e`'s).
fn add_op(e: &Element, value: Option<Arc<str>>) -> Op {
    Op::AddElement {
        family: e.family,
        set: e.set,
        key: e.key.clone(),
        value,
    }
}

fn delete_op(e: &Element) -> Op {
    Op::DeleteElement {
        family: e.family,
        set: e.set,
        key: e.key.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(set: &'static str, key: &str, value: Option<&str>) -> Element {
        Element {
            family: IpFamily::V4,
            set,
            key: key.into(),
            value: value.map(Into::into),
        }
    }

    #[test]
    fn shared_key_is_deleted_only_with_its_last_owner() {
        let mut t = ElementTable::default();
        let ip = el("cluster_ips", "10.0.0.1", None);
        let mut d = Delta::default();
        t.replace(1, &[], std::slice::from_ref(&ip), &mut d);
        t.replace(2, &[], std::slice::from_ref(&ip), &mut d);
        assert_eq!(d.adds.len(), 1);
        let mut d = Delta::default();
        t.replace(1, std::slice::from_ref(&ip), &[], &mut d);
        assert!(d.deletes.is_empty() && d.adds.is_empty());
        t.replace(2, std::slice::from_ref(&ip), &[], &mut d);
        assert_eq!(d.deletes.len(), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn conflicting_owner_takes_over_when_the_first_leaves() {
        let mut t = ElementTable::default();
        let a = el("fe", "1.2.3.4 . tcp . 80", Some("5"));
        let b = el("fe", "1.2.3.4 . tcp . 80", Some("9"));
        let mut d = Delta::default();
        t.replace(1, &[], std::slice::from_ref(&a), &mut d);
        t.replace(2, &[], std::slice::from_ref(&b), &mut d);
        assert_eq!(d.adds.len(), 1);
        let mut d = Delta::default();
        t.replace(1, std::slice::from_ref(&a), &[], &mut d);
        assert_eq!(d.deletes.len(), 1);
        assert_eq!(d.adds, vec![add_op(&a, Some("9".into()))]);
    }

    #[test]
    fn changed_value_is_deleted_then_added() {
        let mut t = ElementTable::default();
        let a = el("slots", "3 . 0", Some("10.1.0.2 . 80"));
        let b = el("slots", "3 . 0", Some("10.1.0.3 . 80"));
        let mut d = Delta::default();
        t.replace(1, &[], std::slice::from_ref(&a), &mut d);
        let mut d = Delta::default();
        t.replace(
            1,
            std::slice::from_ref(&a),
            std::slice::from_ref(&b),
            &mut d,
        );
        let ops = d.into_ops();
        assert!(matches!(ops[0], Op::DeleteElement { .. }));
        assert!(matches!(ops[1], Op::AddElement { .. }));
    }
}

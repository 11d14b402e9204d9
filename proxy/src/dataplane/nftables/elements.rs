//! The elements of the tables' sets and maps, the ones the kernel holds with their owners, and
//! the diff that turns a recompiled service port into element operations.
//!
//! Owns [`Element`] (typed: keys and values are rendered to nft text only when a transaction is
//! written, so the agent holds no strings per element) and [`ElementTable`]. Two service ports
//! may need the same key (two ports of one Service share a clusterIP in `cluster_ips`; two
//! Services may claim one externalIP:port; endpoints shared by Services share a `hairpin` key):
//! the table keeps every owner, programs the first owner's value, and deletes the key only when
//! its last owner goes. Elements keyed by a target id belong to one service port and are diffed
//! without the table ([`diff_owned`]). This is what lets a sync touch only the changed service
//! ports without listing the kernel's table.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use super::ops::Op;
use crate::model::{IpFamily, Protocol};

/// The key of an element, as its set's type reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// `cluster_ips`: an address.
    Addr(IpAddr),
    /// `hairpin`: an endpoint address as source and destination (`a . a`).
    Hairpin(IpAddr),
    /// `fe*`, `masq_*`, `fw_protected`: address . protocol . port.
    AddrPort(IpAddr, Protocol, u16),
    /// `np*`, `npmasq_*`: protocol . port.
    ProtoPort(Protocol, u16),
    /// `targets`, `rr_nN`, `aff_lookup`, `aff_record`: a target id.
    Target(u32),
    /// `slots_*`, `lc_pick_*`: target id . slot.
    Slot(u32, u32),
    /// `fw_allowed`: address . protocol . port . allowed source (rare: boxed to keep every
    /// other key small).
    Allowed(Box<(IpAddr, Protocol, u16, String)>),
}

/// The data of a map element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// `fe*`, `np*`: the target id (conntrack mark) a frontend leads to.
    Target(u32),
    /// `slots_*`, `lc_pick_*`: an endpoint, address . port.
    Endpoint(IpAddr, u16),
    /// `targets`, `aff_lookup`, `aff_record`: a verdict.
    Verdict(Verdict),
}

/// The verdicts of the verdict maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    EmptyReject,
    EmptyDrop,
    LeastConn,
    /// `goto maglev`: the slot of the flow's hash in the target's Maglev table.
    Maglev,
    /// `goto rr_N_B`: round-robin over N slots in counter bucket B.
    RoundRobin(u32, u32),
    /// `jump aff_T`: session affinity lookup with a timeout of T seconds.
    AffinityLookup(u64),
    /// `jump rec_T`: records the endpoint for affinity with a timeout of T seconds.
    AffinityRecord(u64),
}

/// One element of one set or map of one family's table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub family: IpFamily,
    pub set: &'static str,
    pub key: Key,
    pub value: Option<Value>,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Addr(a) => write!(f, "{a}"),
            Key::Hairpin(a) => write!(f, "{a} . {a}"),
            Key::AddrPort(a, p, port) => write!(f, "{a} . {} . {port}", p.lower()),
            Key::ProtoPort(p, port) => write!(f, "{} . {port}", p.lower()),
            Key::Target(id) => write!(f, "{id}"),
            Key::Slot(id, slot) => write!(f, "{id} . {slot}"),
            Key::Allowed(k) => write!(f, "{} . {} . {} . {}", k.0, k.1.lower(), k.2, k.3),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Target(id) => write!(f, "{id}"),
            Value::Endpoint(a, port) => write!(f, "{a} . {port}"),
            Value::Verdict(v) => write!(f, "{v}"),
        }
    }
}

impl Verdict {
    /// The chain the verdict leads to, and whether it jumps there (and returns) rather than
    /// going.
    pub fn chain(&self) -> (bool, std::borrow::Cow<'static, str>) {
        use super::ruleset::{affinity_name, affinity_record_name};
        match self {
            Verdict::EmptyReject => (false, "empty_reject".into()),
            Verdict::EmptyDrop => (false, "empty_drop".into()),
            Verdict::LeastConn => (false, "lc".into()),
            Verdict::Maglev => (false, "maglev".into()),
            Verdict::RoundRobin(n, bucket) => (false, format!("rr_{n}_{bucket}").into()),
            Verdict::AffinityLookup(secs) => (true, affinity_name(*secs).into()),
            Verdict::AffinityRecord(secs) => (true, affinity_record_name(*secs).into()),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (jump, chain) = self.chain();
        write!(f, "{} {chain}", if jump { "jump" } else { "goto" })
    }
}

/// An owner of a key and the value it wants.
type Owner = (u32, Option<Value>);

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
                let first = *first;
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
                    *self = Owners::One(*only);
                }
                true
            }
        }
    }
}

/// What is programmed, keyed by (family, set, key).
#[derive(Debug, Clone, Default)]
pub struct ElementTable {
    keys: HashMap<(IpFamily, &'static str, Key), Owners>,
}

/// Operations collected by a diff: deletions are applied before additions so that a key whose
/// value changes is deleted and re-added in one transaction.
#[derive(Debug, Default)]
pub struct Delta {
    pub deletes: Vec<Op>,
    pub adds: Vec<Op>,
}

impl Delta {
    /// Empties it, keeping its capacity.
    pub fn clear(&mut self) {
        self.deletes.clear();
        self.adds.clear();
    }

    /// Deletions, then additions, each grouped by set (stable) so that `ops::render` batches
    /// them into few commands.
    pub fn into_ops(mut self) -> Vec<Op> {
        self.deletes.sort_by(|a, b| a.target().cmp(&b.target()));
        self.adds.sort_by(|a, b| a.target().cmp(&b.target()));
        if self.deletes.is_empty() {
            // Only additions (a new service port): kept as they are rather than copied.
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

    /// The programmed elements: each key with its first owner's value.
    pub fn programmed(
        &self,
    ) -> impl Iterator<Item = (IpFamily, &'static str, &Key, Option<Value>)> {
        self.keys
            .iter()
            .map(|((family, set, key), owners)| (*family, *set, key, owners.as_slice()[0].1))
    }

    /// Replaces `owner`'s elements `old` by `new`, recording the kernel operations needed.
    pub fn replace(&mut self, owner: u32, old: &[Element], new: &[Element], delta: &mut Delta) {
        diff(old, new, |e, change| match change {
            Change::Gone => self.remove(owner, e, delta),
            Change::Came => self.add(owner, e, delta),
        });
    }

    fn add(&mut self, owner: u32, e: &Element, delta: &mut Delta) {
        match self.keys.entry((e.family, e.set, e.key.clone())) {
            Entry::Occupied(mut o) => o.get_mut().push((owner, e.value)),
            Entry::Vacant(v) => {
                v.insert(Owners::One((owner, e.value)));
                delta.adds.push(add_op(e, e.value));
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
        let active_before = owners.as_slice()[0].1;
        let left = owners.remove(pos);
        match owners.as_slice().first().filter(|_| left) {
            None => {
                self.keys.remove(&k);
                delta.deletes.push(delete_op(e));
            }
            Some((_, v)) if pos == 0 && *v != active_before => {
                delta.deletes.push(delete_op(e));
                delta.adds.push(add_op(e, *v));
            }
            Some(_) => {}
        }
    }
}

/// Adds `e`'s key with `value` (the programmed owner's, which may not be `e`'s).
fn add_op(e: &Element, value: Option<Value>) -> Op {
    Op::AddElement {
        family: e.family,
        set: e.set,
        key: e.key.clone(),
        value,
    }
}

/// The operations that replace a service port's own elements `old` by `new`: keys no other port
/// has (they name one of its target ids), so no owner bookkeeping is needed. A key whose value
/// changes is deleted and re-added.
pub fn diff_owned(old: &[Element], new: &[Element], delta: &mut Delta) {
    diff(old, new, |e, change| match change {
        Change::Gone => delta.deletes.push(delete_op(e)),
        Change::Came => delta.adds.push(add_op(e, e.value)),
    });
}

/// Which side of a diff an element is on.
enum Change {
    Gone,
    Came,
}

/// Calls `f` with each element of `old` that is not in `new` (gone), then with each of `new`
/// that is not in `old` (came).
fn diff(old: &[Element], new: &[Element], mut f: impl FnMut(&Element, Change)) {
    if old.is_empty() {
        // A new port (every port of a full sync): nothing to compare.
        new.iter().for_each(|e| f(e, Change::Came));
        return;
    }
    let old_set: HashSet<&Element> = old.iter().collect();
    let new_set: HashSet<&Element> = new.iter().collect();
    for e in old.iter().filter(|e| !new_set.contains(e)) {
        f(e, Change::Gone);
    }
    for e in new.iter().filter(|e| !old_set.contains(e)) {
        f(e, Change::Came);
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

    fn el(set: &'static str, key: Key, value: Option<Value>) -> Element {
        Element {
            family: IpFamily::V4,
            set,
            key,
            value,
        }
    }

    fn fe_key() -> Key {
        Key::AddrPort([1, 2, 3, 4].into(), Protocol::Tcp, 80)
    }

    #[test]
    fn shared_key_is_deleted_only_with_its_last_owner() {
        let mut t = ElementTable::default();
        let ip = el("cluster_ips", Key::Addr([10, 0, 0, 1].into()), None);
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
        let a = el("fe", fe_key(), Some(Value::Target(5)));
        let b = el("fe", fe_key(), Some(Value::Target(9)));
        let mut d = Delta::default();
        t.replace(1, &[], std::slice::from_ref(&a), &mut d);
        t.replace(2, &[], std::slice::from_ref(&b), &mut d);
        assert_eq!(d.adds.len(), 1);
        assert_eq!(
            t.programmed().map(|p| p.3).collect::<Vec<_>>(),
            vec![Some(Value::Target(5))]
        );
        let mut d = Delta::default();
        t.replace(1, std::slice::from_ref(&a), &[], &mut d);
        assert_eq!(d.deletes.len(), 1);
        assert_eq!(d.adds, vec![add_op(&a, Some(Value::Target(9)))]);
    }

    #[test]
    fn changed_value_is_deleted_then_added() {
        let ep = |last: u8| Some(Value::Endpoint([10, 1, 0, last].into(), 80));
        let a = el("slots_tcp_3", Key::Slot(3, 0), ep(2));
        let b = el("slots_tcp_3", Key::Slot(3, 0), ep(3));
        let same = el("rr_n1", Key::Target(3), None);
        let mut d = Delta::default();
        diff_owned(&[a, same.clone()], &[b, same], &mut d);
        let ops = d.into_ops();
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert!(matches!(ops[0], Op::DeleteElement { .. }));
        assert!(matches!(ops[1], Op::AddElement { .. }));
    }

    #[test]
    fn keys_and_values_render_as_their_sets_read_them() {
        let v6: IpAddr = "fd00::2".parse().unwrap();
        assert_eq!(fe_key().to_string(), "1.2.3.4 . tcp . 80");
        assert_eq!(Key::Hairpin(v6).to_string(), "fd00::2 . fd00::2");
        assert_eq!(
            Key::ProtoPort(Protocol::Udp, 30053).to_string(),
            "udp . 30053"
        );
        assert_eq!(Key::Slot(7, 3).to_string(), "7 . 3");
        assert_eq!(Value::Endpoint(v6, 8080).to_string(), "fd00::2 . 8080");
        assert_eq!(
            Value::Verdict(Verdict::RoundRobin(17, 4)).to_string(),
            "goto rr_17_4"
        );
        assert_eq!(
            Value::Verdict(Verdict::AffinityRecord(30)).to_string(),
            "jump rec_30"
        );
    }
}

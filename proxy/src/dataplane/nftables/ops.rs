//! The operations of one nftables transaction and their rendering to `nft -f` text.
//!
//! Owns: [`Op`] (what a sync asks of the kernel, countable by tests), [`render_parts`], which
//! batches consecutive element operations on one set into one `add element`/`delete element`
//! command, and [`Batches`], which groups a full load's elements per set, so that a
//! 20,000-Service load is a few hundred commands, not hundreds of thousands.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::elements::{Key, Value};
use super::ruleset::fam;
use crate::model::IpFamily;

/// One operation of a transaction, in the order it is applied.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Raw nft commands that (re)create the table's skeleton: sets, maps, base chains and rules.
    /// Emitted once per full sync.
    Skeleton(String),
    /// Creates a chain that dispatch jumps to (`rr_N`, `aff_T`, `rec_T`) with its rules, and the
    /// affinity map it needs, if any. Idempotent: the chain is flushed before its rules are added.
    EnsureChain { name: String, commands: Vec<String> },
    /// Removes one element (maps: the key alone identifies it) from `family`'s table.
    DeleteElement {
        family: IpFamily,
        set: &'static str,
        key: Key,
    },
    /// Adds one element; `value` is the map data for maps, `None` for sets.
    AddElement {
        family: IpFamily,
        set: &'static str,
        key: Key,
        value: Option<Value>,
    },
    /// Every element the backend's bookkeeping holds (a full sync), rendered from it when the
    /// transaction is written rather than listed here: at 100,000 Services that list was
    /// 700,000 operations, the largest share of the agent's peak memory.
    LoadAll,
}

impl Op {
    /// The set or map this operation changes, if it is an element operation.
    pub fn set(&self) -> Option<&str> {
        match self {
            Op::DeleteElement { set, .. } | Op::AddElement { set, .. } => Some(set),
            _ => None,
        }
    }

    /// The family's table and the set this operation changes, if it is an element operation.
    pub fn target(&self) -> Option<(IpFamily, &str)> {
        match self {
            Op::DeleteElement { family, set, .. } | Op::AddElement { family, set, .. } => {
                Some((*family, set))
            }
            _ => None,
        }
    }

    /// The element key as nft reads it, if it is an element operation.
    pub fn key(&self) -> Option<String> {
        match self {
            Op::DeleteElement { key, .. } | Op::AddElement { key, .. } => Some(key.to_string()),
            _ => None,
        }
    }
}

/// Most elements per `add element` command: nft parses one command at a time, and very long
/// commands make its error messages useless without making the load faster.
const ELEMENTS_PER_COMMAND: usize = 4096;

/// Renders operations without [`Op::LoadAll`] as one `nft -f` script.
pub fn render(ops: &[Op]) -> String {
    debug_assert!(!ops.contains(&Op::LoadAll), "render_parts renders LoadAll");
    render_parts(ops, &mut |_| {}).concat()
}

/// Renders operations as the parts of one `nft -f` script (concatenated, they are the script),
/// batching runs of element operations per set; `load_all` appends the parts of [`Op::LoadAll`].
pub fn render_parts(ops: &[Op], load_all: &mut dyn FnMut(&mut Vec<String>)) -> Vec<String> {
    let mut parts = Vec::new();
    let mut out = String::new();
    let mut i = 0;
    while i < ops.len() {
        match &ops[i] {
            Op::Skeleton(text) => {
                out.push_str(text);
                out.push('\n');
                i += 1;
            }
            Op::EnsureChain { commands, .. } => {
                for c in commands {
                    out.push_str(c);
                    out.push('\n');
                }
                i += 1;
            }
            Op::DeleteElement { .. } | Op::AddElement { .. } => {
                i = render_element_run(ops, i, &mut out);
            }
            Op::LoadAll => {
                parts.push(std::mem::take(&mut out));
                load_all(&mut parts);
                i += 1;
            }
        }
    }
    parts.push(out);
    parts
}

/// Writes one element as an element list reads it: `key` or `key : value`.
fn write_element(out: &mut String, key: &Key, value: Option<Value>) {
    let _ = match value {
        Some(v) => write!(out, "{key} : {v}"),
        None => write!(out, "{key}"),
    };
}

/// Renders the run of element operations of one kind on one set starting at `start`; returns
/// the index after it.
fn render_element_run(ops: &[Op], start: usize, out: &mut String) -> usize {
    let verb = match &ops[start] {
        Op::AddElement { .. } => "add",
        _ => "delete",
    };
    let Some((family, set)) = ops[start].target() else {
        return start + 1;
    };
    let mut end = start;
    while end < ops.len()
        && end - start < ELEMENTS_PER_COMMAND
        && ops[end].target() == Some((family, set))
        && std::mem::discriminant(&ops[end]) == std::mem::discriminant(&ops[start])
    {
        end += 1;
    }
    let _ = write!(out, "{verb} element {} {set} {{ ", fam(family).table);
    for (n, op) in ops[start..end].iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        match op {
            Op::AddElement { key, value, .. } => write_element(out, key, *value),
            Op::DeleteElement { key, .. } => write_element(out, key, None),
            _ => {}
        }
    }
    out.push_str(" }\n");
    end
}

/// A full load's element additions, grouped per set as they come: each set's elements go to
/// its own text, cut into `add element` commands of at most [`ELEMENTS_PER_COMMAND`] elements.
#[derive(Debug, Default)]
pub struct Batches {
    sets: BTreeMap<(IpFamily, &'static str), (String, usize)>,
}

impl Batches {
    pub fn add(&mut self, family: IpFamily, set: &'static str, key: &Key, value: Option<Value>) {
        let (text, n) = self.sets.entry((family, set)).or_default();
        if *n % ELEMENTS_PER_COMMAND == 0 {
            if *n > 0 {
                text.push_str(" }\n");
            }
            let _ = write!(text, "add element {} {set} {{ ", fam(family).table);
        } else {
            text.push_str(", ");
        }
        write_element(text, key, value);
        *n += 1;
    }

    /// The commands, one part per set.
    pub fn into_parts(self, parts: &mut Vec<String>) {
        parts.extend(self.sets.into_values().map(|(mut text, _)| {
            text.push_str(" }\n");
            text
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn fe(last: u8, port: u16) -> Key {
        Key::AddrPort([10, 0, 0, last].into(), Protocol::Tcp, port)
    }

    fn add(set: &'static str, key: Key, value: Option<Value>) -> Op {
        Op::AddElement {
            family: IpFamily::V4,
            set,
            key,
            value,
        }
    }

    #[test]
    fn consecutive_elements_of_one_set_share_one_command() {
        let ops = vec![
            Op::DeleteElement {
                family: IpFamily::V4,
                set: "fe",
                key: fe(1, 80),
            },
            add("fe", fe(1, 80), Some(Value::Target(7))),
            add("fe", fe(2, 53), Some(Value::Target(8))),
            add("cluster_ips", Key::Addr([10, 0, 0, 2].into()), None),
            Op::AddElement {
                family: IpFamily::V6,
                set: "cluster_ips",
                key: Key::Addr("fd00::2".parse().unwrap()),
                value: None,
            },
        ];
        assert_eq!(
            render(&ops),
            "delete element ip kpr fe { 10.0.0.1 . tcp . 80 }\n\
             add element ip kpr fe { 10.0.0.1 . tcp . 80 : 7, 10.0.0.2 . tcp . 53 : 8 }\n\
             add element ip kpr cluster_ips { 10.0.0.2 }\n\
             add element ip6 kpr cluster_ips { fd00::2 }\n"
        );
    }

    #[test]
    fn long_runs_are_split() {
        let endpoint = Some(Value::Endpoint([10, 0, 0, 1].into(), 80));
        let ops: Vec<Op> = (0..=ELEMENTS_PER_COMMAND as u32)
            .map(|n| add("slots", Key::Slot(n, 0), endpoint))
            .collect();
        assert_eq!(render(&ops).lines().count(), 2);
        let mut batches = Batches::default();
        for n in 0..=ELEMENTS_PER_COMMAND as u32 {
            batches.add(IpFamily::V4, "slots", &Key::Slot(n, 0), endpoint);
        }
        batches.add(IpFamily::V4, "rr_n1", &Key::Target(1), None);
        let mut parts = Vec::new();
        batches.into_parts(&mut parts);
        let script = parts.concat();
        assert_eq!(
            script.lines().count(),
            3,
            "two commands for slots, one for rr_n1"
        );
        assert_eq!(
            script,
            "add element ip kpr rr_n1 { 1 }\n".to_string() + &render(&ops)
        );
    }
}

//! The operations of one nftables transaction and their rendering to `nft -f` text.
//!
//! Owns: [`Op`] (what a sync asks of the kernel, countable by tests) and [`render`], which batches
//! consecutive element operations on one set into one `add element`/`delete element` command so
//! that a 20,000-Service load is a few hundred commands, not hundreds of thousands.

use std::fmt::Write as _;
use std::sync::Arc;

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
        key: Arc<str>,
    },
    /// Adds one element; `value` is the map data for maps, `None` for sets. Key and value are
    /// the element table's own strings, shared: a full sync at 100,000 Services is 700,000 of
    /// these, and copies of their strings were a large part of the agent's peak memory.
    AddElement {
        family: IpFamily,
        set: &'static str,
        key: Arc<str>,
        value: Option<Arc<str>>,
    },
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

    /// The element key, if it is an element operation.
    pub fn key(&self) -> Option<&str> {
        match self {
            Op::DeleteElement { key, .. } | Op::AddElement { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Most elements per `add element` command: nft parses one command at a time, and very long
/// commands make its error messages useless without making the load faster.
const ELEMENTS_PER_COMMAND: usize = 4096;

/// Renders operations as one `nft -f` script, batching runs of element operations per set.
pub fn render(ops: &[Op]) -> String {
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
        }
    }
    out
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
            Op::AddElement {
                key,
                value: Some(v),
                ..
            } => {
                let _ = write!(out, "{key} : {v}");
            }
            Op::AddElement { key, .. } | Op::DeleteElement { key, .. } => out.push_str(key),
            _ => {}
        }
    }
    out.push_str(" }\n");
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(set: &'static str, key: &str, value: Option<&str>) -> Op {
        Op::AddElement {
            family: IpFamily::V4,
            set,
            key: key.into(),
            value: value.map(Into::into),
        }
    }

    #[test]
    fn consecutive_elements_of_one_set_share_one_command() {
        let ops = vec![
            Op::DeleteElement {
                family: IpFamily::V4,
                set: "fe",
                key: "10.0.0.1 . tcp . 80".into(),
            },
            add("fe", "10.0.0.1 . tcp . 80", Some("7")),
            add("fe", "10.0.0.2 . udp . 53", Some("8")),
            add("cluster_ips", "10.0.0.2", None),
            Op::AddElement {
                family: IpFamily::V6,
                set: "cluster_ips",
                key: "fd00::2".into(),
                value: None,
            },
        ];
        assert_eq!(
            render(&ops),
            "delete element ip kpr fe { 10.0.0.1 . tcp . 80 }\n\
             add element ip kpr fe { 10.0.0.1 . tcp . 80 : 7, 10.0.0.2 . udp . 53 : 8 }\n\
             add element ip kpr cluster_ips { 10.0.0.2 }\n\
             add element ip6 kpr cluster_ips { fd00::2 }\n"
        );
    }

    #[test]
    fn long_runs_are_split() {
        let ops: Vec<Op> = (0..ELEMENTS_PER_COMMAND + 1)
            .map(|n| add("slots", &format!("{n} . 0"), Some("10.0.0.1 . 80")))
            .collect();
        assert_eq!(render(&ops).lines().count(), 2);
    }
}

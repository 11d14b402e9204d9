//! The agent's module layers, checked from its source: which module of `proxy/src` uses which
//! (`crate::...` paths), that this graph has no cycle, and that no dataplane backend uses
//! another one. Prints the listing:
//!
//! ```sh
//! cargo test -p proxy --test layers -- --nocapture
//! ```
//!
//! A node is a top-level module (`selection`, `state`, ...) or, under `dataplane`, one backend or
//! the shared `dataplane::rules`; `dataplane` itself is the trait and `build`. Test code
//! (`tests.rs`, `#[cfg(test)]` modules) is not part of the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const BACKENDS: [&str; 4] = ["userspace", "nftables", "iptables", "ebpf"];

/// The node a source file belongs to, from its path under `src/`.
fn node_of(rel: &Path) -> Option<String> {
    let parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [one] if one == "lib" || one == "main" => None,
        [top, sub, ..] if top == "dataplane" && sub != "mod" => Some(format!("dataplane::{sub}")),
        [top, ..] if top == "cmd" => None,
        [top, ..] => Some(top.clone()),
        [] => None,
    }
}

/// The node a `crate::a::b` path names.
fn node_of_path(path: &str) -> String {
    let mut it = path.split("::");
    let top = it.next().unwrap_or_default();
    match (top, it.next()) {
        ("dataplane", Some(sub)) if BACKENDS.contains(&sub) || sub == "rules" => {
            format!("dataplane::{sub}")
        }
        _ => top.to_string(),
    }
}

/// The source without test modules: everything from the first `#[cfg(test)]` on (the crate keeps
/// its test modules at the end of a file).
fn product_code(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// Every `crate::...` path in `text`, as the module path after `crate::` (`use crate::{a, b}`
/// lists are split).
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `kpr_crate::`, not ours
        }
        if let Some(list) = rest.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            out.extend(
                list[..end]
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty()),
            );
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        out.push(rest[..end].trim_end_matches(':').to_string());
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading proxy/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// node -> the nodes it uses.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let Some(node) = node_of(rel) else {
            continue;
        };
        let text = fs::read_to_string(&file).expect("reading a source file");
        let uses = g.entry(node.clone()).or_default();
        for path in crate_paths(product_code(&text)) {
            let to = node_of_path(&path);
            if to != node && !to.is_empty() {
                uses.insert(to);
            }
        }
    }
    g
}

/// A cycle in `g`, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn modules_form_layers_without_cycles() {
    let g = graph();
    for (node, uses) in &g {
        let list: Vec<&str> = uses.iter().map(String::as_str).collect();
        println!("{node:<22} -> {}", list.join(", "));
    }
    assert!(
        g.contains_key("state") && g.contains_key("dataplane::rules"),
        "the listing lost its nodes: {g:?}"
    );
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn no_backend_uses_another() {
    let g = graph();
    for b in BACKENDS {
        let node = format!("dataplane::{b}");
        let uses = g.get(&node).unwrap_or_else(|| panic!("{node} is missing"));
        for other in BACKENDS.iter().filter(|o| **o != b) {
            assert!(
                !uses.contains(&format!("dataplane::{other}")),
                "{node} uses dataplane::{other}"
            );
        }
    }
}

#[test]
fn the_core_does_not_use_the_dataplanes() {
    let g = graph();
    for core in [
        "model",
        "selection",
        "state",
        "convert",
        "tracker",
        "conntrack",
    ] {
        let uses = g.get(core).unwrap_or_else(|| panic!("{core} is missing"));
        let up: Vec<&String> = uses.iter().filter(|u| u.starts_with("dataplane")).collect();
        assert!(up.is_empty(), "{core} uses {up:?}");
    }
}

#[test]
fn the_parser_finds_paths() {
    let text = "use crate::state::{A, B};\nuse crate::{model::X, selection};\nlet x = crate::dataplane::rules::v4(a);\n#[cfg(test)]\nuse crate::sync;";
    let paths = crate_paths(product_code(text));
    assert_eq!(
        paths,
        ["state", "model::X", "selection", "dataplane::rules::v4"]
    );
    assert_eq!(node_of_path("dataplane::rules::v4"), "dataplane::rules");
    assert_eq!(node_of_path("dataplane::BackendConfig"), "dataplane");
    assert_eq!(
        node_of(Path::new("dataplane/nftables/compile.rs")).as_deref(),
        Some("dataplane::nftables")
    );
    assert_eq!(
        node_of(Path::new("dataplane/mod.rs")).as_deref(),
        Some("dataplane")
    );
}

//! The controllers crate's layers, checked from its source: which module of `controllers/src` uses
//! which (`crate::...` and `super::...` paths), that this graph has no cycle, that the runtime and
//! the helpers import no controller, and that no controller imports a sibling. Prints the listing:
//!
//! ```sh
//! cargo test -p controllers --test layers -- --nocapture
//! ```
//!
//! A node is `helpers`, `runtime`, `error`, `manager`, `scheduler`, or one controller under one of
//! the [`GROUPS`] (`workload::deployment`, `auth::serviceaccount`, ...). What the endpoint controllers share
//! (upstream's `pkg/controller/util/endpoint`) is `endpoint::endpointutil` and
//! `endpoint::membership`, which they may use. Test code (`*_tests.rs` files, `#[cfg(test)]` modules)
//! is not part of the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The controller groups: each module under one of these is a controller.
const GROUPS: [&str; 11] = [
    "admission",
    "dra",
    "endpoint",
    "workload",
    "auth",
    "node",
    "namespace",
    "networking",
    "autoscaling",
    "quota",
    "volume",
];

/// Modules of the endpoint group its controllers may share.
const ENDPOINT_SHARED: [&str; 2] = ["endpoint::endpointutil", "endpoint::membership"];

/// The node a module path (`workload::daemonset::plan`, as components) belongs to.
fn node_of_module(parts: &[&str]) -> Option<String> {
    match parts {
        [] | ["lib"] | ["bin", ..] => None,
        [group, sub, ..] if GROUPS.contains(group) && *sub != "mod" => {
            Some(format!("{group}::{sub}"))
        }
        // `crate::Error` / `crate::Result`: the re-exports of the error module.
        ["Error" | "Result", ..] => Some("error".to_string()),
        [top, ..] => Some(top.to_string()),
    }
}

/// The module path of a source file under `src/` (`workload/daemonset/mod.rs` ->
/// `workload::daemonset`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The source without test modules: everything from the first `#[cfg(test)]` on (the crate keeps
/// its test modules at the end of a file).
fn product_code(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// Every path after `prefix` (`crate::` or `super::`) in `text`, as written after the prefix
/// (`use crate::{a, b}` lists are split).
fn paths_after<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // `other_crate::`, or a `super::` inside `super::super::`
        }
        if let Some(list) = rest.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            out.extend(
                list[..end]
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty()),
            );
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        out.push(rest[..end].trim_end_matches(':'));
        rest = &rest[end..];
    }
    out
}

/// The absolute module paths (components) `text`, in module `module`, refers to.
fn used_modules(module: &[String], text: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = paths_after(text, "crate::")
        .into_iter()
        .map(|p| p.split("::").map(str::to_string).collect())
        .collect();
    // `super::x` from `a/b/c.rs` (module a::b::c) is a::b::x; from `a/b/mod.rs` (a::b) it is a::x.
    for p in paths_after(text, "super::") {
        let mut base: Vec<String> = module.to_vec();
        base.pop();
        let mut rest = p;
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        base.extend(rest.split("::").map(str::to_string));
        out.push(base);
    }
    out
}

/// node -> the nodes it uses, from `(path under src/, text)` pairs.
fn graph_of(files: &[(PathBuf, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        if rel
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with("_tests.rs") || n == "test_util.rs")
        {
            continue;
        }
        let module = module_of(rel);
        let parts: Vec<&str> = module.iter().map(String::as_str).collect();
        let Some(node) = node_of_module(&parts) else {
            continue;
        };
        let uses = g.entry(node.clone()).or_default();
        for used in used_modules(&module, product_code(text)) {
            let used: Vec<&str> = used.iter().map(String::as_str).collect();
            if let Some(to) = node_of_module(&used) {
                if to != node {
                    uses.insert(to);
                }
            }
        }
    }
    g
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading controllers/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate's sources as `(path under src/, text)`.
fn sources() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = fs::read_to_string(&f).expect("reading a source file");
            (f.strip_prefix(&src).expect("under src").to_path_buf(), text)
        })
        .collect()
}

fn is_controller(node: &str) -> bool {
    GROUPS
        .iter()
        .any(|g| node.strip_prefix(g).is_some_and(|r| r.starts_with("::")))
        && !ENDPOINT_SHARED.contains(&node)
}

/// What breaks the layering in `g`, one line each.
fn violations(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(cycle) = find_cycle(g) {
        out.push(format!("module cycle: {}", cycle.join(" -> ")));
    }
    for (node, uses) in g {
        for used in uses {
            let allowed = match node.as_str() {
                // The bottom: pure helpers use nothing of the crate but its error type.
                "helpers" => used == "error",
                "error" => false,
                // The machinery knows no controller and no scheduler.
                "runtime" => used == "helpers" || used == "error",
                "scheduler" => matches!(used.as_str(), "runtime" | "helpers" | "error"),
                "manager" => true,
                // The group modules only declare their controllers (and link the layers below
                // in their docs).
                g if GROUPS.contains(&g) => {
                    matches!(used.as_str(), "runtime" | "helpers" | "error")
                        || used.starts_with(&format!("{node}::"))
                }
                n if ENDPOINT_SHARED.contains(&n) => {
                    matches!(used.as_str(), "runtime" | "helpers" | "error")
                        || ENDPOINT_SHARED.contains(&used.as_str())
                }
                n if is_controller(n) => {
                    matches!(used.as_str(), "runtime" | "helpers" | "error")
                        || (n.starts_with("endpoint::") && ENDPOINT_SHARED.contains(&used.as_str()))
                }
                _ => false,
            };
            if !allowed {
                out.push(format!("{node} uses {used}"));
            }
        }
    }
    out
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
fn controllers_runtime_and_helpers_form_layers() {
    let g = graph_of(&sources());
    for (node, uses) in &g {
        let list: Vec<&str> = uses.iter().map(String::as_str).collect();
        println!("{node:<32} -> {}", list.join(", "));
    }
    for expected in [
        "runtime",
        "helpers",
        "scheduler",
        "manager",
        "endpoint::endpointslice",
        "workload::daemonset",
        "workload::ttlafterfinished",
        "auth::serviceaccount",
        "auth::rootcacertpublisher",
        "node::tainteviction",
    ] {
        assert!(
            g.contains_key(expected),
            "the listing lost {expected}: {g:?}"
        );
    }
    let bad = violations(&g);
    assert!(bad.is_empty(), "layer violations:\n  {}", bad.join("\n  "));
}

#[test]
fn a_planted_sibling_import_is_caught() {
    let mut files = sources();
    let (_, text) = files
        .iter_mut()
        .find(|(p, _)| p == Path::new("workload/daemonset/plan.rs"))
        .expect("workload/daemonset/plan.rs");
    text.insert_str(0, "use crate::workload::deployment::util::max_surge;\n");
    assert!(
        violations(&graph_of(&files))
            .contains(&"workload::daemonset uses workload::deployment".into()),
        "a sibling import went unnoticed"
    );
    // Relative paths count too: `super::super::job` from workload/cronjob/plan.rs.
    let mut files = sources();
    let (_, text) = files
        .iter_mut()
        .find(|(p, _)| p == Path::new("workload/cronjob/plan.rs"))
        .expect("workload/cronjob/plan.rs");
    text.insert_str(0, "use super::super::job::plan;\n");
    assert!(
        violations(&graph_of(&files)).contains(&"workload::cronjob uses workload::job".into()),
        "a relative sibling import went unnoticed"
    );
    // Nor in the other groups.
    let mut files = sources();
    let (_, text) = files
        .iter_mut()
        .find(|(p, _)| p == Path::new("auth/rootcacertpublisher.rs"))
        .expect("auth/rootcacertpublisher.rs");
    text.insert_str(0, "use crate::auth::serviceaccount::Config;\n");
    assert!(
        violations(&graph_of(&files))
            .contains(&"auth::rootcacertpublisher uses auth::serviceaccount".into()),
        "a sibling import in the auth group went unnoticed"
    );
    // And the runtime may not reach up into a controller.
    let mut files = sources();
    let (_, text) = files
        .iter_mut()
        .find(|(p, _)| p == Path::new("runtime/queue.rs"))
        .expect("runtime/queue.rs");
    text.insert_str(0, "use crate::{helpers, workload::replicaset};\n");
    assert!(
        violations(&graph_of(&files)).contains(&"runtime uses workload::replicaset".into()),
        "the runtime importing a controller went unnoticed"
    );
}

#[test]
fn relative_paths_resolve_from_the_file() {
    let module: Vec<String> = ["workload", "cronjob", "plan"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let used = used_modules(
        &module,
        "use super::schedule::Schedule;\nsuper::super::job::x();",
    );
    assert_eq!(
        used,
        vec![
            vec!["workload", "cronjob", "schedule", "Schedule"],
            vec!["workload", "job", "x"]
        ]
    );
}

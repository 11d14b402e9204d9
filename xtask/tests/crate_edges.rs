//! The workspace's crate graph, from `cargo metadata`: no library dependency of one workspace crate
//! on another closes a cycle (over normal, build or dev edges), and the product crates (the agent, its eBPF types, the
//! controllers) never depend on test or benchmark infrastructure except as dev-dependencies.
//! `cargo test -p xtask --test crate_edges -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Test, benchmark and tooling crates: a product crate may use them only in its own tests.
const INFRASTRUCTURE: [&str; 4] = ["kpr-tests", "kpr-controlplane", "kpr-bench", "xtask"];
const PRODUCT: [&str; 3] = ["proxy", "proxy-common", "controllers"];

/// Workspace crate -> (workspace dependency, kind: "normal" / "dev" / "build").
fn graph() -> BTreeMap<String, BTreeSet<(String, String)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect();
    let mut g = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().expect("a package name").to_string();
        let deps: BTreeSet<(String, String)> = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| {
                let dep = d["name"].as_str()?;
                names.contains(dep).then(|| {
                    let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                    (dep.to_string(), kind)
                })
            })
            .collect();
        g.insert(name, deps);
    }
    g
}

#[test]
fn workspace_crates_form_no_cycle() {
    let g = graph();
    for (name, deps) in &g {
        let list: Vec<String> = deps.iter().map(|(d, k)| format!("{d} ({k})")).collect();
        println!("{name:<18} -> {}", list.join(", "));
    }
    assert!(g.contains_key("proxy") && g.contains_key("xtask"), "{g:?}");
    // Two crates whose tests use each other's library (proxy and kpr-tests) are fine; a crate
    // whose library needs one that reaches back to it, by any kind of edge, is not.
    for (from, deps) in &g {
        for (to, kind) in deps.iter().filter(|(_, k)| k != "dev") {
            if let Some(path) = path_between(&g, to, from) {
                panic!(
                    "{from} -> {to} ({kind}) closes a cycle: {}",
                    path.join(" -> ")
                );
            }
        }
    }
}

/// A path of workspace crates from `from` to `to` over any kind of edge.
fn path_between(
    g: &BTreeMap<String, BTreeSet<(String, String)>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![from.to_string()]];
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a path has a crate").clone();
        if last == to {
            return Some(path);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for (next, _) in g.get(&last).into_iter().flatten() {
            let mut longer = path.clone();
            longer.push(next.clone());
            stack.push(longer);
        }
    }
    None
}

#[test]
fn product_crates_use_infrastructure_only_in_their_tests() {
    let g = graph();
    for product in PRODUCT {
        let deps = g
            .get(product)
            .unwrap_or_else(|| panic!("{product} is not in the workspace"));
        for (dep, kind) in deps {
            assert!(
                !INFRASTRUCTURE.contains(&dep.as_str()) || kind == "dev",
                "{product} depends on {dep} as a {kind} dependency"
            );
        }
    }
}

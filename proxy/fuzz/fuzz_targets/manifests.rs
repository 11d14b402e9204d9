//! Fuzzes the file source's manifest parser with any text, as YAML and as JSON.
//!
//! Invariants checked (a failed assertion is a crash for libFuzzer):
//! - no panic, and bounded time and memory (libFuzzer's `-timeout` and `-rss_limit_mb`);
//! - every problem names the file it came from, a kind, an object and a field;
//! - parsing is deterministic;
//! - the objects found are served exactly the same when they come back as items of a
//!   `kind: List` (the way `kubectl get -o json` writes them) and as separate YAML documents.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use proxy::source::file::{parse_manifests, ParsedFile};

fn check_errors(file: &Path, parsed: &ParsedFile) {
    for e in &parsed.errors {
        assert_eq!(e.file.as_deref(), Some(file), "{e}");
        assert!(
            !e.kind.is_empty() && !e.object.is_empty() && !e.field.is_empty(),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(&file.display().to_string()),
            "{e}"
        );
    }
}

/// How deeply a value nests (a scalar is 0).
fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The objects of `parsed` as the items of one List, in JSON, and as YAML documents (JSON is
/// YAML); None when they nest too deeply to be written inside a List (two levels more) within the
/// YAML parser's depth limit.
fn as_list_and_documents(parsed: &ParsedFile) -> Option<(String, String)> {
    let items: Vec<serde_json::Value> = parsed
        .services
        .iter()
        .map(|s| serde_json::to_value(s).expect("a Service serializes"))
        .chain(
            parsed
                .slices
                .iter()
                .map(|s| serde_json::to_value(s).expect("an EndpointSlice serializes")),
        )
        .collect();
    if items.iter().map(depth).max().unwrap_or(0) + 2 > proxy::source::file::MAX_DEPTH {
        return None;
    }
    let documents = items.iter().map(|i| format!("---\n{i}\n")).collect();
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
    });
    Some((list.to_string(), documents))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for name in ["/fuzz/input.yaml", "/fuzz/input.json"] {
        let file = Path::new(name);
        let parsed = parse_manifests(file, text);
        check_errors(file, &parsed);
        let again = parse_manifests(file, text);
        assert_eq!(again.services, parsed.services);
        assert_eq!(again.slices, parsed.slices);
        assert_eq!(again.errors, parsed.errors);

        if parsed.services.is_empty() && parsed.slices.is_empty() {
            continue;
        }
        let Some((list, documents)) = as_list_and_documents(&parsed) else {
            continue;
        };
        for (file, text) in [
            (Path::new("/fuzz/list.json"), list),
            (Path::new("/fuzz/documents.yaml"), documents),
        ] {
            let back = parse_manifests(file, &text);
            check_errors(file, &back);
            assert_eq!(back.services, parsed.services, "{}", file.display());
            assert_eq!(back.slices, parsed.slices, "{}", file.display());
        }
    }
});

//! The trust boundary is in the dependency graph, not in comments: workers run beside the
//! private rows, so nothing they link may draw privacy noise or write a ledger. Those live
//! in `rhosynth-privacy` (its noise source is private to `release`, see its compile-fail
//! doc test), which only the coordinator depends on.

use std::collections::{HashMap, HashSet};
use std::process::Command;

mod common;

/// Workspace members `from` reaches through normal and build dependencies. Only members
/// can depend on a member, so the walk need not leave the workspace.
fn reachable(from: &str) -> HashSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked", "--offline"])
        .current_dir(common::repo())
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let deps: HashMap<&str, Vec<&str>> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let normal = p["dependencies"].as_array().unwrap().iter().filter(|d| d["kind"] != "dev");
            (p["name"].as_str().unwrap(), normal.map(|d| d["name"].as_str().unwrap()).collect())
        })
        .collect();
    assert!(deps.contains_key(from), "{from} is a workspace member");
    let (mut seen, mut stack) = (HashSet::new(), vec![from]);
    while let Some(name) = stack.pop() {
        if seen.insert(name.to_string()) {
            stack.extend(deps.get(name).into_iter().flatten().copied());
        }
    }
    seen
}

#[test]
fn workers_cannot_reach_the_release_module_or_the_ledger() {
    let worker = reachable("rhosynth-worker");
    assert!(worker.contains("rhosynth-shared"), "the worker's task computations");
    assert!(!worker.contains("rhosynth-privacy"), "the worker links the release module or the ledger");
    assert!(reachable("rhosynth-coordinator").contains("rhosynth-privacy"));
}

//! The MSRV in the workspace's `Cargo.toml` is at least what every dependency of the published crates declares: a dependency update that
//! raises the bar fails here instead of surprising users on an older toolchain. (Only one toolchain exists on the
//! build machine, so the MSRV cannot be built with directly; this checks the declared floor of the whole graph.)

use std::process::Command;

/// `1.88` and `1.88.0` are the same version: three parts, missing ones zero.
fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|part| part.parse().unwrap_or(0))
        .collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn the_declared_msrv_covers_every_dependency() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    // What users build: the published crates and their normal and build dependencies, with every feature (the
    // metadata is resolved with all of them). Dev-dependencies (the test harness's) do not reach users.
    let nodes: std::collections::HashMap<&str, &serde_json::Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| (node["id"].as_str().unwrap(), node))
        .collect();
    let packages: std::collections::HashMap<&str, &serde_json::Value> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| (package["id"].as_str().unwrap(), package))
        .collect();
    let mut reached = std::collections::HashSet::new();
    let mut todo: Vec<&str> = members
        .iter()
        .copied()
        .filter(|id| packages[id]["publish"] != serde_json::json!([]))
        .collect();
    assert!(todo.len() >= 2, "the published crates: {todo:?}");
    while let Some(id) = todo.pop() {
        if !reached.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let used = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|kind| kind["kind"].as_str() != Some("dev"));
            if used {
                todo.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    let mut ours = None;
    let mut highest = (vec![0], String::new());
    for id in reached {
        let package = packages[id];
        let Some(rust_version) = package["rust_version"].as_str() else {
            continue;
        };
        if members.contains(&id) {
            ours = Some(version(rust_version));
        } else if version(rust_version) > highest.0 {
            highest = (
                version(rust_version),
                format!("{} {}", package["name"], package["version"]),
            );
        }
    }
    let ours = ours.expect("the workspace declares a rust-version");
    assert!(
        ours >= highest.0,
        "the workspace declares rust-version {ours:?}, but {} needs {:?}",
        highest.1,
        highest.0
    );
}

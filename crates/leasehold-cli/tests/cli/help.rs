//! The help texts, for a user of any store: where a text says what only Redis does, it names every other store.

use crate::{finish, leasehold, SOON};

/// What names each store other than Redis in a help text (a scheme or the store's name).
const OTHER_STORES: &[(&str, &[&str])] = &[
    ("etcd", &["etcd"]),
    ("ZooKeeper", &["zookeeper", "zk://"]),
    ("PostgreSQL", &["postgres"]),
    ("MySQL/MariaDB", &["mysql", "mariadb"]),
];

/// The long help of the command and of every subcommand a user runs.
fn every_help() -> Vec<(String, String)> {
    let commands = [
        "",
        "run",
        "status",
        "list",
        "release",
        "permits",
        "demo",
        "bench",
        "completions",
        "man",
    ];
    commands
        .iter()
        .map(|command| {
            let args: Vec<&str> = command.split_whitespace().chain(["--help"]).collect();
            let (code, stdout, stderr) = finish(leasehold(&args), SOON);
            assert_eq!(code, Some(0), "leasehold {command} --help: {stderr}");
            (format!("leasehold {command} --help"), stdout)
        })
        .collect()
}

/// A paragraph that says something is Redis's alone, or that a store is refused, names every other store: a note
/// that names only etcd and ZooKeeper reads, to a PostgreSQL user, as if their store were accepted (issue 34, item 9).
#[test]
fn a_redis_only_note_in_the_help_names_every_other_store() {
    let mut incomplete = Vec::new();
    for (help, text) in every_help() {
        for paragraph in text.split("\n\n") {
            let lower = paragraph.to_lowercase();
            let flat = lower.split_whitespace().collect::<Vec<_>>().join(" ");
            let is_note = flat.contains("redis only")
                || flat.contains("redis-only")
                || flat.contains("store among them")
                || flat.contains("store exits 2");
            if !is_note {
                continue;
            }
            let missing: Vec<&str> = OTHER_STORES
                .iter()
                .filter(|(_, names)| !names.iter().any(|name| flat.contains(name)))
                .map(|(store, _)| *store)
                .collect();
            if !missing.is_empty() {
                incomplete.push(format!("{help}: {missing:?} missing from: {flat}"));
            }
        }
    }
    assert!(incomplete.is_empty(), "{}", incomplete.join("\n\n"));
}

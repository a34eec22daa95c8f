//! The README's table of the stores side by side, rendered from the code: one row per fact a user chooses a store by
//! (its cargo feature and URLs from the scheme list, its default lease and bounds from the constants the stores use)
//! and one row per [`Capability`] from [`StoreKind::support`], one column per store. The unit test
//! `readme_stores_table_is_the_rendered_one` compares it with the README's block between `<!-- stores-table:begin -->`
//! and `<!-- stores-table:end -->`; `LEASEHOLD_BLESS=1` rewrites that block.
//!
//! Test-only, and only with every store's feature (`--all-features`, as the test suite builds): each store's
//! constants live behind its feature.
#![cfg(all(
    test,
    feature = "etcd",
    feature = "zookeeper",
    feature = "postgres",
    feature = "mysql"
))]

use std::time::Duration;

use crate::backend::scheme::SCHEMES;
use crate::capability::{Capability, StoreKind, Support};

/// The store a URL scheme names.
fn store_of(scheme: &str) -> StoreKind {
    match scheme {
        "etcd" | "etcds" => StoreKind::Etcd,
        "zk" => StoreKind::ZooKeeper,
        "postgres" | "postgresql" => StoreKind::Postgres,
        "mysql" | "mariadb" => StoreKind::MySql,
        _ => StoreKind::Redis,
    }
}

/// `d` as the README writes it: `30 s`, `10 ms`, `30 days`.
fn show(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        format!("{} ms", d.as_millis())
    } else if secs.is_multiple_of(86_400) {
        format!("{} days", secs / 86_400)
    } else {
        format!("{secs} s")
    }
}

/// The cargo feature a store needs (that of its first, plain scheme), and its URL forms, each with the further
/// features it needs.
fn feature_and_urls(store: StoreKind) -> (String, String) {
    let schemes: Vec<_> = SCHEMES
        .iter()
        .filter(|(scheme, _)| store_of(scheme) == store)
        .collect();
    let base: &[&str] = schemes.first().map_or(&[], |(_, features)| features);
    let feature = match base {
        [] => "`leasehold = \"…\"` (no feature)".to_owned(),
        features => format!(
            "`leasehold = {{ version = \"…\", features = [{}] }}`",
            features
                .iter()
                .map(|f| format!("\"{f}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let urls = schemes
        .iter()
        .map(|(scheme, features)| {
            let extra: Vec<_> = features.iter().filter(|f| !base.contains(f)).collect();
            match extra.as_slice() {
                [] => format!("`{scheme}://`"),
                extra => format!(
                    "`{scheme}://` (+{})",
                    extra
                        .iter()
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    (feature, urls)
}

/// The default lease of a grant on `store`, and what it belongs to.
fn default_lease(store: StoreKind) -> String {
    match store {
        StoreKind::Redis => format!(
            "{} per lock handle (`Mutex::ttl`)",
            show(crate::engine::ttl::DEFAULT_TTL)
        ),
        StoreKind::Etcd => format!(
            "{} per lock handle (`Mutex::ttl`; the client's default: `Builder::session_ttl`)",
            show(crate::backend::etcd::DEFAULT_TTL)
        ),
        StoreKind::ZooKeeper => format!(
            "{} asked per lock handle (`Mutex::ttl`; the client's default: `Builder::session_ttl`), as the ensemble negotiates it",
            show(crate::backend::zookeeper::session::DEFAULT_TIMEOUT)
        ),
        StoreKind::Postgres | StoreKind::MySql => format!(
            "{} per lock handle (`Mutex::ttl`; the client's default: `Builder::session_ttl`)",
            show(crate::backend::sql::session::DEFAULT_TTL)
        ),
    }
}

/// The leases `store` takes.
fn lease_bounds(store: StoreKind) -> String {
    match store {
        StoreKind::Redis => format!(
            "{} – {}, or fixed",
            show(crate::MIN_TTL),
            show(crate::MAX_TTL)
        ),
        StoreKind::Etcd => format!(
            "whole seconds (rounded up), ≥ {}; one session per distinct TTL",
            show(crate::backend::etcd::MIN_TTL)
        ),
        StoreKind::ZooKeeper => format!(
            "≥ {} asked (by default the ensemble clamps to 2–20 ticks); one session per distinct TTL",
            show(crate::backend::zookeeper::session::MIN_TIMEOUT)
        ),
        StoreKind::Postgres | StoreKind::MySql => {
            format!(
                "≥ {}; one session per distinct TTL",
                show(crate::backend::sql::session::MIN_TTL)
            )
        }
    }
}

/// The most permits a semaphore has on `store`.
fn most_permits(store: StoreKind) -> String {
    match store {
        StoreKind::Redis => format!("2^{}", crate::MAX_PERMITS.trailing_zeros()),
        _ => format!("{} (2^32 − 1)", u32::MAX),
    }
}

/// One fact per store, in [`StoreKind::ALL`]'s order.
type Row = (&'static str, [String; 5]);

/// The same text in every column but Redis's.
fn redis_and_sessions(redis: &str, sessions: &str) -> [String; 5] {
    StoreKind::ALL.map(|store| match store {
        StoreKind::Redis => redis.to_owned(),
        _ => sessions.to_owned(),
    })
}

/// The facts a user chooses a store by, one row each.
fn facts() -> Vec<Row> {
    let per = |f: fn(StoreKind) -> String| StoreKind::ALL.map(f);
    let words = |cells: [&str; 5]| cells.map(str::to_owned);
    vec![
        ("`Cargo.toml`", per(|s| feature_and_urls(s).0)),
        ("URL", per(|s| feature_and_urls(s).1)),
        ("default lease", per(default_lease)),
        ("lease bounds", per(lease_bounds)),
        (
            "a crashed holder's locks are free after",
            words([
                "its lease",
                "its lease (its session's TTL)",
                "its lease (its session's negotiated timeout)",
                "its lease (its session's TTL)",
                "its lease (its session's TTL)",
            ]),
        ),
        (
            "exclusion holds through",
            words([
                "no data loss, no clock step (a failover can lose a grant; `replicas(n)` narrows it; `Quorum` over independent primaries: a majority keeping its data)",
                "a majority of members alive (Raft)",
                "a majority of servers alive (ZAB)",
                "the database keeping its commits (one primary, or synchronous replication)",
                "the database keeping its commits (one primary, or semi-synchronous `AFTER_SYNC` replication)",
            ]),
        ),
        (
            "loss signal by",
            words([
                "last confirmed renewal's send time + lease − drift",
                "last acknowledged keep-alive's send time + session TTL − drift",
                "last answered `sync`'s send time + 5/8 of the session timeout − drift",
                "last answered renewal's send time + session TTL − drift",
                "last answered renewal's send time + session TTL − drift",
            ]),
        ),
        (
            "fence",
            words([
                "per-lock counter, floored at the server's µs clock",
                "the key's creation revision (cluster-wide)",
                "the node's `czxid` (ensemble-wide)",
                "the global sequence `PREFIX_fence`, durable",
                "the lock's row counter in `PREFIX_lock`, durable",
            ]),
        ),
        (
            "waiting",
            words([
                "FIFO; the release hands the lock to the oldest live waiter in its own step (pub/sub)",
                "FIFO for every kind; a watch on the key ahead",
                "FIFO for every kind; a watch on the node the rule names",
                "FIFO for every kind; `NOTIFY` on release plus the entry's expiry",
                "FIFO for every kind; a bell (`GET_LOCK`) on the entry ahead, rung by its release",
            ]),
        ),
        (
            "renewal cost",
            words([
                "500 leases per script call",
                "one keep-alive per session + one read per 100 grants",
                "one `sync` per session every eighth of its timeout + one read per 100 grants",
                "one `UPDATE` per session every quarter of its TTL",
                "one `UPDATE` per session every quarter of its TTL",
            ]),
        ),
        (
            "one kind per name (`Error::WrongKind`)",
            redis_and_sessions("yes", "no: kinds on one name exclude each other by their rules"),
        ),
        ("most permits of a semaphore", per(most_permits)),
        (
            "TLS",
            words([
                "`rediss://` (+`tls`)",
                "`etcds://` (+`tls`)",
                "no",
                "`sslmode=require` (+`tls`)",
                "no",
            ]),
        ),
        (
            "a quorum of independent servers (`Quorum`, Redlock)",
            redis_and_sessions("yes", "no"),
        ),
        (
            "other clients that exclude it",
            words([
                "",
                "`etcdctl lock`, Go's `concurrency.Mutex`, against every kind",
                "kazoo's `Lock`, `ReadLock`, `WriteLock` against every kind; kazoo's `Semaphore` and Curator one way (see the ZooKeeper section)",
                "",
                "",
            ]),
        ),
    ]
}

/// A capability's cell for one store.
fn cell(store: StoreKind, capability: Capability) -> String {
    match store.support(capability) {
        Support::Yes => "yes".to_owned(),
        Support::No(_) => "no (`Error::Unsupported`)".to_owned(),
        Support::Server(condition) => condition.to_owned(),
    }
}

/// The table, in Markdown: the facts, then each capability (`Client::supports`).
pub(crate) fn render() -> String {
    let mut rows = facts();
    let capabilities = Capability::ALL
        .iter()
        .map(|capability| {
            (
                capability.describe(),
                StoreKind::ALL.map(|store| cell(store, *capability)),
            )
        })
        .collect::<Vec<Row>>();
    rows.extend(capabilities);
    let mut out = String::from("| |");
    for store in StoreKind::ALL {
        out.push_str(&format!(" {} |", store.label()));
    }
    out.push_str("\n|---|---|---|---|---|---|\n");
    for (label, cells) in rows {
        out.push_str(&format!("| {label} |"));
        for text in cells {
            if text.is_empty() {
                out.push_str(" |");
            } else {
                out.push_str(&format!(" {text} |"));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- stores-table:begin -->\n";
    const END: &str = "<!-- stores-table:end -->";

    #[test]
    fn readme_stores_table_is_the_rendered_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let start = readme
            .find(BEGIN)
            .unwrap_or_else(|| panic!("README.md has no {BEGIN:?} marker"))
            + BEGIN.len();
        let end = start
            + readme[start..].find(END).unwrap_or_else(|| {
                panic!("README.md has no {END:?} marker after the begin marker")
            });
        let table = render();
        if readme[start..end] == table {
            return;
        }
        if std::env::var_os("LEASEHOLD_BLESS").is_some_and(|v| v == "1") {
            let blessed = format!("{}{table}{}", &readme[..start], &readme[end..]);
            std::fs::write(path, blessed).unwrap();
            return;
        }
        panic!(
            "README.md's stores table (between {BEGIN:?} and {END:?}) is not the one the code renders; rewrite it \
             with `LEASEHOLD_BLESS=1 cargo test -p leasehold --all-features --lib readme_stores_table`.\n\
             rendered:\n{table}\nREADME:\n{}",
            &readme[start..end]
        );
    }

    #[test]
    fn the_table_has_a_cell_for_every_store_and_says_each_feature_and_default() {
        let table = render();
        for line in table.lines() {
            assert_eq!(line.matches('|').count(), 7, "{line}");
        }
        for text in [
            "| `Cargo.toml` | `leasehold = \"…\"` (no feature) | `leasehold = { version = \"…\", features = [\"etcd\"] }` |",
            "features = [\"zookeeper\"] }` | `leasehold = { version = \"…\", features = [\"postgres\"] }` | `leasehold = { version = \"…\", features = [\"mysql\"] }` |",
            "`rediss://` (+`tls`)",
            "| default lease | 30 s per lock handle",
            "| lease bounds | 10 ms – 30 days, or fixed |",
        ] {
            assert!(table.contains(text), "{text}\n{table}");
        }
        assert_eq!(show(Duration::from_secs(2)), "2 s");
    }
}

//! Bad input: every case maps to its typed error, never a panic.

use std::time::Duration;

use leasehold::{Error, InvalidArgument, MAX_NAME_LEN, MAX_TTL};
use leasehold_tests::RedisServer;

use crate::{connect, redis_conn};

/// One row of the table: what is wrong, the handle carrying it, and the detail expected.
type Case = (&'static str, leasehold::Mutex, fn(&InvalidArgument) -> bool);

#[tokio::test]
async fn bad_lock_arguments_map_to_invalid_argument() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let long = "n".repeat(MAX_NAME_LEN + 1);
    let secs = Duration::from_secs;
    let cases: Vec<Case> = vec![
        ("empty name", locks.mutex(""), |e| {
            *e == InvalidArgument::EmptyName
        }),
        (
            "name too long",
            locks.mutex(&long),
            |e| matches!(e, InvalidArgument::NameTooLong { len, max } if *len == MAX_NAME_LEN + 1 && *max == MAX_NAME_LEN),
        ),
        ("zero ttl", locks.mutex("a").ttl(Duration::ZERO), |e| {
            matches!(e, InvalidArgument::BadTtl { .. })
        }),
        (
            "ttl below minimum",
            locks.mutex("a").ttl(Duration::from_millis(5)),
            |e| matches!(e, InvalidArgument::BadTtl { .. }),
        ),
        ("absurd ttl", locks.mutex("a").ttl(MAX_TTL + secs(1)), |e| {
            matches!(e, InvalidArgument::BadTtl { .. })
        }),
        (
            "zero renewal",
            locks.mutex("a").renew_every(Duration::ZERO),
            |e| matches!(e, InvalidArgument::BadRenewal { .. }),
        ),
        (
            "renewal not below the lease",
            locks.mutex("a").ttl(secs(3)).renew_every(secs(3)),
            |e| matches!(e, InvalidArgument::BadRenewal { .. }),
        ),
    ];
    for (what, mutex, expected) in cases {
        for result in [
            mutex.try_lock().await.map(drop),
            mutex.lock().await.map(drop),
            mutex.lock_timeout(secs(1)).await.map(drop),
        ] {
            match result {
                Err(Error::InvalidArgument(e)) => {
                    assert!(expected(&e), "{what}: wrong detail {e:?}")
                }
                other => panic!("{what}: expected InvalidArgument, got {other:?}"),
            }
        }
    }
    for bad in ["", &long] {
        assert!(locks.inspect(bad).await.unwrap_err().is_invalid_argument());
        assert!(locks
            .force_release(bad)
            .await
            .unwrap_err()
            .is_invalid_argument());
    }
}

#[tokio::test]
async fn bad_client_settings_map_to_invalid_argument() {
    let server = RedisServer::start();
    let url = server.url();
    let builder = || leasehold::Client::builder(&url).unwrap();
    let cases: Vec<(&str, leasehold::Builder)> = vec![
        ("empty prefix", builder().prefix("")),
        ("prefix with a brace", builder().prefix("app{x}")),
        ("prefix too long", builder().prefix("p".repeat(65))),
        (
            "zero response timeout",
            builder().response_timeout(Duration::ZERO),
        ),
        (
            "zero connection timeout",
            builder().connection_timeout(Duration::ZERO),
        ),
        (
            "absurd response timeout",
            builder().response_timeout(Duration::from_secs(86_400)),
        ),
        (
            "tiny fence retention",
            builder().fence_retention(Duration::from_millis(10)),
        ),
    ];
    for (what, builder) in cases {
        match builder.connect().await {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
    }
    for url in ["", "not a url", "redis://:99999999"] {
        match leasehold::Client::connect(url).await {
            Err(Error::InvalidArgument(InvalidArgument::BadUrl(_))) => {}
            other => panic!("{url:?}: expected BadUrl, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn keys_that_leasehold_did_not_write_are_reported_and_left_alone() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mut conn = redis_conn(&server).await;
    let setup: [(&str, &[&str]); 3] = [
        ("hash", &["HSET", "leasehold:{hash}", "field", "1"]),
        (
            "foreign",
            &["SET", "leasehold:{foreign}", "someone else's value"],
        ),
        (
            "badfence",
            &["SET", "leasehold:{badfence}:fence", "not-a-number"],
        ),
    ];
    for (_, args) in setup {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
    }
    // What each error says the key holds: its type, and the start of a string.
    let expected = [
        ("hash", "leasehold:{hash}", "it holds a Redis hash"),
        (
            "foreign",
            "leasehold:{foreign}",
            "it holds the string \"someone else's value\"",
        ),
        (
            "badfence",
            "leasehold:{badfence}:fence",
            "the fence counter is not a number",
        ),
    ];
    let says = |err: Error, key: &str, what: &str| match err {
        Error::NotALock { key: bad, detail } => {
            assert_eq!(bad, key);
            assert!(detail.starts_with(what), "{key}: {detail}");
        }
        other => panic!("{key}: expected NotALock, got {other:?}"),
    };
    for (name, key, what) in expected {
        says(locks.mutex(name).try_lock().await.unwrap_err(), key, what);
        let err = locks
            .mutex(name)
            .lock_timeout(Duration::from_millis(100))
            .await
            .unwrap_err();
        says(err, key, what);
    }
    let (_, key, what) = expected[1];
    says(locks.force_release("foreign").await.unwrap_err(), key, what);
    says(locks.inspect("foreign").await.unwrap_err(), key, what);
    let (_, key, what) = expected[0];
    says(locks.force_release("hash").await.unwrap_err(), key, what);
    says(locks.inspect("hash").await.unwrap_err(), key, what);
    // Nothing was changed.
    let value: String = redis::cmd("GET")
        .arg("leasehold:{foreign}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, "someone else's value");
    let kind: String = redis::cmd("TYPE")
        .arg("leasehold:{hash}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
}

#[test]
fn every_accepted_name_keeps_all_keys_of_its_lock_in_one_cluster_slot() {
    let dir = leasehold_tests::TempDir::new("cluster");
    let nodes = dir.path().join("nodes.conf");
    let server = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        nodes.to_str().unwrap(),
    ]);
    let mut conn = server.connection();
    let names = [
        "}x",
        "}",
        "}}",
        "}{x}",
        "a}b",
        "{x}",
        "x{",
        "{}",
        "{",
        "a{b}c",
        "orders:42",
        "ключ",
        "🔒}",
        "}🔒",
    ];
    let mut accepted = 0;
    for name in names {
        match leasehold::lock_keys(leasehold::DEFAULT_PREFIX, name) {
            Ok(keys) => {
                accepted += 1;
                let slots: Vec<i64> = keys
                    .iter()
                    .map(|key| {
                        redis::cmd("CLUSTER")
                            .arg("KEYSLOT")
                            .arg(key)
                            .query(&mut conn)
                            .unwrap()
                    })
                    .collect();
                assert!(
                    slots.iter().all(|&s| s == slots[0]),
                    "{name:?}: keys {keys:?} hash to slots {slots:?}"
                );
                // The slot leasehold computes (to keep each coalesced call within one slot) is the server's.
                assert_eq!(
                    leasehold::__private::slot_of(leasehold::DEFAULT_PREFIX, name).map(i64::from),
                    Some(slots[0]),
                    "{name:?}"
                );
            }
            Err(InvalidArgument::BadName { .. }) => {
                assert!(name.starts_with('}'), "{name:?} was refused");
            }
            Err(other) => panic!("{name:?}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        accepted,
        names.iter().filter(|n| !n.starts_with('}')).count()
    );
}

#[test]
fn a_url_that_does_not_parse_says_why_and_lists_the_accepted_forms() {
    let cases = [
        ("not a url", "no scheme"),
        ("redis://", "names no server"),
        ("redis://app:hunter2@host:port", "numeric port"),
        ("redis://127.0.0.1:6379/x", "Invalid database number"),
    ];
    for (url, why) in cases {
        let message = match leasehold::Client::builder(url) {
            Err(Error::InvalidArgument(InvalidArgument::BadUrl(message))) => message,
            other => panic!("{url:?}: expected BadUrl, got {other:?}"),
        };
        assert!(message.contains(why), "{url:?}: {message}");
        assert_lists_forms(url, &message, &REDIS_FORMS);
    }
}

/// Redis's URL forms, as URL errors list them.
const REDIS_FORMS: [&str; 5] = [
    "redis://",
    "rediss://",
    "unix://",
    "redis+cluster://",
    "redis+sentinel://",
];

/// Asserts that `message`, the error for `url`, lists each of `forms` and hides the password `hunter2`.
fn assert_lists_forms(url: &str, message: &str, forms: &[&str]) {
    for form in forms {
        assert!(
            message.contains(form),
            "{url:?} does not list {form}: {message}"
        );
    }
    assert!(!message.contains("hunter2"), "{message}");
}

#[test]
fn a_wrong_scheme_lists_every_store_s_schemes_and_names_the_nearest() {
    let cases = [
        (
            "postgress://app:hunter2@db/locks",
            "postgress",
            Some("postgres"),
        ),
        ("http://127.0.0.1:2379", "http", Some("etcd")),
        ("https://10.0.0.1:2379", "https", Some("etcds")),
        ("mysq://app@db/locks", "mysq", Some("mysql")),
        ("ftp://host", "ftp", None),
    ];
    for (url, scheme, nearest) in cases {
        let err = match leasehold::Client::builder(url) {
            Err(Error::InvalidArgument(err @ InvalidArgument::UnknownScheme { .. })) => err,
            other => panic!("{url:?}: expected UnknownScheme, got {other:?}"),
        };
        let InvalidArgument::UnknownScheme {
            scheme: said,
            nearest: suggested,
            ..
        } = &err
        else {
            unreachable!()
        };
        assert_eq!((said.as_str(), *suggested), (scheme, nearest), "{url}");
        let message = err.to_string();
        // This test binary is built with every store's feature.
        assert_lists_forms(url, &message, &REDIS_FORMS);
        let others = [
            "etcd://",
            "etcds://",
            "zk://",
            "postgres://",
            "postgresql://",
            "mysql://",
            "mariadb://",
        ];
        assert_lists_forms(url, &message, &others);
        assert!(!message.contains("feature"), "{message}");
        if let Some(nearest) = nearest {
            assert!(
                message.contains(&format!("did you mean {nearest}://?")),
                "{message}"
            );
        }
    }
}

#[test]
fn durations_in_argument_errors_read_as_people_write_them() {
    let err = InvalidArgument::BadTtl {
        ttl: Duration::from_micros(252_417),
        min: Duration::from_millis(500),
        max: Duration::from_secs(30 * 86_400),
    };
    assert_eq!(err.to_string(), "lease 252ms is outside 500ms..=30d");
    let err = Error::Timeout {
        name: "jobs".to_owned(),
        waited: Duration::from_millis(1500),
    };
    assert_eq!(
        err.to_string(),
        "gave up waiting for lock \"jobs\" after 1.5s"
    );
}

//! Elections in the command: `run --value` campaigns, `observe` prints every leader. The observer's test runs on
//! every store (`stores.rs` calls [`an_observer_prints_each_leader_in_fence_order`]); Redis's, with a restart of the
//! server between two leaders, is here.

use std::process::Stdio;
use std::time::{Duration, Instant};

use leasehold_tests::RedisServer;
use serde_json::Value;

use crate::{finish, leasehold, Running, SOON};

/// How soon after a leader starts its program the observer must print it.
const WITHIN: Duration = Duration::from_secs(1);

/// `leasehold observe --json --every 50ms NAME` at `url`.
fn observer(url: &str, name: &str) -> Running {
    Running::start(leasehold(&[
        "observe", "--json", "--every", "50ms", "--store", url, name,
    ]))
}

/// `leasehold run --value VALUE NAME` at `url` with a program that prints `held FENCE` and waits for stdin to close.
fn campaign(url: &str, name: &str, value: &str, ttl: &str) -> Running {
    let mut command = leasehold(&[
        "run",
        "--store",
        url,
        "--ttl",
        ttl,
        "--value",
        value,
        name,
        "--",
        "sh",
        "-c",
        "echo held $LEASEHOLD_FENCE $LEASEHOLD_TERM; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    Running::start(command)
}

/// The fence a campaign's program printed once it led (with its term's number, which must be one), and when the
/// test read it.
fn led(run: &Running, within: Duration) -> (u64, Instant) {
    let line = run.line(within);
    let (fence, term) = line
        .strip_prefix("held ")
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(f, t)| Some((f.parse().ok()?, t.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(term > 0, "{line}");
    (fence, Instant::now())
}

/// The observer's next line that names a leader (lines saying nobody leads are skipped), within `within`.
fn next_leader(observer: &Running, within: Duration) -> (u64, String) {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = observer.line(left);
        let object: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if object["leader"] == Value::Bool(true) {
            // Every leader here is a campaign, said once its term was counted.
            assert!(object["term"].as_u64().is_some_and(|t| t > 0), "{line}");
            return (
                object["fence"].as_u64().unwrap(),
                object["value"].as_str().unwrap_or_default().to_owned(),
            );
        }
    }
}

/// An observer started first prints three successive leaders, each within [`WITHIN`] of its program's start, in
/// fence order. Between the second and the third, `disrupt` runs with the second leader (a store restart, the
/// leader's process killed), which must not stop the observer.
pub fn an_observer_prints_each_leader_in_fence_order(
    url: &str,
    ttl: &str,
    disrupt: impl FnOnce(Running),
) {
    let observer = observer(url, "primary");
    let first: Value = serde_json::from_str(&observer.line(SOON)).unwrap();
    assert_eq!(first["leader"], Value::Bool(false), "{first}");

    let mut one = campaign(url, "primary", "v1", ttl);
    let (f1, at) = led(&one, SOON);
    assert_eq!(next_leader(&observer, SOON), (f1, "v1".to_owned()));
    assert!(at.elapsed() < WITHIN, "{:?}", at.elapsed());

    let two = campaign(url, "primary", "v2", ttl);
    // Queued behind the first (it has not led yet), then led when the first ends.
    one.close_stdin();
    assert_eq!(one.code(SOON), Some(0), "{}", one.stderr());
    let (f2, at) = led(&two, SOON);
    assert_eq!(next_leader(&observer, SOON), (f2, "v2".to_owned()));
    assert!(at.elapsed() < WITHIN, "{:?}", at.elapsed());

    disrupt(two);
    let mut three = campaign(url, "primary", "v3", ttl);
    let (f3, at) = led(&three, Duration::from_secs(30));
    assert_eq!(next_leader(&observer, SOON), (f3, "v3".to_owned()));
    assert!(at.elapsed() < WITHIN, "{:?}", at.elapsed());
    assert!(f1 < f2 && f2 < f3, "{f1} {f2} {f3}");
    three.close_stdin();
    assert_eq!(three.code(SOON), Some(0), "{}", three.stderr());
}

#[test]
fn an_observer_prints_each_leader_across_a_redis_restart() {
    let mut server = RedisServer::start();
    let url = server.url();
    an_observer_prints_each_leader_in_fence_order(&url, "2s", |mut two| {
        // The server comes back empty: the second leader's lock is gone, its program stopped (76).
        server.restart();
        assert_eq!(
            two.code(Duration::from_secs(10)),
            Some(76),
            "{}",
            two.stderr()
        );
    });
}

#[test]
fn status_shows_the_value_a_run_publishes_and_bad_values_are_usage_errors() {
    let server = RedisServer::start();
    let url = server.url();
    let mut run = campaign(&url, "web", "10.0.0.1:8080", "10s");
    led(&run, SOON);
    let (code, stdout, stderr) = finish(
        leasehold(&["status", "--json", "--store", &url, "web"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["value"], "10.0.0.1:8080", "{status}");
    assert_eq!(status["term"], 1, "{status}");
    let (code, stdout, _) = finish(leasehold(&["status", "--store", &url, "web"]), SOON);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("value \"10.0.0.1:8080\", term 1"),
        "{stdout}"
    );
    let (code, stdout, _) = finish(leasehold(&["list", "--store", &url]), SOON);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("(value 10.0.0.1:8080)"), "{stdout}");
    run.close_stdin();
    assert_eq!(run.code(SOON), Some(0));

    for args in [
        &["run", "--store", &url, "--value", "", "web", "--", "true"][..],
        &[
            "run", "--store", &url, "--value", "a\tb", "web", "--", "true",
        ],
        &[
            "run", "--store", &url, "--value", "v", "--fair", "web", "--", "true",
        ],
    ] {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
    }
}

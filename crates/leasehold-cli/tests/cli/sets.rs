//! `leasehold run --also`: a program under several locks at once. The loop of opposite sets runs on every store
//! (`stores.rs` calls [`opposite_sets_never_deadlock_or_overlap`]); the rest on Redis.

use std::time::{Duration, Instant};

use leasehold_tests::{RedisServer, TempDir};

use crate::{finish, leasehold, one_error_line, SOON};

/// How long the loop of opposite sets runs: `LEASEHOLD_TEST_SET_LOOP` seconds (60 for the minute), 3 by
/// default so that the suite stays short.
fn loop_length() -> Duration {
    let secs = std::env::var("LEASEHOLD_TEST_SET_LOOP")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(3);
    Duration::from_secs(secs)
}

/// Three loops of runs against the store at `url`, for [`loop_length`]: `--also b a`, `--also a b`, and a plain run of
/// `a`. Every program writes `in PID` and then `out PID` into the log of each lock it holds; a deadlock would end a
/// run with the conflict status after its 30 s wait, an overlap would put two `in`s in a row in a log.
pub fn opposite_sets_never_deadlock_or_overlap(url: &str) {
    let dir = TempDir::new("cli-sets");
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let until = Instant::now() + loop_length();
    let loops: Vec<_> = [&["--also", "b", "a"][..], &["--also", "a", "b"], &["a"]]
        .into_iter()
        .map(|names| {
            let url = url.to_owned();
            let logs: Vec<String> = if names.len() == 1 {
                vec![log("a").display().to_string()]
            } else {
                vec![
                    log("a").display().to_string(),
                    log("b").display().to_string(),
                ]
            };
            let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
            std::thread::spawn(move || {
                let script = {
                    let enter: Vec<String> =
                        logs.iter().map(|l| format!("echo in $$ >> {l}")).collect();
                    let leave: Vec<String> = logs
                        .iter()
                        .rev()
                        .map(|l| format!("echo out $$ >> {l}"))
                        .collect();
                    format!("{}; {}", enter.join("; "), leave.join("; "))
                };
                let mut runs = 0;
                while Instant::now() < until {
                    let mut args = vec!["run", "--store", &url, "--wait", "30s"];
                    args.extend(names.iter().map(String::as_str));
                    args.extend(["--", "sh", "-c", &script]);
                    let (code, _, stderr) = finish(leasehold(&args), Duration::from_secs(60));
                    assert_eq!(code, Some(0), "run {names:?}: {stderr}");
                    runs += 1;
                }
                runs
            })
        })
        .collect();
    let runs: Vec<usize> = loops.into_iter().map(|l| l.join().unwrap()).collect();
    eprintln!("runs per loop ({{b, a}}, {{a, b}}, a): {runs:?}");
    assert!(runs.iter().all(|&n| n > 0), "{runs:?}");
    for name in ["a", "b"] {
        let text = std::fs::read_to_string(log(name)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() % 2, 0, "{name}: {text}");
        for pair in lines.chunks(2) {
            let inside = pair[0].strip_prefix("in ");
            assert!(
                inside.is_some() && pair[1].strip_prefix("out ") == inside,
                "{name}: {pair:?} overlap, in {text}"
            );
        }
    }
}

#[test]
fn opposite_sets_on_redis() {
    let server = RedisServer::start();
    opposite_sets_never_deadlock_or_overlap(&server.url());
}

#[test]
fn a_set_run_exports_each_fence_and_keeps_nothing_when_a_member_is_busy() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "--store", &url, "--also", "second", "--also", "third", "first", "--", "sh", "-c",
            "echo $LEASEHOLD_NAME $LEASEHOLD_FENCE $LEASEHOLD_NAME_1 $LEASEHOLD_FENCE_1 $LEASEHOLD_NAME_2 $LEASEHOLD_FENCE_2",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let words: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(words.len(), 6, "{stdout}");
    assert_eq!([words[0], words[2], words[4]], ["first", "second", "third"]);
    for fence in [words[1], words[3], words[5]] {
        assert!(fence.parse::<u64>().is_ok_and(|f| f > 0), "{stdout}");
    }

    // "second" is held: the set does not run, says which lock, and keeps none of the others.
    let (mut holder, _) = crate::stores::holder(&url, &[], "second");
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "-n", "--store", &url, "--also", "second", "first", "--also", "third", "--",
            "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("lock \"second\" is held"),
        "{stderr}"
    );
    for free in ["first", "third"] {
        let (code, _, stderr) = finish(
            leasehold(&["run", "-n", "--store", &url, free, "--", "true"]),
            SOON,
        );
        assert_eq!(code, Some(0), "{free}: {stderr}");
    }
    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
}

#[test]
fn a_set_that_names_a_lock_twice_or_runs_on_a_quorum_is_a_usage_error() {
    // Nothing listens at these addresses: a command that tried to connect would exit 69.
    let nowhere = "redis://127.0.0.1:1";
    for args in [
        &["run", "--store", nowhere, "--also", "a", "a", "--", "true"][..],
        &[
            "run", "--store", nowhere, "--also", "b", "--also", "b", "a", "--", "true",
        ],
        &[
            "run",
            "--store",
            nowhere,
            "--store",
            "redis://127.0.0.1:2",
            "--store",
            "redis://127.0.0.1:3",
            "--also",
            "b",
            "a",
            "--",
            "true",
        ],
    ] {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        one_error_line(&stderr);
    }
}

#[test]
fn a_set_run_inside_a_run_of_one_of_its_names_is_refused() {
    let server = RedisServer::start();
    let url = server.url();
    let inner = format!("{} run --store {url} --also b a -- true", crate::LEASEHOLD);
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--store",
            &url,
            "a",
            "--",
            "sh",
            "-c",
            &format!("{inner}; echo inner $?"),
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "inner 65", "{stderr}");
    assert!(stderr.contains("cannot nest a run with --also"), "{stderr}");
}

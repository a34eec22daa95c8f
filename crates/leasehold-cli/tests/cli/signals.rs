//! Signals sent to `leasehold`: passed on to the program, or ending a wait without running anything.

use std::process::Stdio;
use std::time::Duration;

use leasehold_tests::{send_signal, RedisServer, TcpProxy, TempDir};
use nix::sys::signal::Signal;

use crate::{await_waiter, leasehold, lock_exists, Running, SOON};

#[test]
fn sigterm_reaches_the_program_and_the_lock_is_released_after_it_exits() {
    let server = RedisServer::start();
    let dir = TempDir::new("cli-signals");
    let marker = dir.path().join("marker");
    // The background sleep is started before "ready", so the forwarded SIGTERM always finds it (a sleep forked
    // after the signal would outlive the test holding its output open); its output goes nowhere anyway.
    let program = format!(
        r#"trap 'echo got-term > {}; exit 0' TERM; sleep 60 >/dev/null 2>&1 & echo ready; wait"#,
        marker.display()
    );
    let mut run = Running::start(leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "sig",
        "--",
        "sh",
        "-c",
        &program,
    ]));
    assert_eq!(run.line(SOON), "ready");
    assert!(lock_exists(&server, "sig"));

    send_signal(run.pid(), Signal::SIGTERM).unwrap();

    assert_eq!(
        run.code(SOON),
        Some(0),
        "the program's status, not a signal death"
    );
    assert_eq!(run.stderr(), "");
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "got-term");
    assert!(!lock_exists(&server, "sig"));
}

#[test]
fn sigint_and_sighup_end_the_program_and_leasehold_reports_128_plus_the_signal() {
    let server = RedisServer::start();
    for (signal, expected) in [(Signal::SIGINT, 130), (Signal::SIGHUP, 129)] {
        let mut run = Running::start(leasehold(&[
            "run",
            "--redis",
            &server.url(),
            "sig",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 60",
        ]));
        assert_eq!(run.line(SOON), "ready");
        send_signal(run.pid(), signal).unwrap();
        assert_eq!(run.code(SOON), Some(expected), "{signal}");
        assert!(!lock_exists(&server, "sig"));
    }
}

#[test]
fn a_signal_while_waiting_ends_the_wait_without_running_the_program() {
    let server = RedisServer::start();
    let url = server.url();
    let mut holder_command = leasehold(&[
        "run",
        "--redis",
        &url,
        "queue",
        "--",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    holder_command.stdin(Stdio::piped());
    let mut holder = Running::start(holder_command);
    assert_eq!(holder.line(SOON), "held");

    let mut waiter = Running::start(leasehold(&[
        "run", "--redis", &url, "queue", "--", "sh", "-c", "echo ran",
    ]));
    await_waiter(&server, "queue");
    send_signal(waiter.pid(), Signal::SIGTERM).unwrap();

    assert_eq!(waiter.code(SOON), Some(143));
    assert!(waiter
        .stderr()
        .contains("SIGTERM while waiting for lock \"queue\""));
    assert!(
        waiter.rest(SOON).is_empty(),
        "the program must not have run"
    );

    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
    assert!(!lock_exists(&server, "queue"));
}

#[test]
fn every_terminating_signal_is_passed_on_and_the_lock_outlives_the_program_only_until_it_exits() {
    let server = RedisServer::start();
    let url = server.url();
    // SIGUSR1, SIGUSR2 and SIGQUIT used to kill `leasehold` itself and leave the program running without a lease.
    for (signal, expected) in [
        (Signal::SIGUSR1, 128 + 10),
        (Signal::SIGUSR2, 128 + 12),
        (Signal::SIGQUIT, 128 + 3),
    ] {
        let mut run = Running::start(leasehold(&[
            "run",
            "--redis",
            &url,
            "usr",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 60",
        ]));
        assert_eq!(run.line(SOON), "ready");
        send_signal(run.pid(), signal).unwrap();
        // The program got it (and died of it): leasehold reports it, after releasing the lock.
        assert_eq!(run.code(SOON), Some(expected), "{signal}");
        assert!(
            !lock_exists(&server, "usr"),
            "{signal}: the lock outlived the program"
        );
    }
}

/// Whether `pid` has ended: gone, or a zombie nobody reaped yet (its parent, `leasehold`, was killed).
fn has_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses: "pid (comm) S ...".
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// A shell snippet that prints the pid of the enforcer (`leasehold enforce`, see `enforce.rs`) of the `leasehold` that
/// runs it: the other child of its parent.
const PRINT_ENFORCER: &str = "ps -o pid=,args= --ppid $PPID | awk '/ enforce /{print $1}'";

/// Waits until `pid` has ended (see [`has_ended`]); nothing announces it, so `/proc` is polled.
fn await_ended(pid: u32, what: &str) {
    let deadline = std::time::Instant::now() + SOON;
    while !has_ended(pid) {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(10)); // polling /proc: no event to await
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_program_does_not_outlive_a_killed_leasehold_nor_does_its_enforcer() {
    let server = RedisServer::start();
    let mut run = Running::start(leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "orphan",
        "--",
        "sh",
        "-c",
        &format!("echo $$; {PRINT_ENFORCER}; exec sleep 60"),
    ]));
    let program: u32 = run.line(SOON).parse().unwrap();
    let enforcer: u32 = run.line(SOON).parse().unwrap();
    assert!(!has_ended(program) && !has_ended(enforcer));
    // SIGKILL cannot be caught or passed on: only the kernel (and the enforcer) can end the program now.
    send_signal(run.pid(), Signal::SIGKILL).unwrap();
    await_ended(program, "the program outlived a SIGKILLed leasehold");
    await_ended(enforcer, "the enforcer outlived a SIGKILLed leasehold");
    let _ = run.code(SOON);
}

#[test]
fn the_enforcer_ends_with_the_run() {
    let server = RedisServer::start();
    let mut run = Running::start(leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "short",
        "--",
        "sh",
        "-c",
        PRINT_ENFORCER,
    ]));
    let enforcer: u32 = run.line(SOON).parse().unwrap();
    assert_eq!(run.code(SOON), Some(0), "{}", run.stderr());
    await_ended(enforcer, "the enforcer outlived its run");
}

// Multi-threaded: the proxy's tasks must keep running while the test body blocks on processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_the_acquire_is_in_flight_leaves_no_orphaned_grant() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    // Every byte takes 150 ms each way: the grant lands in Redis well before its reply reaches leasehold.
    proxy.delay(Duration::from_millis(150));
    let mut run = Running::start(leasehold(&[
        "run",
        "--redis",
        &proxy.url(),
        "--ttl",
        "60s",
        "in-flight",
        "sh",
        "-c",
        "echo ran",
    ]));
    // The grant is in Redis (seen directly, not through the proxy): its reply is on its way back.
    crate::poll_until("the grant lands in Redis", || {
        lock_exists(&server, "in-flight")
    });
    send_signal(run.pid(), Signal::SIGINT).unwrap();
    assert_eq!(run.code(SOON), Some(130));
    let stderr = run.stderr();
    assert!(
        crate::one_error_line(&stderr)
            .contains("SIGINT while waiting for lock \"in-flight\"; nothing was run"),
        "{stderr}"
    );
    assert!(run.rest(SOON).is_empty(), "the program must not have run");
    // Given back before leasehold exited, not left for the 60 s lease.
    assert!(
        !lock_exists(&server, "in-flight"),
        "the late grant was left behind"
    );
}

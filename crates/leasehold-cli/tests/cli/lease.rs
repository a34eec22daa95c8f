//! Lease loss: the program is stopped before anyone else can hold the lock, and `leasehold` exits 76.

use std::fs::OpenOptions;
use std::process::Stdio;
use std::time::Duration;

use crate::{await_group_gone, await_waiter, leasehold, Running, SOON};
use leasehold_tests::{send_signal, RedisServer, TcpProxy, TempDir};
use nix::sys::signal::Signal;

/// The program of a holder that logs its start (`first PID FENCE`) and its SIGTERM (`term PID`) to `log`.
fn logging_holder(log: &std::path::Path) -> String {
    format!(
        r#"trap 'echo "term $$" >> {log}; exit 143' TERM; echo "first $$ $LEASEHOLD_FENCE" >> {log}; echo started; sleep 60 & wait"#,
        log = log.display()
    )
}

// Multi-threaded: the proxy's tasks must keep running while the test body blocks on processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_stops_its_program_and_exits_76_before_the_next_holder_starts() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    let dir = TempDir::new("cli-lease");
    let log = dir.path().join("events");
    // One log, appended to by both programs and by the first leasehold's stderr, so its order is the order of events.
    let append = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap()
    };

    let mut first = leasehold(&[
        "run",
        "--redis",
        &proxy.url(),
        "--ttl",
        "3s",
        "cut",
        "--",
        "sh",
        "-c",
        &logging_holder(&log),
    ]);
    first.stderr(Stdio::from(append()));
    let mut first = Running::start_with(first, false);
    assert_eq!(first.line(SOON), "started");

    let second_program = format!(r#"echo "second $LEASEHOLD_FENCE" >> {}"#, log.display());
    let mut second = Running::start(leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "cut",
        "--",
        "sh",
        "-c",
        &second_program,
    ]));
    await_waiter(&server, "cut");

    proxy.blackhole();

    assert_eq!(first.code(Duration::from_secs(15)), Some(76));
    assert_eq!(
        second.code(Duration::from_secs(15)),
        Some(0),
        "{}",
        second.stderr()
    );

    let events = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = events.lines().collect();
    let position = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {events}"))
    };
    let (started, lost, term, next) = (
        position("first "),
        position("leasehold: lost lock \"cut\""),
        position("term "),
        position("second "),
    );
    assert!(
        started < lost && lost < next,
        "the loss must be reported before the next holder runs:\n{events}"
    );
    assert!(started < term, "{events}");
    assert!(lines[lost].contains("not renewed"), "{events}");

    let first_fields: Vec<&str> = lines[started].split_whitespace().collect();
    let pid: i32 = first_fields[1].parse().unwrap();
    let first_fence: u64 = first_fields[2].parse().unwrap();
    let second_fence: u64 = lines[next]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(second_fence > first_fence, "{events}");
    await_group_gone(pid);
}

/// `leasehold run` of `program` (through `sh -c`; it prints its pid first) under lock "stubborn" with a 300 ms grace,
/// and the lock then force-released: the run and the program's pid.
fn stubborn_run_force_released(server: &RedisServer, program: &str) -> (Running, i32) {
    let url = server.url();
    let holder = Running::start(leasehold(&[
        "run",
        "--redis",
        &url,
        "--ttl",
        "2s",
        "--kill-after",
        "300ms",
        "stubborn",
        "--",
        "sh",
        "-c",
        program,
    ]));
    let pid: i32 = holder.line(SOON).parse().unwrap();
    let (code, _, _) = crate::finish(
        leasehold(&["release", "--redis", &url, "--force", "stubborn"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    (holder, pid)
}

#[test]
fn a_program_that_ignores_sigterm_is_killed_after_the_grace() {
    let server = RedisServer::start();
    let (mut holder, pid) = stubborn_run_force_released(
        &server,
        "trap '' TERM; echo $$; while :; do sleep 0.05; done",
    );
    assert_eq!(holder.code(SOON), Some(76));
    let stderr = holder.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].contains("lost lock \"stubborn\": the lock was gone"),
        "{stderr}"
    );
    // "sent SIGKILL", or, when the enforcer's timer for the same instant fired first, "died of SIGKILL".
    assert!(lines[1].contains("SIGKILL"), "{stderr}");
    await_group_gone(pid);
}

/// A SIGKILL that `leasehold` did not send ends the program within its grace: `run` says so. The enforcer's, armed for
/// the same instant as `run`'s own SIGKILL, comes first that way on a loaded machine (`run` said nothing then).
#[test]
fn a_program_killed_by_someone_else_after_sigterm_is_reported_killed() {
    let server = RedisServer::start();
    // SIGTERM is seen ("term") and survives; the shell is the group's only process (`read` is built in, on the test's
    // open pipe), so nothing outlives it.
    let (mut holder, pid) = stubborn_run_force_released(
        &server,
        "trap 'echo term' TERM; echo $$; while :; do read -r line; done",
    );
    assert_eq!(holder.line(SOON), "term");
    // The whole group, as the enforcer kills it, within the 300 ms grace on an idle machine (on a busy one `leasehold`
    // may have sent it first: said as well).
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    assert_eq!(holder.code(SOON), Some(76));
    let stderr = holder.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].contains("lost lock \"stubborn\""), "{stderr}");
    assert!(lines[1].contains("SIGKILL"), "{stderr}");
    await_group_gone(pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_reach_until_the_wait_ends_exits_69_without_running_the_program() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    let mut holder = leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "--ttl",
        "1s",
        "wait-fail",
        "--",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    holder.stdin(Stdio::piped());
    let mut holder = Running::start(holder);
    assert_eq!(holder.line(SOON), "held");

    // The waiter looks again at the latest when the holder's lease would end (1 s); by then Redis is out of reach,
    // and stays so until the wait's 3 s are over.
    let mut waiter = Running::start(leasehold(&[
        "run",
        "--redis",
        &proxy.url(),
        "--wait",
        "3s",
        "wait-fail",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]));
    await_waiter(&server, "wait-fail");
    proxy.blackhole();

    assert_eq!(waiter.code(SOON), Some(69));
    let stderr = waiter.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with(
            "leasehold: warning: Redis unavailable while waiting for lock \"wait-fail\""
        ),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("leasehold: Redis failed while taking lock \"wait-fail\""),
        "{stderr}"
    );
    assert!(
        waiter.rest(SOON).is_empty(),
        "the program must not have run"
    );

    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
}

#[test]
fn a_waiting_run_survives_a_redis_restart_and_the_holder_that_lost_its_lock_exits_76() {
    let mut server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("cli-outage");
    let waiter_err = dir.path().join("waiter.stderr");

    let mut command = leasehold(&[
        "run",
        "--redis",
        &url,
        "job",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    let mut holder = Running::start(command);
    assert_eq!(holder.line(SOON), "held");

    let mut command = leasehold(&["run", "--redis", &url, "job", "sh", "-c", "echo got it"]);
    command.stderr(std::fs::File::create(&waiter_err).unwrap());
    let mut waiter = Running::start_with(command, false);
    await_waiter(&server, "job");

    server.kill();
    // The waiter met the outage (its stderr says so) and waits on.
    let warned = || std::fs::read_to_string(&waiter_err).unwrap_or_default();
    crate::poll_until("the waiter reports the outage", || {
        warned().contains("Redis unavailable while waiting for lock \"job\"")
    });
    // A restart without persistence loses the holder's lock: the waiter gets it, the holder finds out and exits 76.
    server.restart();
    assert_eq!(waiter.line(SOON), "got it");
    assert_eq!(waiter.code(SOON), Some(0));
    let lines: Vec<String> = warned().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("leasehold: warning: Redis unavailable"),
        "{lines:?}"
    );
    assert_eq!(holder.code(SOON), Some(76));
    assert!(holder.stderr().contains("lost lock \"job\""));
}

/// `leasehold run --redis URL OPTIONS NAME -- sh -c PROGRAM`.
fn run_sh(url: &str, options: &[&str], name: &str, program: &str) -> std::process::Command {
    let mut args = vec!["run", "--redis", url];
    args.extend_from_slice(options);
    args.extend_from_slice(&[name, "--", "sh", "-c", program]);
    leasehold(&args)
}

/// The state of process `pid` as `/proc/PID/stat` gives it (`S`, `R`, `Z`, …), or `gone`, as a shell snippet that
/// prints `second STATE`: the next holder's program says whether the first one still lives when it starts.
fn second_reports_state_of(pid: i32) -> String {
    format!(r#"s=$(cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null); echo "second ${{s:-gone}}""#)
}

/// A state `second_reports_state_of` printed for a program that no longer runs: reaped, or killed and not yet reaped
/// (a zombie, while its stopped parent cannot reap it).
fn is_dead(line: &str) -> bool {
    matches!(line, "second gone" | "second Z")
}

// Issue 33, item 3. Multi-threaded: the proxy's tasks must keep running while the test body blocks on processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_stderr_nobody_reads_still_stops_its_program_before_the_next_holder_starts() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    let dir = TempDir::new("cli-stderr");
    let log = dir.path().join("events");
    // A pipe the test never reads: the program fills it (`yes`), and every later write to it blocks.
    let (_unread, stderr) = nix::unistd::pipe().unwrap();
    let program = format!(
        r#"trap 'echo "term $$" >> {log}; exit 143' TERM; echo started; yes spam >&2 & wait"#,
        log = log.display()
    );
    let mut first = run_sh(&proxy.url(), &["--ttl", "3s"], "blocked", &program);
    first.env("RUST_LOG", "debug").stderr(Stdio::from(stderr));
    let mut first = Running::start_with(first, false);
    assert_eq!(first.line(SOON), "started");

    let second_program = format!(r#"echo "second" >> {}"#, log.display());
    let mut second = Running::start(run_sh(&server.url(), &[], "blocked", &second_program));
    await_waiter(&server, "blocked");
    proxy.blackhole();

    assert_eq!(
        second.code(Duration::from_secs(15)),
        Some(0),
        "{}",
        second.stderr()
    );
    let events = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = events.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].starts_with("term ") && lines[1] == "second",
        "the program must get SIGTERM before the next holder's program starts, stderr blocked or not:\n{events}"
    );
    // Its stderr still blocked, leasehold exits all the same, saying (to nobody) that it lost the lock.
    assert_eq!(first.code(SOON), Some(76));
}

// Issue 33, item 4: a SIGSTOPped `leasehold` cannot stop its program itself; the program must be dead all the same
// before the lease can have expired.
#[test]
fn the_program_of_a_stopped_leasehold_is_dead_before_the_next_holder_s_program_starts() {
    let server = RedisServer::start();
    let url = server.url();
    let mut first = Running::start(run_sh(
        &url,
        &["--ttl", "2s"],
        "frozen",
        "echo $$; while :; do sleep 0.05; done",
    ));
    let pid: i32 = first.line(SOON).parse().unwrap();
    let mut second = Running::start(run_sh(&url, &[], "frozen", &second_reports_state_of(pid)));
    await_waiter(&server, "frozen");

    send_signal(first.pid(), Signal::SIGSTOP).unwrap();
    let seen = second.line(SOON);
    send_signal(first.pid(), Signal::SIGCONT).unwrap();
    assert!(is_dead(&seen), "the first program still ran: {seen}");
    assert_eq!(second.code(SOON), Some(0), "{}", second.stderr());
    assert_eq!(first.code(SOON), Some(76), "{}", first.stderr());
    await_group_gone(pid);
}

// Issue 33, item 4: the SIGKILL after --kill-after lands by the lease's deadline, not --kill-after past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_traps_sigterm_is_dead_before_the_next_holder_s_program_starts() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    let mut first = Running::start(run_sh(
        &proxy.url(),
        &["--ttl", "3s", "--kill-after", "1s"],
        "stubborn",
        "trap '' TERM; echo $$; while :; do sleep 0.05; done",
    ));
    let pid: i32 = first.line(SOON).parse().unwrap();
    let mut second = Running::start(run_sh(
        &server.url(),
        &[],
        "stubborn",
        &second_reports_state_of(pid),
    ));
    await_waiter(&server, "stubborn");
    proxy.blackhole();

    let seen = second.line(Duration::from_secs(15));
    assert!(is_dead(&seen), "the first program still ran: {seen}");
    assert_eq!(second.code(SOON), Some(0), "{}", second.stderr());
    assert_eq!(first.code(SOON), Some(76));
    // The program trapped SIGTERM, so a SIGKILL ended it: sent by leasehold ("sent SIGKILL"), or, when its timer came
    // late on a loaded machine, by the enforcer at the same deadline. Either way the command said it would.
    let stderr = first.stderr();
    assert!(stderr.contains("then SIGKILL"), "{stderr}");
    await_group_gone(pid);
}

/// SIGTERM must leave --kill-after (and a margin) before the lease's deadline, while renewals still keep the lease:
/// a lease too short for that is refused before anything connects.
#[test]
fn a_kill_after_too_long_for_the_lease_is_refused() {
    let (code, _, stderr) = crate::finish(
        leasehold(&[
            "run",
            "--redis",
            "redis://127.0.0.1:1",
            "--ttl",
            "2s",
            "--kill-after",
            "5s",
            "short",
            "--",
            "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    let line = crate::one_error_line(&stderr);
    assert!(line.contains("--kill-after"), "{line}");
}

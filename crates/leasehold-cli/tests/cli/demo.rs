//! `leasehold demo`: the expected totals, and nothing left behind.

use std::net::TcpStream;
use std::time::Duration;

use leasehold::redis;
use leasehold_tests::{send_signal, RedisServer};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

const DEMO_LIMIT: Duration = Duration::from_secs(90);

fn round(report: &Value, n: usize) -> &Value {
    let round = &report["rounds"][n - 1];
    assert_eq!(round["round"], n, "{report}");
    round
}

fn assert_gone(pid: u32, port: u16) {
    assert_eq!(
        send_signal(pid, Signal::SIGCONT),
        Err(nix::Error::ESRCH),
        "the private redis-server (pid {pid}) is still running"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something still listens on {port}"
    );
}

#[test]
fn the_demo_oversells_without_leasehold_sells_exactly_with_it_and_removes_its_server() {
    let (code, stdout, stderr) = finish(leasehold(&["demo", "--json"]), DEMO_LIMIT);
    assert_eq!(code, Some(0), "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["stock"], 100);

    // Eight buyers read each stock value before any writes: eight sales per unit.
    let no_lock = round(&report, 1);
    assert_eq!(no_lock["units_sold"], 800, "{report}");
    assert_eq!(no_lock["oversold_by"], 700, "{report}");
    // The same on every run: the stopped buyer is resumed once the others sold the whole stock; its late write puts
    // 99 units back, and it sells them again.
    let textbook = round(&report, 2);
    assert_eq!(textbook["units_sold"], 200, "{report}");
    assert_eq!(textbook["final_stock"], 0, "{report}");
    assert_eq!(textbook["oversold_by"], 100, "{report}");
    for n in [3, 4] {
        let locked = round(&report, n);
        assert_eq!(locked["units_sold"], 100, "{report}");
        assert_eq!(locked["final_stock"], 0, "{report}");
        assert_eq!(locked["oversold_by"], 0, "{report}");
    }
    assert_eq!(round(&report, 4)["stale_writes_rejected"], 1, "{report}");

    let pid = u32::try_from(report["server"]["pid"].as_u64().unwrap()).unwrap();
    let port = u16::try_from(report["server"]["port"].as_u64().unwrap()).unwrap();
    assert_gone(pid, port);
}

#[test]
fn the_demo_on_a_given_server_prints_the_table_and_deletes_its_keys() {
    let server = RedisServer::start();
    let (code, stdout, stderr) = finish(leasehold(&["demo", "--redis", &server.url()]), DEMO_LIMIT);
    assert_eq!(code, Some(0), "{stderr}");
    let header = stdout
        .lines()
        .find(|l| l.starts_with("round"))
        .unwrap_or_else(|| panic!("no table in {stdout}"));
    for column in [
        "units sold",
        "final stock",
        "oversold by",
        "stale writes rejected",
        "time",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let row = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} row in {stdout}"))
            .to_owned()
    };
    let leasehold_row: Vec<String> = row("3. leasehold")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(leasehold_row[2..5], ["100", "0", "0"], "{stdout}");
    let textbook_row: Vec<String> = row("2. textbook lock")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(textbook_row[3..6], ["200", "0", "100"], "{stdout}");
    // Under the table, the lines that make round 3.
    assert!(
        stdout.contains("let guard = locks.mutex(\"stock\").lock().await?;"),
        "{stdout}"
    );
    assert!(stdout.contains("leasehold run stock"), "{stdout}");
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(keys, 0, "the demo left keys behind");
}

#[test]
fn the_demo_uses_the_server_of_leasehold_redis_url_and_deletes_its_keys() {
    let server = RedisServer::start();
    server.config_resetstat();
    let mut command = leasehold(&["demo", "--json"]);
    command.env("LEASEHOLD_REDIS_URL", server.url());
    let (code, stdout, stderr) = finish(command, DEMO_LIMIT);
    assert_eq!(code, Some(0), "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        report["server"],
        Value::Null,
        "a private server was started: {report}"
    );
    assert_eq!(round(&report, 3)["units_sold"], 100, "{report}");
    // The buyers' and the locks' work went to this server: stock reads, lock scripts, and the clean-up.
    let gets = server.command_calls("get");
    let scripts = server.command_calls("evalsha") + server.command_calls("eval");
    let dels = server.command_calls("del");
    assert!(
        gets >= 100 && scripts >= 200 && dels >= 1,
        "GET {gets}, scripts {scripts}, DEL {dels}"
    );
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(keys, 0, "the demo left keys behind");
}

#[test]
fn ctrl_c_stops_the_demo_and_its_server() {
    let mut demo = Running::start(leasehold(&["demo"]));
    let intro = demo.line(SOON);
    assert!(intro.starts_with("100 units in stock"), "{intro}");
    let server = demo.line(SOON);
    // "Redis: a private redis-server (pid PID) on 127.0.0.1:PORT, removed when the demo ends."
    let pid: u32 = server
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {server:?}"));
    let port: u16 = server
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {server:?}"));

    send_signal(demo.pid(), Signal::SIGINT).unwrap();

    assert_eq!(demo.code(SOON), Some(130));
    assert!(demo.stderr().contains("interrupted by SIGINT"));
    assert_gone(pid, port);
}

#[test]
fn the_demo_without_redis_server_says_how_to_install_it() {
    let mut command = leasehold(&["demo"]);
    command.env("PATH", "/nonexistent");
    let (code, stdout, stderr) = finish(command, SOON);
    assert_eq!(code, Some(69), "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        one_error_line(&stderr),
        "leasehold: redis-server not found; install it with: sudo apt-get install redis-server"
    );
}

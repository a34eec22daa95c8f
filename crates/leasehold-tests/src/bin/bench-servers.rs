//! Starts the test harness's private servers of the stores with sessions (one etcd member, one ZooKeeper server, one
//! PostgreSQL and one MariaDB server: free ports, temporary directories), prints one `STORE URL` line each, and keeps
//! them until its standard input closes; then they are killed and their directories removed. For `leasehold bench
//! --store URL` runs against the same servers the tests use (docs/BENCHMARKS.md):
//!
//! ```text
//! coproc SERVERS { target/release/bench-servers; }
//! read -r _ etcd <&"${SERVERS[0]}"; …
//! target/release/leasehold bench --store "$etcd" --duration 3s
//! ```
//!
//! `bench-servers etcd pg` starts only those (`etcd`, `zk`, `pg`, `mysql`). `pg-statements` is a PostgreSQL server
//! with `pg_stat_statements` loaded and created, to profile a cycle: what each statement costs the server
//! (`SELECT calls, total_exec_time, query FROM pg_stat_statements`); `mysql-statements` a MariaDB server with the
//! performance schema on (`performance_schema.events_statements_summary_by_digest`).

use std::io::{BufRead, Write};
use std::process::ExitCode;

use leasehold_tests::{EtcdServer, MariaDbServer, PgServer, ZkServer};

fn main() -> ExitCode {
    let asked: Vec<String> = std::env::args().skip(1).collect();
    let all = [
        "etcd",
        "zk",
        "pg",
        "mysql",
        "pg-statements",
        "mysql-statements",
    ];
    let names: Vec<&str> = if asked.is_empty() {
        all.to_vec()
    } else {
        asked.iter().map(String::as_str).collect()
    };
    if let Some(unknown) = names.iter().find(|n| !all.contains(n)) {
        eprintln!("bench-servers: unknown store {unknown:?} (etcd, zk, pg, mysql, pg-statements, mysql-statements)");
        return ExitCode::from(64);
    }
    let mut running = Vec::new();
    let mut out = std::io::stdout().lock();
    for name in names {
        // Each kept until the end (dropped, it is killed).
        let (server, url): (Box<dyn std::any::Any>, String) = match name {
            "etcd" => {
                let server = EtcdServer::start();
                let url = server.url();
                (Box::new(server), url)
            }
            "zk" => {
                let server = ZkServer::start();
                let url = server.url();
                (Box::new(server), url)
            }
            "pg" => {
                let server = PgServer::start();
                let url = server.url();
                (Box::new(server), url)
            }
            "pg-statements" => {
                let server = PgServer::start_counting_statements();
                let url = server.url();
                (Box::new(server), url)
            }
            "mysql-statements" => {
                let server = MariaDbServer::start_counting_statements();
                let url = server.url();
                (Box::new(server), url)
            }
            _ => {
                let server = MariaDbServer::start();
                let url = server.url();
                (Box::new(server), url)
            }
        };
        running.push(server);
        if writeln!(out, "{name} {url}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return ExitCode::from(74);
        }
    }
    // Until stdin closes (or says anything): then the servers are dropped, which kills them.
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    drop(running);
    ExitCode::SUCCESS
}

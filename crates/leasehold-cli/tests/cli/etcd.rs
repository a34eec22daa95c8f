//! The command on etcd (`--store etcd://…`) where only etcd is concerned: a member going away under a waiting run, and
//! TLS. What every store does (`run`, every kind, `status`, `list`, `release --force`, refusals, `bench`) is in
//! `stores.rs`, as `stores::etcd::…`. Each test starts its own etcd member.

use std::time::Duration;

use leasehold_tests::{EtcdServer, TestCa};

use crate::stores::{holder, status_json};
use crate::{finish, leasehold, one_error_line, Running, SOON};

#[test]
fn etcd_going_away_while_a_run_waits_ends_the_wait_with_69() {
    let mut etcd = EtcdServer::start();
    let url = etcd.url();
    let (mut first, _) = holder(&url, &["--ttl", "10s"], "busy");
    let mut waiting = Running::start(leasehold(&[
        "run", "-w", "3", "--store", &url, "busy", "--", "true",
    ]));
    // The waiter's key is in place once status counts it.
    crate::poll_until("the second run waits", || {
        status_json(&url, "busy")["waiting_clients"] == 1
    });
    etcd.kill();
    assert_eq!(waiting.code(Duration::from_secs(20)), Some(69));
    let stderr = waiting.stderr();
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("leasehold: etcd at etcd://127.0.0.1:")
                && l.contains("failed while taking lock \"busy\": ")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    drop(first.take_stdin());
}

#[test]
fn a_run_reaches_etcd_over_tls_with_the_ca_it_is_given() {
    let ca = TestCa::new();
    let etcd = EtcdServer::start_tls(&ca, true);
    let url = etcd.url();
    assert!(url.starts_with("etcds://"), "{url}");
    let files = [
        ca.ca.cert_path.to_str().unwrap(),
        ca.client.cert_path.to_str().unwrap(),
        ca.client.key_path.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--store",
            &url,
            "--tls-ca",
            files[0],
            "--tls-cert",
            files[1],
            "--tls-key",
            files[2],
            "sealed",
            "--",
            "sh",
            "-c",
            "echo fence $LEASEHOLD_FENCE",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("fence "), "{stdout}");
    // Without the client certificate the member refuses the connection: 69, as an unreachable store.
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "--store", &url, "--tls-ca", files[0], "sealed", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(69), "{stderr}");
    assert!(one_error_line(&stderr).contains("etcds://"), "{stderr}");
}

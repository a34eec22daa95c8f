//! The command over `rediss://`: a private CA, mutual TLS through the environment, and files that cannot be used.

use leasehold_tests::TlsRedisServer;

use crate::{finish, leasehold, one_error_line, SOON};

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn run_and_status_work_over_tls_with_a_ca_file() {
    let server = TlsRedisServer::start(false);
    let url = server.url();
    let ca = path(&server.ca.ca.cert_path);
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--redis",
            &url,
            "--tls-ca",
            ca,
            "tls-job",
            "sh",
            "-c",
            "echo fence=$LEASEHOLD_FENCE",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let fence: u64 = stdout
        .trim()
        .strip_prefix("fence=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(fence > 0);

    let (code, stdout, stderr) = finish(
        leasehold(&[
            "status", "--json", "--redis", &url, "--tls-ca", ca, "tls-job",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["state"], "free");
    assert_eq!(status["fence"], fence);
}

#[test]
fn mutual_tls_files_come_from_the_environment() {
    let server = TlsRedisServer::start(true);
    let url = server.url();
    let mut command = leasehold(&["run", "--redis", &url, "mtls-job", "true"]);
    command
        .env("LEASEHOLD_TLS_CA", &server.ca.ca.cert_path)
        .env("LEASEHOLD_TLS_CERT", &server.ca.client.cert_path)
        .env("LEASEHOLD_TLS_KEY", &server.ca.client.key_path);
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");

    // Without the client certificate the server refuses the handshake: Redis is unavailable (69), one line.
    let mut command = leasehold(&["run", "--redis", &url, "mtls-job", "true"]);
    command.env("LEASEHOLD_TLS_CA", &server.ca.ca.cert_path);
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(69), "{stderr}");
    let line = one_error_line(&stderr);
    assert!(
        line.contains("cannot connect to Redis at rediss://"),
        "{stderr}"
    );
    assert!(line.contains("requires a client certificate"), "{stderr}");
}

#[test]
fn an_unknown_server_certificate_is_exit_69_not_a_panic() {
    let server = TlsRedisServer::start(false);
    let (code, _, stderr) = finish(leasehold(&["status", "--redis", &server.url(), "x"]), SOON);
    assert_eq!(code, Some(69), "{stderr}");
    one_error_line(&stderr);
}

#[test]
fn unusable_tls_options_are_usage_errors() {
    let server = TlsRedisServer::start(false);
    let url = server.url();
    let missing = server.ca.dir().join("missing.crt");

    let (code, _, stderr) = finish(
        leasehold(&["status", "--redis", &url, "--tls-ca", path(&missing), "x"]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    let line = one_error_line(&stderr);
    assert!(
        line.contains("--tls-ca") && line.contains("missing.crt"),
        "{line}"
    );

    // A key file given as the CA.
    let (code, _, stderr) = finish(
        leasehold(&[
            "status",
            "--redis",
            &url,
            "--tls-ca",
            path(&server.ca.ca.key_path),
            "x",
        ]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("no certificate"),
        "{stderr}"
    );

    // A CA for a URL without TLS.
    let plain = server.server.url();
    let (code, _, stderr) = finish(
        leasehold(&[
            "status",
            "--redis",
            &plain,
            "--tls-ca",
            path(&server.ca.ca.cert_path),
            "x",
        ]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(one_error_line(&stderr).contains("rediss://"), "{stderr}");

    // A certificate without its key.
    let (code, _, stderr) = finish(
        leasehold(&[
            "status",
            "--redis",
            &url,
            "--tls-cert",
            path(&server.ca.client.cert_path),
            "x",
        ]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(one_error_line(&stderr).contains("--tls-key"), "{stderr}");
}

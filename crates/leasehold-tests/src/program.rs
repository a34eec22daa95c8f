//! Which server program the harness runs, and what it turns out to be.
//!
//! Every server the harness starts (a [`RedisServer`](crate::RedisServer), the nodes of a
//! [`RedisCluster`](crate::RedisCluster), the data nodes and sentinels of a
//! [`SentinelSet`](crate::SentinelSet), a quorum's nodes) runs [`server_binary`]: the program named
//! by `LEASEHOLD_TEST_SERVER`, or `redis-server` from `PATH`. Any binary that speaks the Redis
//! protocol and takes `redis-server`'s command line will do, such as `valkey-server`:
//!
//! ```text
//! LEASEHOLD_TEST_SERVER=/opt/valkey/bin/valkey-server cargo test --workspace --all-features
//! ```
//!
//! A test that depends on what the server is asks [`server_version`].

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The environment variable naming the server program: a path, or a program name looked up on `PATH`.
pub const SERVER_ENV: &str = "LEASEHOLD_TEST_SERVER";

/// The program run when [`SERVER_ENV`] is unset or empty.
pub const DEFAULT_SERVER: &str = "redis-server";

/// The server program every harness server runs: the value of `LEASEHOLD_TEST_SERVER` when it is
/// set and not empty, `redis-server` otherwise. Read once per process.
pub fn server_binary() -> &'static OsStr {
    static PROGRAM: OnceLock<OsString> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        std::env::var_os(SERVER_ENV)
            .filter(|value| !value.is_empty())
            .unwrap_or_else(|| DEFAULT_SERVER.into())
    })
}

/// Whether [`server_binary`] is something else than the default `redis-server`.
pub fn is_default_server() -> bool {
    server_binary() == DEFAULT_SERVER
}

/// Where [`server_binary`] is on disk, as an absolute path: the value itself when it names a path
/// (it holds a `/`), or its first match on `PATH`. For tests that hand the server to another
/// program.
///
/// # Panics
///
/// If there is no such file.
pub fn server_binary_path() -> PathBuf {
    let program = server_binary();
    resolve(program).unwrap_or_else(|| {
        panic!(
            "{} not found (set {SERVER_ENV} to a server binary, or install redis-server)",
            Path::new(program).display()
        )
    })
}

/// `program` as an absolute path: as given when it holds a `/`, otherwise its first match on `PATH`.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    let path = Path::new(program);
    let found = if path.components().count() > 1 {
        Some(path.to_owned())
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    };
    found.filter(|path| path.is_file())?.canonicalize().ok()
}

/// Which server a binary is, by the name it gives itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Flavour {
    /// Redis (`Redis server v=…`).
    Redis,
    /// Valkey (`Valkey server v=…`).
    Valkey,
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavour::Redis => "Redis",
            Flavour::Valkey => "Valkey",
        })
    }
}

/// What [`server_binary`] says it is with `--version`. Displays as `Valkey 9.1.2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerVersion {
    /// Redis or Valkey.
    pub flavour: Flavour,
    /// Major, minor and patch version.
    pub version: (u32, u32, u32),
}

impl ServerVersion {
    /// Whether this is `flavour` at `version` or later, e.g. `is_at_least(Flavour::Valkey, (8, 0, 0))`.
    pub fn is_at_least(&self, flavour: Flavour, version: (u32, u32, u32)) -> bool {
        self.flavour == flavour && self.version >= version
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor, patch) = self.version;
        write!(f, "{} {major}.{minor}.{patch}", self.flavour)
    }
}

/// What [`server_binary`] is, from its `--version` (run once per process).
///
/// # Panics
///
/// If the program cannot be run, or its answer is neither Redis' nor Valkey's.
pub fn server_version() -> ServerVersion {
    static VERSION: OnceLock<ServerVersion> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let program = server_binary();
        let name = Path::new(program).display();
        let output = Command::new(program)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {name} --version: {e}"));
        let text = String::from_utf8_lossy(&output.stdout);
        parse_version(&text)
            .unwrap_or_else(|| panic!("{name} --version says {text:?}: not Redis, not Valkey"))
    })
}

/// Reads `Redis server v=7.0.15 sha=…` or `Valkey server v=9.1.2 sha=…`.
fn parse_version(text: &str) -> Option<ServerVersion> {
    let mut words = text.split_whitespace();
    let flavour = match words.next()? {
        "Redis" => Flavour::Redis,
        "Valkey" => Flavour::Valkey,
        _ => return None,
    };
    let number = words.find_map(|word| word.strip_prefix("v="))?;
    let mut parts = number.split('.').map(str::parse::<u32>);
    let version = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    Some(ServerVersion { flavour, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_both_servers_parse() {
        let redis = parse_version(
            "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n",
        );
        assert_eq!(
            redis,
            Some(ServerVersion {
                flavour: Flavour::Redis,
                version: (7, 0, 15)
            })
        );
        let valkey = parse_version(
            "Valkey server v=9.1.2 sha=00000000:1 malloc=libc bits=64 build=1536df31c0395150\n",
        )
        .unwrap();
        assert_eq!(valkey.to_string(), "Valkey 9.1.2");
        assert!(valkey.is_at_least(Flavour::Valkey, (9, 0, 0)));
        assert!(!valkey.is_at_least(Flavour::Valkey, (9, 2, 0)));
        assert!(!valkey.is_at_least(Flavour::Redis, (7, 0, 0)));
        assert_eq!(parse_version("KeyDB server v=6.3.4"), None);
        assert_eq!(parse_version("Redis server v=7.x"), None);
    }

    #[test]
    fn the_configured_server_names_itself() {
        // Whatever runs the suite must be one of the servers the harness knows, and be found.
        server_version();
        assert!(server_binary_path().is_file());
    }
}

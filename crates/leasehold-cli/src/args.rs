//! The options that several modules read: the store a subcommand talks to (`StoreArg`: `--store`, `--prefix`, the
//! TLS files, `--replicas`, or the environment), and the options of `run`, `status`, `list`, `release` and `permits`.
//! Below `cli.rs`, which assembles them into the command line: `run.rs`, `schedule.rs`, `status.rs`, `connect.rs`
//! and `stores.rs` read them from here, and none of them reads `cli.rs`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::duration;
use crate::exit;

/// The store used when neither `--store` (`--redis`) nor `LEASEHOLD_STORE` (`LEASEHOLD_REDIS_URL`) names one.
pub const DEFAULT_STORE: &str = "redis://127.0.0.1:6379";

/// The environment variable that names the store, and the older one it replaces (still read when it is unset).
pub const STORE_ENV: &str = "LEASEHOLD_STORE";
pub const REDIS_ENV: &str = "LEASEHOLD_REDIS_URL";

/// Where the locks live.
#[derive(Debug, Clone, Args)]
pub struct StoreArg {
    /// The store's URL; its scheme picks the kind of store. Empty after parsing only until [`StoreArg::resolve`].
    #[arg(
        long = "store",
        visible_alias = "redis",
        value_name = "URL",
        env = STORE_ENV,
        action = clap::ArgAction::Append,
        help = "Where the locks live (also --redis; env LEASEHOLD_STORE, or LEASEHOLD_REDIS_URL; default \
                redis://127.0.0.1:6379). Redis: redis://[user:password@]host[:port][/db], rediss://… (TLS) or \
                unix:///path; a Redis Cluster: redis+cluster://[user:password@]host:port,host:port,… (every seed \
                node); Sentinel: redis+sentinel://[user:password@]host:port,host:port/service[/db] (the sentinels, \
                then the primary's service name; rediss+sentinel:// for TLS); given 3 or more times (run, status, \
                list, release): a quorum of independent Redis servers (Redlock). etcd: etcd://host:port[,host:port…] \
                (the members of one cluster; etcds:// over TLS). ZooKeeper: \
                zk://[user:password@]host:port[,host:port…][/chroot] (the servers of one ensemble). PostgreSQL: \
                postgres://user[:password]@host[:port]/database (?sslmode=require for TLS). MySQL or MariaDB: \
                mysql://user[:password]@host[:port]/database (or mariadb://)"
    )]
    pub urls: Vec<String>,

    /// The key prefix of the locks (as the library's `Builder::prefix`).
    #[arg(long, value_name = "PREFIX", env = "LEASEHOLD_PREFIX", default_value = leasehold::DEFAULT_PREFIX)]
    pub prefix: String,

    /// For rediss://, etcds:// and postgres://…?sslmode=require URLs: trust this CA certificate (PEM) instead of the
    /// system's trust store. Not with etcd://, zk:// or mysql://.
    #[arg(long, value_name = "FILE", env = "LEASEHOLD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// For rediss://, etcds:// and postgres://…?sslmode=require URLs: present this client certificate (PEM) to
    /// servers that require one (with --tls-key). Not with etcd://, zk:// or mysql://.
    #[arg(
        long,
        value_name = "FILE",
        env = "LEASEHOLD_TLS_CERT",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "LEASEHOLD_TLS_KEY",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Every grant and renewal must be acknowledged by this many replicas of the lock's primary (WAIT); a grant too
    /// few acknowledge is released, and the command exits 69 saying how many did. Redis only: etcd and ZooKeeper
    /// commit every grant to a majority before they answer, and on PostgreSQL and MySQL/MariaDB the database's own
    /// replication decides.
    #[arg(
        long,
        value_name = "N",
        env = "LEASEHOLD_REPLICAS",
        default_value_t = 0
    )]
    pub replicas: u32,
}

impl StoreArg {
    /// Fills in the store when no option and no `LEASEHOLD_STORE` named one: `LEASEHOLD_REDIS_URL` (the older name),
    /// else [`DEFAULT_STORE`].
    pub fn resolve(&mut self) {
        if self.urls.is_empty() {
            self.urls
                .push(older_env().unwrap_or_else(|| DEFAULT_STORE.to_owned()));
        }
    }
}

/// `LEASEHOLD_REDIS_URL`, read only when `LEASEHOLD_STORE` is unset (clap reads that one).
pub fn older_env() -> Option<String> {
    std::env::var(REDIS_ENV).ok()
}

/// `leasehold run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub store: StoreArg,

    /// The lease, renewed automatically while the program runs (a duration with its unit: 30s, 2m). On etcd, the
    /// session lease the grant lives under: whole seconds, at least 2s. On ZooKeeper, the session timeout asked
    /// for: at least 1s, whole milliseconds; ZooKeeper clamps it to its min/max (by default 2 to 20 ticks) and the
    /// session uses the timeout it negotiated.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_ttl, allow_hyphen_values = true)]
    pub ttl: Duration,

    /// Wait at most this long for the lock (default: wait as long as it takes): a duration (1m30s) or, as in flock
    /// and timeout, a bare number of seconds (5, 0.5); 0 tries once, like --nonblock.
    #[arg(long, short = 'w', value_name = "DURATION", value_parser = duration::parse_wait, allow_hyphen_values = true, conflicts_with = "nonblock")]
    pub wait: Option<Duration>,

    /// Do not wait: exit at once with the conflict status when the lock is held.
    #[arg(long, short = 'n')]
    pub nonblock: bool,

    /// Take a read share of the read-write lock NAME: runs alongside other --shared runs, never with an --exclusive
    /// one (as flock -s). Waits for a plain run that holds NAME as a mutex.
    #[arg(long, short = 's', group = "kind")]
    pub shared: bool,

    /// Take the write lock of the read-write lock NAME: runs alone, neither with --shared nor --exclusive runs (as
    /// flock -x). Waits for a plain run that holds NAME as a mutex.
    #[arg(long, short = 'x', group = "kind")]
    pub exclusive: bool,

    /// Take one of N permits of the semaphore NAME: at most N runs at once across all hosts (on etcd, ZooKeeper,
    /// PostgreSQL and MySQL/MariaDB, N is at most 4294967295 and is not stored; a run whose N differs from a run's
    /// ahead of it exits 65).
    #[arg(long, value_name = "N", group = "kind", value_parser = clap::value_parser!(u64).range(1..=(1 << 40)))]
    pub permits: Option<u64>,

    /// Use the strictly fair mutex NAME: waiting runs start in order of arrival, across all hosts.
    #[arg(long, group = "kind")]
    pub fair: bool,

    /// Campaign in the election NAME: the run leads while it holds NAME (a mutex, so runs lead in order of arrival)
    /// and publishes TEXT, which `observe`, `status` and `list --json` show (1 to 1024 bytes, no control characters).
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["fair", "shared", "exclusive", "permits", "also"])]
    pub value: Option<String>,

    /// Hold this lock too (repeatable): the program runs only while every name is held. The names are taken in the
    /// order of their names (so that runs naming them in other orders never deadlock), all within one --wait, each
    /// as the kind the options ask for NAME; all or none. Its fence is in LEASEHOLD_FENCE_1, LEASEHOLD_FENCE_2… (in
    /// the order given), its name in LEASEHOLD_NAME_1…; LEASEHOLD_FENCE stays NAME's.
    #[arg(long, value_name = "NAME2", value_parser = parse_name)]
    pub also: Vec<String>,

    /// Print nothing when the lock was not acquired: the exit status says it.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// The exit status when the lock was not acquired.
    #[arg(long, short = 'E', value_name = "N", default_value_t = exit::CONFLICT)]
    pub conflict_exit_code: u8,

    /// How long before SIGKILL the program gets SIGTERM when the lease runs out (a duration with its unit: 5s,
    /// 500ms). SIGKILL lands before the lease's deadline, so at most half the lease less a margin (a tenth of it, at
    /// most 1s); longer is a usage error. [default: 5s, or that most when the lease is too short for 5s]
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, allow_hyphen_values = true)]
    pub kill_after: Option<Duration>,

    /// Run this shell command with `/bin/sh -c` instead of a PROGRAM (as `flock -c` does).
    #[arg(
        long = "command",
        short = 'c',
        value_name = "SHELL COMMAND",
        conflicts_with = "program",
        allow_hyphen_values = true
    )]
    pub shell: Option<String>,

    /// The lock's name (1 to 512 bytes).
    #[arg(value_name = "NAME", value_parser = parse_name)]
    pub name: String,

    /// The program and its arguments, passed on as they are, even those starting with `-`.
    // After parsing, `--command` is here too, as `/bin/sh -c COMMAND`: run.rs knows only this field.
    #[arg(
        id = "program",
        value_name = "PROGRAM",
        required_unless_present = "shell",
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// Turns `--command` into the program to run, so that what runs is always `command`.
    pub fn resolve_shell(&mut self) {
        if let Some(shell) = self.shell.take() {
            self.command = vec!["/bin/sh".into(), "-c".into(), shell.into()];
        }
    }
}

/// `leasehold status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub store: StoreArg,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,

    /// The lock's name.
    #[arg(value_name = "NAME", value_parser = parse_name)]
    pub name: String,
}

/// `leasehold observe`.
#[derive(Debug, Args)]
pub struct ObserveArgs {
    #[command(flatten)]
    pub store: StoreArg,

    /// Print one JSON object per line instead of a sentence.
    #[arg(long)]
    pub json: bool,

    /// How often to read the election (a duration: 100ms, 1s).
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = duration::parse)]
    pub every: Duration,

    /// The election's name (its lock's).
    #[arg(value_name = "NAME", value_parser = parse_name)]
    pub name: String,
}

/// `leasehold list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArg,

    /// Print one JSON array instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Which lock names (a Redis glob, also on etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB).
    #[arg(value_name = "PATTERN", default_value = "*")]
    pub pattern: String,
}

/// `leasehold release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub store: StoreArg,

    /// Confirm: remove the lock whoever holds it.
    #[arg(long)]
    pub force: bool,

    /// The lock's name.
    #[arg(value_name = "NAME", value_parser = parse_name)]
    pub name: String,
}

/// `leasehold permits`.
#[derive(Debug, Args)]
pub struct PermitsArgs {
    #[command(flatten)]
    pub store: StoreArg,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,

    /// The semaphore's name.
    #[arg(value_name = "NAME", value_parser = parse_name)]
    pub name: String,

    /// The new permit count (1 to 2^40).
    #[arg(value_name = "N", value_parser = clap::value_parser!(u64).range(1..=(1 << 40)))]
    pub permits: u64,
}

/// The library's own rules for names (length, a leading `}`), checked before anything connects.
fn parse_name(name: &str) -> Result<String, String> {
    leasehold::lock_keys(leasehold::DEFAULT_PREFIX, name).map_err(|e| e.to_string())?;
    Ok(name.to_owned())
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration::parse(text)?;
    if ttl < leasehold::MIN_TTL {
        return Err(format!(
            "the lease must be at least {}",
            duration::show(leasehold::MIN_TTL)
        ));
    }
    Ok(ttl)
}

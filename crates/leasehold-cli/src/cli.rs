//! The command line: subcommands, options, their help texts, and clap's errors turned into one line.

use std::ffi::OsString;

use clap::{CommandFactory as _, Parser, Subcommand};

use crate::args::{
    older_env, ListArgs, ObserveArgs, PermitsArgs, ReleaseArgs, RunArgs, StatusArgs,
};
use crate::demo::DemoArgs;
use crate::docs::{CompletionsArgs, ManArgs};
use crate::exit;

const ROOT_AFTER: &str = "\
Examples:
  leasehold run nightly-report ./report.sh --since yesterday
  leasehold run -c 'pg_dump app | gzip > app.sql.gz' nightly-dump
  leasehold status nightly-report
  leasehold release --force nightly-report
  leasehold demo
  leasehold completions bash > /etc/bash_completion.d/leasehold
  leasehold man > /usr/local/share/man/man1/leasehold.1

Exit status of `leasehold run`: the program's own, or 128+N when signal N ended it;
  2 usage error, 65 NAME is a lock of another kind, 69 the store unreachable or refusing,
  75 lock not acquired, 76 lock lost while the program ran, 126 program not executable,
  127 program not found.
See `leasehold <COMMAND> --help` for each command.

Stores: Redis (redis://, rediss://, unix://, redis+cluster://, redis+sentinel://; the default), etcd
(etcd://host:port[,host:port...], the members of one cluster), ZooKeeper
(zk://[user:password@]host:port[,host:port...][/chroot], the servers of one ensemble), PostgreSQL
(postgres://user[:password]@host[:port]/database) or MySQL/MariaDB (mysql:// or mariadb://): run,
status, list, release and bench work on all of them. On etcd, run's --ttl is the session lease (whole
seconds, at least 2s); on ZooKeeper, the session timeout asked for (at least 1s), which ZooKeeper
clamps to its own bounds; on PostgreSQL and MySQL the session's TTL (at least 1s). --replicas,
--tls-* (etcds:// and postgres://...?sslmode=require excepted), several --store, `permits` and
`demo` are Redis-only and exit 2 before connecting.

Environment: LEASEHOLD_STORE (or LEASEHOLD_REDIS_URL), LEASEHOLD_PREFIX, LEASEHOLD_TLS_CA, LEASEHOLD_TLS_CERT,
LEASEHOLD_TLS_KEY and LEASEHOLD_REPLICAS stand in for their options. RUST_LOG (tracing's
EnvFilter syntax: `leasehold=debug`, `info,leasehold::keeper=trace`) prints the library's
events on stderr for debugging; without it only warnings the command words itself appear.";

const RUN_AFTER: &str = "\
Options go before NAME; everything after NAME is the program and its arguments, passed on
as they are (a `--` before the program is accepted too). The program runs directly, or with
-c through /bin/sh, in its own process group, with stdin, stdout and stderr passed through,
and with these variables added to its environment:
  LEASEHOLD_NAME   the lock's name
  LEASEHOLD_TOKEN  this grant's owner token as stored in the store (it holds spaces: quote it)
  LEASEHOLD_FENCE  this grant's fencing number, a decimal integer that increases with every
               grant of the lock: pass it to the store you write to, and have the store
               refuse writes that carry a lower one
  LEASEHOLD_TERM   with --value: the term's number (1 for the election's first term, one
               more for each later one)

Lock kinds: by default NAME is a mutex (one run at a time; waiting hosts are served in the
order they started waiting). --fair serves every waiting run in order of arrival; --shared
and --exclusive take a read share or the write lock of a read-write lock (a waiting
--exclusive run holds back --shared runs that come after it); --permits N lets N runs hold
NAME at once (N is stored while a run holds a permit: another N fails with status 65). As
with flock, a plain run and -s/-x runs may share a name: a plain run that finds NAME used as a
read-write lock takes its write lock (as flock's default -x), and an -s/-x run that finds NAME
held as a mutex waits for that mutex, then takes the read-write lock. --fair and --permits
have no flock counterpart: using a name as another kind with them fails with status 65.

On etcd (--store etcd://host:port[,host:port...]) every grant lives under the session lease of the
command's etcd client, and --ttl is that lease: whole seconds, at least 2s (etcd grants no other), 30s
by default; a keep-alive goes out every third of it. NAME lives under the etcd keys PREFIX/NAME/, so
`etcdctl lock PREFIX/NAME` and leasehold runs of every kind exclude each other. Every kind serves its waiters in
order of arrival. A name is not tied to one kind there: runs of different kinds exclude each other and
wait (never status 65), and a semaphore's count is not stored, but a run whose --permits differs
from that of a run ahead of it exits 65 naming both counts, as on Redis (N at most 4294967295). --replicas, --tls-* and --store given twice are Redis settings: with an etcd
URL they exit 2 before connecting.

On ZooKeeper (--store zk://[user:password@]host:port[,host:port...][/chroot]) every grant is an
ephemeral sequential node of the command's ZooKeeper session, and --ttl is the session timeout asked
for: at least 1s, in whole milliseconds, 30s by default. ZooKeeper clamps it to its own
minSessionTimeout and maxSessionTimeout (by default 2 and 20 ticks: 4s to 40s with a 2s tick), and
the session runs with the timeout it negotiated: a sync every eighth of it, and the program is
stopped five eighths of it after the last answered one. NAME is the node /PREFIX/NAME (under the
URL's chroot): kazoo's Lock, ReadLock and WriteLock on that path wait for every leasehold run (a
--shared or --permits one too) and runs wait for them; Curator's recipes do not see leasehold's
nodes (the README's ZooKeeper section has the table). Kinds, order and --permits as on etcd. --replicas, --tls-* and --store given twice exit 2 before connecting (leasehold
reaches ZooKeeper without TLS).

On PostgreSQL and MySQL/MariaDB (--store postgres://user@host/database, mysql://user@host/database)
every grant is a row of the library's lease tables (leasehold_entry, created on first use) under a
session row of the command's client, and --ttl is that session's TTL: at least 1s, 30s by default,
renewed every quarter of it with its expiry on the database server's clock. Kinds, order and
--permits as on etcd. The fence comes from a sequence (PostgreSQL) or the lock's own row (MySQL).
--tls-* go with postgres://...?sslmode=require (verified TLS); MySQL is reached without TLS.

Nesting: a program run under NAME may run `leasehold run NAME ...` again (the environment
says which lock and token it runs under): the inner program runs at once under the outer
grant, and its end does not release the outer lock. If the lock is lost, the outer run stops
its whole process group, the inner run and its program with it. Only a grant that covers the
inner run is shared: an exclusive one (plain, --exclusive, --fair) covers every kind, a
--shared one covers --shared, a --permits N one covers --permits N (where the store records
N: Redis). Any other pair exits 65 at once, since waiting would wait for the outer grant.

The lease is renewed every third of --ttl while the program runs, and the program is gone by
the lease's deadline, before the lease can expire in the store: when renewals have not been
confirmed by --kill-after plus a margin (a tenth of the lease, at most 1s) before the deadline,
the program's whole process group gets SIGTERM, and SIGKILL --kill-after later, the margin
before the deadline; a key found gone or taken gets SIGTERM at once (SIGKILL after --kill-after,
by the deadline at the latest). leasehold reports the loss and exits 76. --kill-after is thus at
most half the lease less the margin: 5s by default, less when the lease is too short for 5s;
a longer one exits 2. A second process, the enforcer (leasehold itself, in a process group of
its own), gets every new deadline from leasehold and SIGKILLs the program's group when none
came in time, so a stopped or stuck leasehold (SIGSTOP, a debugger, a stalled stderr) cannot
leave its program running beside the next holder. Every catchable signal that would end leasehold (SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1, SIGUSR2, ...) is passed on to the program instead; the lock is released when
the program exits. If leasehold is killed, the program is killed with it (Linux).

Exit status:
  N      the program's own exit status
  128+N  the program was ended by signal N (or leasehold was, while waiting for the lock)
  2      usage error
  65     the lock's key holds something leasehold did not write (left untouched), or a
         lock of another kind than --fair or --permits asks for (or a fair mutex or a
         semaphore, for a plain or -s/-x run), or a semaphore in use with another count
         than --permits, or a nested run that its outer run's grant does not cover
  69     the store (Redis, etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB) cannot be reached at start, refuses the credentials, lacks an
         ACL permission, or was still unreachable when --wait ran out (a wait rides out restarts
         and outages, with one warning line); or fewer than --replicas replicas acknowledged the
         grant; or the store cannot do what was asked (the library's Error::Unsupported, found
         before anything is taken; the options a store cannot honour exit 2 before connecting)
  70     internal error (a bug in leasehold; please report it)
  75     the lock was not acquired (--nonblock, --wait); see --conflict-exit-code
  76     the lock was lost (or its lease ran out unrenewed) while the program ran
  126    the program exists but cannot be executed (permissions, not an executable)
  127    the program cannot be found

Examples:
  # A cron job that runs on one host at a time; the other hosts skip it silently:
  leasehold run -n -q --conflict-exit-code 0 --store redis://redis.internal:6379 \\
      nightly-report ./report.sh --since yesterday

  # Wait up to 5 seconds (a bare number is seconds, as in flock -w 5):
  leasehold run -w 5 nightly-report ./report.sh

  # Wait up to an hour and a half for the lock; a shell command as the program:
  leasehold run --wait 1h30m -c 'psql -f migrate.sql && touch /var/run/migrated' migrate

  # At most 4 exports at once across all hosts:
  leasehold run --permits 4 exports ./export.sh

  # Backups read while the schema migration (alone) waits for them, then holds them back:
  leasehold run --shared schema ./backup.sh
  leasehold run --exclusive schema ./migrate.sh

  # The same on an etcd cluster (a 10-second session lease):
  leasehold run --store etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379 --ttl 10s \\
      nightly-report ./report.sh

  # The same on a ZooKeeper ensemble (a 10-second session timeout asked for):
  leasehold run --store zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181 --ttl 10s \\
      nightly-report ./report.sh

  # Hand the fence to the store, which refuses writes older than the newest it has seen:
  leasehold run -c 'psql -v fence=\"$LEASEHOLD_FENCE\" -f sync.sql' stock-sync";

const OBSERVE_AFTER: &str = "\
Prints the election's leader at once (or that nobody leads), then one line each time a new term
begins, the leader proclaims a new value, or the last term ends, until SIGINT or SIGTERM (exit 0).
It reads the election every --every (on etcd and ZooKeeper, when a watch fires, and at least every
ten --every) and rides out a store that does not answer; terms that began
and ended between two reads are counted in a line of their own (\"N term(s) began and ended
unseen\"), never skipped silently. Lines come in order of fence. A leader is any holder of the lock
NAME: `run --value TEXT NAME` campaigns, publishing TEXT, and its term has a number (1, 2, 3, ...);
a plain run leads without a value or a number.

--json prints one object per line:
  {\"name\": string, \"leader\": bool, \"fence\": number | null, \"term\": number | null,
   \"value\": string | null, \"token\": string | null, \"description\": string | null,
   \"holder\": {\"host\", \"pid\", \"user\", \"started\", \"program\"} | null}
or, for terms missed between two reads, {\"name\": string, \"missed\": number | null} (null: the
store lost its count, a Redis restart without persistence, so some may have passed).

Examples:
  leasehold observe scheduler
  leasehold observe --json --store etcd://10.0.0.1:2379 scheduler | jq .value";

const STATUS_AFTER: &str = "\
Prints whether the lock is free or held and, when held, who holds it, its fence, remaining
lease and owner token. Exits 0 either way (69 when the store cannot be asked, 65 when the key
is not a leasehold lock, 2 on usage errors).

--json prints one object:
  {\"name\": string, \"state\": \"held\" | \"free\", \"remaining_ms\": number | null,
   \"fence\": number | null, \"token\": string | null, \"description\": string | null,
   \"value\": string | null, \"term\": number | null,
   \"holder\": {\"host\", \"pid\", \"user\", \"started\", \"program\"} | null,
   \"waiting_clients\": number, \"kind\": \"mutex\" | \"fair\" | \"rw\" | \"semaphore\" | null,
   \"permits\": number | null,
   \"holders\": [{\"mode\", \"remaining_ms\", \"token\", \"description\", \"value\", \"term\",
                \"holder\"}],
   \"warnings\": [string]}
The top-level holder fields describe the holder whose lease ends first; \"holders\" lists them all
(readers of a read-write lock, permit holders of a semaphore). permits is a semaphore's count
while a permit is held; waiting_clients counts live waiters only.
fence is the holder's fence while held, and the last fence granted while free (null when
Redis no longer has it, and always on etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB, which report no
past grant); on etcd remaining_ms is the holder's session lease in whole seconds, on PostgreSQL and
MySQL/MariaDB the time left to the holder's session row, and on ZooKeeper it is always null
(ZooKeeper does not tell how long another client's session has left); remaining_ms and token are null
while free; description is what the
holder said about itself, and holder its fields when `leasehold run` wrote it (host, pid of
`leasehold run`, user, start time in UTC, program and arguments); waiting_clients counts the
processes queued for the lock.

Examples:
  leasehold status nightly-report
  leasehold status --json nightly-report | jq -r .state";

const LIST_AFTER: &str = "\
Lists the locks held right now whose names match PATTERN (a Redis glob, on the other stores too: *
for all, orders:*, job-?; default *), one per line: name, fence, remaining lease, waiting clients,
holder. Walks the keys with SCAN (never KEYS; on etcd, one read of the keys under PREFIX/; on
ZooKeeper, a walk of the nodes under /PREFIX; on PostgreSQL and MySQL/MariaDB, one read of the lease
tables), so a lock taken or released meanwhile may or may not
appear. Control characters in names and descriptions are shown escaped (\n, \u{1b}); columns are
aligned for wide characters. Exits 0, also when nothing is held (69 when the store cannot be asked).

--json prints an array of the objects `leasehold status --json` prints.

Examples:
  leasehold list
  leasehold list 'nightly-*'
  leasehold list --prefix billing --json | jq -r '.[].name'";

const RELEASE_AFTER: &str = "\
Deletes the lock whoever holds it and wakes its waiters: an operator's escape hatch for a
lock whose holder is known to be dead. A live holder finds out at its next renewal (on etcd, at
its session's next keep-alive; on ZooKeeper at once, from the watch on its node; on PostgreSQL and
MySQL/MariaDB, at its session's next renewal), and `leasehold run`
then stops its program and exits 76. Prints the owner token it removed, or
that the lock was free.

Examples:
  leasehold release --force nightly-report";

const PERMITS_AFTER: &str = "\
A semaphore stores its permit count while a permit is held: the count of the run that found
it free. A run with another --permits then exits 65 naming both counts. This stores a new
count in a semaphore in use: lowering it revokes no permit (new runs wait until the holders
drop below it), raising it admits waiting runs at once; runs already waiting keep their
place under the new count. On a free semaphore nothing is stored: the next run's --permits
is the count. Give the new count to every run's --permits too. Redis only: etcd, ZooKeeper,
PostgreSQL and MySQL/MariaDB store no count (a run whose --permits differs from a run ahead of it
exits 65), and their URLs exit 2 before connecting.

Exit status: 0 stored (or the semaphore was free), 65 NAME is another kind of lock, 69
Redis cannot be reached, 2 usage error (an etcd://, zk://, postgres:// or mysql:// store among
them).

Examples:
  leasehold permits exports 6";

const DEMO_AFTER: &str = "\
Sells a stock of 100 units to 8 buyer processes that each read the stock, pause a moment,
then write back what they read minus one and record a sale. Four rounds:
  1. no lock: the buyers start each purchase together (they meet after reading), so all read
     the same stock and overwrite each other's writes: 800 sold;
  2. the textbook lock (SET NX PX, then DEL): buyer 0 reads the stock, then is stopped
     (SIGSTOP) past the lock's TTL; the others sell the whole stock; resumed (SIGCONT) once they
     are done, its late write puts 99 sold units back on the shelf: 200 sold, on every run;
  3. leasehold: exactly 100 sold, stock 0 (the lines of code that do it are shown under the
     table);
  4. leasehold and a fenced store: a buyer freezes past its lease while holding the lock; the
     store refuses its late write, because a newer holder wrote with a higher fence.

Without --store (or LEASEHOLD_STORE) it starts a private redis-server (from PATH) on a
free port of 127.0.0.1, without persistence, and removes it when done (also on Ctrl-C). With
--store or LEASEHOLD_STORE it uses that server and deletes its own keys afterwards. Redis only:
an etcd://, zk://, postgres:// or mysql:// store exits 2 before connecting.

Every run shows the same numbers; only the times vary.

Examples:
  leasehold demo
  leasehold demo --store redis://127.0.0.1:6379 --json";

const BENCH_AFTER: &str = "\
Scenarios (each measures --duration after a short warm-up, against the same server, in this run):
  floor-1, floor-64        1 or 64 tasks: SET NX PX + owner-checked delete script (the raw-Redis floor)
  uncontended-1, -64       the same with leasehold lock() + release(); reported as a ratio to the floor
  floor-8p                 8 processes spinning on ONE key with SET NX PX + the delete script
                           (what most peers do; the contended floor)
  peer-1, -64, -8p         rslock's recipe on the same client library (a multiplexed connection;
                           when busy, the delete and a random sleep of 0 or 1 ms); leasehold's
                           rows say their ratio to it (× peer)
  contended-8p             8 processes looping on ONE lock; shares per process (min/max)
  handoff                  2 processes taking turns; p50 compared with one raw round trip
  fair-8p, fair-handoff    the same two with the fair mutex (fair-8p against floor-8p)
  rw-8p                    8 processes on ONE read-write lock, one write in ten; writes' p99
  semaphore-8p             8 processes on ONE semaphore of 4 permits; shares per process
  renew-10k                one process holds 10,000 locks through 3 renewal periods

On etcd (--store etcd://host:port[,host:port...]) the same scenarios where they make sense, against
etcd's own floor in the same run:
  etcd-lock-1, -64, -8p    etcd's Lock/Unlock RPC under a lease (the plain recipe a Go user gets;
                           8p: 8 processes waiting in it on ONE name); uncontended-1, -64,
                           contended-8p and fair-8p say their ratio to it (× floor)
  floor-*, peer-*          skipped (the raw-Redis floor and rslock's recipe are Redis's)
  renew-10k                the locks follow one session lease: its renewal calls are keep-alives
The server's CPU time is then process_cpu_seconds_total of each member's /metrics page, and
the raw round trip of the hand-offs a linearizable read.

On ZooKeeper (--store zk://host:port[,host:port...][/chroot]) likewise, against ZooKeeper's floor:
  zk-floor-1, -64, -8p     a bare ephemeral sequential node created, then deleted (8p: 8 processes on
                           ONE name, each node waiting for the one ahead to go); uncontended-1, -64,
                           contended-8p and fair-8p say their ratio to it (× floor)
  floor-*, peer-*          skipped
  renew-10k                the locks follow one session: its renewal calls are the requests the
                           servers received (mntr's zk_packets_received; allow mntr)
ZooKeeper reports no CPU time: the server's is that of the server processes on this machine
(from /proc), none for a server elsewhere; the raw round trip is a read of one node.

On PostgreSQL (--store postgres://user@host:port/database) likewise, against its advisory lock:
  pg-floor-1, -64, -8p     SELECT pg_advisory_lock(key) + pg_advisory_unlock(key), the key a
                           64-bit hash of the name, each task on a connection of its own (8p: 8
                           processes on ONE name, waiting in pg_advisory_lock); uncontended-1,
                           -64, contended-8p and fair-8p say their ratio to it (× floor)
  pg-row-1, -64            a durable lease row: INSERT of the lock's row (the name its primary
                           key), then DELETE, each task on a connection of its own; uncontended-1
                           and -64 say their ratio to it (× row floor)
  floor-*, peer-*          skipped
  renew-10k                renewal calls are the transactions the server ran (pg_stat_database)
On MySQL or MariaDB (--store mysql://user@host:port/database, or mariadb://) likewise:
  my-floor-1, -64, -8p     SELECT GET_LOCK(name, 10) + RELEASE_LOCK(name), each task on a
                           connection of its own (8p: waiting in GET_LOCK); the same ratios
  my-row-1, -64            the same lease row (an InnoDB table, VARBINARY(512) key); × row floor
  renew-10k                renewal calls are the statements the server received (Questions)
Neither reports its CPU time: the server's is read from /proc as on ZooKeeper (PostgreSQL's with
its backends); the raw round trip is SELECT 1 on PostgreSQL, a ping on MySQL.

The table gives latencies in µs, the ratio to the floor as a factor, the server's CPU time
(INFO cpu, user + system, over the measured window) per lock cycle (per renewal for renew-10k),
and the client's CPU time per cycle (this process's, or the worker processes' together); on a
server that others use too, their work counts in the server's. Each scenario prints one line on
stderr as it ends (a progress bar too, on a terminal, without --json).

Examples:
  leasehold bench                                   # private redis-server, all scenarios, a table
  leasehold bench --duration 2s --scenarios floor-1,uncontended-1
  leasehold bench --store redis://10.0.0.5:6379 --json --plot latency.svg
  leasehold bench --store etcd://10.0.0.7:2379 --scenarios etcd-lock-1,uncontended-1
  leasehold bench --store zk://127.0.0.1:2181 --duration 3s
  leasehold bench --store postgres://postgres@127.0.0.1/postgres --duration 3s
  leasehold bench --store mysql://root@127.0.0.1/test --duration 3s";

const COMPLETIONS_AFTER: &str = "\
Prints the script on stdout; install it where your shell looks for completions.

Examples:
  leasehold completions bash > /etc/bash_completion.d/leasehold
  leasehold completions zsh > \"${fpath[1]}/_leasehold\"
  leasehold completions fish > ~/.config/fish/completions/leasehold.fish";

const MAN_AFTER: &str = "\
Prints the page on stdout, in roff, generated from the same definitions as --help.

Examples:
  leasehold man | man -l -
  leasehold man run > /usr/local/share/man/man1/leasehold-run.1";

/// Run any program under a distributed lock on Redis, etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, after_help = ROOT_AFTER)]
#[command(propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program while holding a lock; stop it if the lock is lost.
    #[command(
        after_help = RUN_AFTER,
        override_usage = "leasehold run [OPTIONS] <NAME> <PROGRAM> [ARGS]...\n       \
                          leasehold run [OPTIONS] -c <SHELL COMMAND> <NAME>"
    )]
    Run(RunArgs),
    /// Show whether a lock is free or held, with its fence and remaining lease.
    #[command(after_help = STATUS_AFTER)]
    Status(StatusArgs),
    /// List the locks held right now, with their holders.
    #[command(after_help = LIST_AFTER)]
    List(ListArgs),
    /// Print who leads an election now, then one line each time that changes, until interrupted.
    #[command(after_help = OBSERVE_AFTER)]
    Observe(ObserveArgs),
    /// Remove a stuck lock whoever holds it (needs --force).
    #[command(after_help = RELEASE_AFTER)]
    Release(ReleaseArgs),
    /// Change the permit count of a semaphore in use (the count `run --permits` must then give).
    #[command(after_help = PERMITS_AFTER)]
    Permits(PermitsArgs),
    /// Show the oversell problem and its cure: four rounds of buyers, one table.
    #[command(after_help = DEMO_AFTER)]
    Demo(DemoArgs),
    /// One buyer process of `leasehold demo` (internal).
    #[command(hide = true)]
    DemoBuyer(crate::demo::buyer::BuyerArgs),
    /// Measure leasehold on Redis, etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB against the store's floor (raw Redis
    /// or a private one, etcd's own lock, bare ZooKeeper nodes, advisory locks, GET_LOCK).
    #[command(after_help = BENCH_AFTER)]
    Bench(crate::bench::BenchArgs),
    /// One worker process of `leasehold bench` (internal).
    #[command(hide = true)]
    BenchWorker(crate::bench::worker::WorkerArgs),
    /// The enforcer of `leasehold run` (internal): kills the program when `run` stops renewing its deadline.
    #[command(hide = true)]
    Enforce(crate::enforce::EnforceArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    #[command(after_help = COMPLETIONS_AFTER)]
    Completions(CompletionsArgs),
    /// Print a man page (roff): leasehold(1), or one command's.
    #[command(after_help = MAN_AFTER)]
    Man(ManArgs),
}

impl Command {
    /// Resolves the store of the subcommands that take one (see [`crate::args::StoreArg::resolve`]); the demo's stays unset
    /// without `LEASEHOLD_REDIS_URL` (it then starts a private server).
    fn resolve_store(&mut self) {
        match self {
            Command::Run(args) => args.store.resolve(),
            Command::Status(args) => args.store.resolve(),
            Command::List(args) => args.store.resolve(),
            Command::Observe(args) => args.store.resolve(),
            Command::Release(args) => args.store.resolve(),
            Command::Permits(args) => args.store.resolve(),
            Command::Demo(args) if args.store.is_none() => args.store = older_env(),
            _ => {}
        }
    }
}

/// The whole command line's definition, for `completions` and `man`.
pub fn definition() -> clap::Command {
    Cli::command()
}

/// What parsing the command line decided.
pub enum Parsed {
    /// Go ahead.
    Run(Box<Cli>),
    /// Help or version was printed: exit with this status without doing anything.
    Done(u8),
}

/// Parses the command line. Help and version are printed here; errors become one line and status 2.
pub fn parse<I, T>(args: I) -> Result<Parsed, anyhow::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(mut cli) => {
            if let Command::Run(run) = &mut cli.command {
                run.resolve_shell();
            }
            cli.command.resolve_store();
            Ok(Parsed::Run(Box::new(cli)))
        }
        Err(err) => match err.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                if err.exit_code() == 0 =>
            {
                // Printing help can only fail on a closed stdout, where nobody reads it anyway.
                let _ = err.print();
                Ok(Parsed::Done(0))
            }
            _ => Err(exit::fail(exit::USAGE, usage_line(&err))),
        },
    }
}

/// Clap's error as one line, built from its kind and context (never from its rendered text, whose usage block names
/// every argument): the reason, clap's "did you mean" tip when it has one, and a pointer to `--help`. Values the user
/// typed are cut as lock names are in runtime errors ([`exit::show_name`]), so a 100 KB argument stays one short line.
fn usage_line(err: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::StyledStr(s)) => Some(s.to_string()),
        _ => None,
    };
    let texts = |kind| match err.get(kind) {
        Some(ContextValue::Strings(v)) => v.clone(),
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::StyledStrs(v)) => v.iter().map(ToString::to_string).collect(),
        Some(ContextValue::StyledStr(s)) => vec![s.to_string()],
        _ => Vec::new(),
    };
    let arg = text(ContextKind::InvalidArg).unwrap_or_default();
    let value = text(ContextKind::InvalidValue).map(|v| exit::show_name(&v));
    let mut message = match err.kind() {
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            return format!(
                "a command is required: {} (see leasehold --help)",
                subcommand_names()
            );
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = texts(ContextKind::InvalidArg);
            if missing.iter().any(|m| m.starts_with("<PROGRAM>")) {
                return "a PROGRAM to run is required after NAME, or -c 'SHELL COMMAND' before it \
                        (see leasehold run --help)"
                    .to_owned();
            }
            format!("missing {}", missing.join(", "))
        }
        ErrorKind::InvalidSubcommand => format!(
            "unknown command {}",
            exit::show_name(&text(ContextKind::InvalidSubcommand).unwrap_or_default())
        ),
        ErrorKind::UnknownArgument => format!("unknown option {}", exit::show_name(&arg)),
        ErrorKind::InvalidValue if value.as_deref() == Some("\"\"") => {
            format!("{arg} needs a value")
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            // Our parsers' reasons say what is wrong with the value; clap's own (a number out of range) too.
            let mut message = match std::error::Error::source(err) {
                Some(reason) => format!("{arg}: {}", cut_words(&reason.to_string())),
                None => format!("{arg}: invalid value {}", value.unwrap_or_default()),
            };
            let valid = texts(ContextKind::ValidValue);
            if !valid.is_empty() {
                message.push_str(&format!(" (one of: {})", valid.join(", ")));
            }
            message
        }
        ErrorKind::ArgumentConflict => {
            let prior = texts(ContextKind::PriorArg);
            if prior.is_empty() || prior == [arg.clone()] {
                format!("{arg} cannot be given twice")
            } else {
                format!("{arg} cannot be used with {}", prior.join(", "))
            }
        }
        ErrorKind::TooManyValues => {
            format!("unexpected value {} after {arg}", value.unwrap_or_default())
        }
        ErrorKind::InvalidUtf8 => "an argument is not valid UTF-8".to_owned(),
        other => match other.as_str() {
            Some(kind) if arg.is_empty() => kind.to_owned(),
            Some(kind) => format!("{arg}: {kind}"),
            None => "invalid command line".to_owned(),
        },
    };
    let mut tips = Vec::new();
    for suggested in texts(ContextKind::SuggestedSubcommand)
        .into_iter()
        .chain(texts(ContextKind::SuggestedArg))
        .chain(texts(ContextKind::SuggestedValue))
    {
        tips.push(format!("did you mean {suggested}?"));
    }
    // Clap's other tip ("to pass '--x' as a value, use '-- --x'") is left out: for `run`, a `--` makes it the NAME.
    for tip in tips {
        message.push_str("; ");
        message.push_str(&tip);
    }
    format!("{message} (see leasehold --help)")
}

/// `text` with every word longer than a long lock name cut as [`exit::show_name`] cuts names (a reason may quote
/// the value it refuses, and that value may be 100 KB).
fn cut_words(text: &str) -> String {
    text.split(' ')
        .map(|word| {
            if word.len() <= 80 {
                return word.to_owned();
            }
            let cut: String = word.chars().take(60).collect();
            format!("{cut}…({} bytes)", word.len())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The subcommands a user may type, in the order `--help` lists them: `run, status, …, completions or man`.
fn subcommand_names() -> String {
    use clap::CommandFactory;
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn usage_error(args: &[&str]) -> String {
        match parse(std::iter::once("leasehold").chain(args.iter().copied())) {
            Err(err) => {
                assert_eq!(exit::code_of(&err), exit::USAGE, "{args:?}");
                let line = exit::one_line(&err);
                assert!(!line.contains('\n'));
                line
            }
            Ok(_) => panic!("{args:?} parsed"),
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_program_after_the_double_dash() {
        let Ok(Parsed::Run(cli)) = parse([
            "leasehold",
            "run",
            "--ttl",
            "2s",
            "--wait",
            "1m",
            "jobs",
            "--",
            "sh",
            "-c",
            "exit 3",
        ]) else {
            panic!("did not parse");
        };
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        assert_eq!(run.name, "jobs");
        assert_eq!(run.ttl, Duration::from_secs(2));
        assert_eq!(run.wait, Some(Duration::from_secs(60)));
        assert_eq!(run.command, ["sh", "-c", "exit 3"]);
        assert_eq!(run.conflict_exit_code, 75);
    }

    fn run_args(args: &[&str]) -> RunArgs {
        let Ok(Parsed::Run(cli)) = parse(["leasehold", "run"].iter().chain(args)) else {
            panic!("{args:?} did not parse");
        };
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        run
    }

    #[test]
    fn run_takes_the_program_without_double_dash_and_passes_its_arguments_verbatim() {
        let run = run_args(&["-n", "jobs", "ls", "-la", "--ttl", "1s", "--", "-c", "x"]);
        assert_eq!(run.name, "jobs");
        assert!(run.nonblock);
        assert_eq!(
            run.ttl,
            Duration::from_secs(30),
            "--ttl belongs to the program"
        );
        assert_eq!(run.command, ["ls", "-la", "--ttl", "1s", "--", "-c", "x"]);
        assert_eq!(
            run_args(&["jobs", "--", "ls", "-la"]).command,
            ["ls", "-la"]
        );
        assert_eq!(run_args(&["--", "jobs", "-x"]).command, ["-x"]);
    }

    #[test]
    fn run_command_runs_a_shell_string() {
        let run = run_args(&["-c", "echo $LEASEHOLD_FENCE | tee -a log", "jobs"]);
        assert_eq!(run.name, "jobs");
        assert_eq!(
            run.command,
            ["/bin/sh", "-c", "echo $LEASEHOLD_FENCE | tee -a log"]
        );
        assert_eq!(run.shell, None);
        let run = run_args(&["--command=-x", "jobs"]);
        assert_eq!(run.command, ["/bin/sh", "-c", "-x"]);
    }

    #[test]
    fn usage_errors_are_one_line_with_the_reason() {
        assert_eq!(
            usage_error(&["run", "jobs"]),
            "a PROGRAM to run is required after NAME, or -c 'SHELL COMMAND' before it \
             (see leasehold run --help)"
        );
        assert!(usage_error(&["run", "jobs", "--"]).contains("PROGRAM"));
        assert!(usage_error(&["run", "--", "true"]).contains("PROGRAM"));
        assert!(usage_error(&["run"]).contains("NAME"));
        assert!(usage_error(&["run", "-c", "true"]).contains("NAME"));
        assert!(usage_error(&["run", "-c", "true", "j", "ls"]).contains("cannot be used with"));
        assert!(usage_error(&["run", "", "--", "true"]).contains("empty"));
        assert!(usage_error(&["run", "--ttl", "-5s", "j", "--", "true"]).contains("negative"));
        assert!(usage_error(&["run", "--ttl", "5ms", "j", "--", "true"]).contains("at least"));
        assert!(
            usage_error(&["run", "--nonblock", "--wait", "1s", "j", "--", "true"])
                .contains("cannot be used with")
        );
        assert!(usage_error(&["run", "--bogus", "j", "--", "true"]).contains("--bogus"));
        let long = "x".repeat(leasehold::MAX_NAME_LEN + 1);
        assert!(usage_error(&["status", &long]).contains("limit"));
        usage_error(&[]);
    }
}

//! A distributed lock on Redis (or etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB) that is correct under the failures that break the others: fencing tokens on every
//! grant, a lease kept alive in batches and a loss signal that fires *before* the server-side expiry,
//! event-driven waiting, and cancel-safe acquires.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold::Error> {
//! let locks = leasehold::Client::connect("redis://127.0.0.1:6379").await?;
//!
//! let guard = locks.mutex("orders:42").lock().await?;   // waits; the lease is kept alive
//! println!("fence {}", guard.fence());                   // strictly increasing per lock
//! guard.release().await?;                                 // owner-checked; reports a lost lock
//!
//! // Run work under the lock; the work is dropped the moment the lease is lost.
//! let total = locks.mutex("nightly").run(|lease| async move { 42 }).await?;
//! # Ok(()) }
//! ```
//!
//! leasehold runs on [tokio]: call it from inside a tokio runtime (`#[tokio::main]`, `Runtime::block_on`, a task).
//! Outside one, every fallible call returns [`Error::NoRuntime`] instead of panicking.
//!
//! # Choosing a lock
//!
//! Every handle comes from a [`Client`] ([`Client::mutex`], [`Client::fair_mutex`], [`Client::rw_lock`],
//! [`Client::semaphore`], [`Client::reentrant_mutex`]) and names a lock. Handles are cheap: clone them, or make one
//! per call.
//!
//! | kind | admits | waiting | a grant costs |
//! |---|---|---|---|
//! | [`Mutex`] | one holder | FIFO between clients, FIFO between a client's tasks; direct hand-off | 1 round trip |
//! | [`FairMutex`] | one holder | strict FIFO across every waiting task of every process; direct hand-off | 1 round trip |
//! | [`RwLock`] | many readers or one writer | FIFO; a waiting writer holds back later readers; the readers behind a writer are admitted together; [`WriteGuard::downgrade`] | 1 round trip |
//! | [`Semaphore`] | holders of up to N permits (k at once, atomically) | FIFO; a large request at the head holds back smaller ones | 1 round trip |
//! | [`ReentrantMutex`] | one holder group: its root grant, re-entries through its guard, nested holds by its token | as [`FairMutex`]; a re-entry never waits | 1 round trip; a re-entry in-process none |
//!
//! Every kind keeps the [safety contract](#safety-contract) below: each grant (a read share and a permit too) has its own owner token,
//! fence and lease kept by the keeper, the loss signal fires before the server could grant its capacity to anyone
//! else, a crashed holder frees its share after its lease, and every acquire is cancel safe. The three queued kinds
//! give each waiting task its own place in a queue that Redis keeps: a waiter that gives up leaves it at once, one
//! whose process died is skipped by the next grant (at once on one server, otherwise within its 3 s liveness; a grant
//! handed to it lapses after a 2 s claim). A name is used by one kind: asking for it as another is
//! [`Error::WrongKind`].
//!
//! # Connecting
//!
//! [`Client::connect`] takes a URL: `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS, feature `tls`),
//! `unix:///path`, `redis+cluster://host:port,host:port,…` (a Redis Cluster, by its seed nodes) or
//! `redis+sentinel://host:port,host:port/service` (the primary that the sentinels name), or, with the `etcd`
//! feature, `etcd://host:port,host:port,…` (an etcd cluster), or, with the `zookeeper` feature,
//! `zk://host:port,host:port,…[/chroot]` (a ZooKeeper ensemble), or, with the `postgres` or `mysql` feature,
//! `postgres://user@host/db` or `mysql://user@host/db` (lease tables in that database). [`Client::builder`] sets the lease, timeouts, prefix,
//! replicas and TLS material. A scheme it does not know is [`InvalidArgument::UnknownScheme`], which lists the schemes
//! this build takes, those a feature would add, and the nearest to what was written (`postgress://` → `postgres://`,
//! `http://` as `etcdctl --endpoints` writes it → `etcd://`; tested by
//! `inputs::a_wrong_scheme_lists_every_store_s_schemes_and_names_the_nearest`). A [`Quorum`] takes several clients of independent servers.
//!
//! # What each store can do
//!
//! Every store has every lock kind, waiting, fences, the loss signal and [`Client::inspect`]. What some store cannot
//! do is a [`Capability`]: ask [`Client::supports`] (or list [`Client::capabilities`]) once the client connected,
//! before taking a lock. The operation a capability names is refused with [`Error::Unsupported`] on a store without
//! it, always before anything is taken: the refusal checks the same table the answer comes from (tested on every store
//! by the conformance test `caps::supports_agrees_with_what_the_store_does`). The table is fixed per store, except
//! [`Capability::ReplicasOnDisk`] on Redis, which the client reads from the server when it connects. The README's
//! table of the stores is rendered from the same source.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold::Error> {
//! use leasehold::Capability;
//!
//! let locks = leasehold::Client::connect("postgres://app@db.internal/shop").await?;
//! let many = locks.semaphore("exports", 8);
//! let grant = if locks.supports(Capability::SeveralPermitsAtOnce) {
//!     many.acquire_many(2).await?
//! } else {
//!     many.acquire().await? // one permit per grant on this store
//! };
//! grant.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `tls` | TLS through rustls (ring backend), a private CA and a client identity on the [`Builder`]: `rediss://` (and `rediss+cluster://`, `rediss+sentinel://`), `etcds://` with `etcd`, `sslmode=require` on `postgres://` with `postgres` |
//! | `metrics` | counters and histograms through the [`metrics`](https://docs.rs/metrics) facade (see [Observing](#observing)) |
//! | `serde` | `Serialize`/`Deserialize` for the plain data types: [`LockInfo`], [`Fence`], [`LockKind`], [`LossReason`] and friends |
//! | `etcd` | `etcd://` URLs: every lock in an etcd cluster (see [etcd](#etcd-feature-etcd)); pulls in tonic and prost (gRPC); the code generated from etcd's API is checked in, so the build needs no `protoc` |
//! | `zookeeper` | `zk://` URLs: every lock in a ZooKeeper ensemble (see [ZooKeeper](#zookeeper-feature-zookeeper)); pulls in `zookeeper-client` (pure Rust) |
//! | `postgres` | `postgres://` URLs: every lock in lease tables of a PostgreSQL database, and the fenced transaction (see [PostgreSQL, MySQL and MariaDB](#postgresql-mysql-and-mariadb-features-postgres-mysql)); pulls in `tokio-postgres` |
//! | `mysql` | `mysql://` and `mariadb://` URLs: the same in MySQL or MariaDB; pulls in `mysql_async` |
//!
//! None is on by default. Items that need a feature say so in these docs.
//!
//! # Safety contract
//!
//! What leasehold guarantees, on **one** Redis server (primary), as long as that server neither loses data nor jumps
//! its clock:
//!
//! 1. **Mutual exclusion of grants.** At any instant of the server's clock at most one owner token is stored for a
//!    lock. A grant is one atomic script (`SET … NX`-style with a millisecond expiry), owner tokens are 128 random
//!    bits from the OS per grant, and release, extension and renewal compare the token inside one script: nobody
//!    deletes or extends a lock that is no longer theirs.
//! 2. **The holder knows before anyone else can take over.** Each guard has a conservative validity deadline on
//!    the local lease clock (monotonic, and counting time the machine spent suspended, on Linux): every request
//!    that sets the key's expiry (the acquire, each renewal, each [`extend`](MutexGuard::extend)) is accounted for
//!    *before* it is sent, as if it could run at any later time, until its reply says when it ran; the deadline is
//!    the earliest the key could expire, given every request that may have run last, less a drift allowance (1 % of
//!    the lease + 2 ms). So a request that may *shorten* the key (an extension to less than is left, the watchdog's
//!    renewal after a longer extension) lowers the deadline before it leaves, and a timed-out reply never leaves it
//!    too high. The server cannot expire the key before the deadline, so the loss signal ([`Lease::lost`],
//!    [`Lease::is_held`], [`MutexGuard::run_until_lost`]) fires while no other owner can hold the lock yet. A
//!    release ends the lease *before* its request leaves, so no clone of it reads "held" while the next owner is
//!    granted. Once lost, a lease stays lost: renewal and extension never re-acquire a lapsed lock.
//! 3. **Fences increase.** Every grant returns a [`Fence`] greater than every earlier fence of the same lock, also
//!    after Redis lost the counter or brought back a stale one (a restart from an older snapshot, a replica
//!    promoted before it caught up): each fence is at least the server's time in microseconds.
//! 4. **No orphaned grants.** A crashed holder's lock frees itself after at most one lease; a dropped acquire
//!    future releases a grant that landed anyway; a guard still alive when the program ends normally (`main`
//!    returns) is released when its [`Client`] is dropped, within 1 s. Abnormal exits (`std::process::exit`, a
//!    signal, an abort) leave the lock to lapse after its lease.
//! 5. **A free lock is granted promptly.** A release hands the lock to the oldest live waiter in the same atomic
//!    step (its fence drawn there too), and the waiter starts without another round trip; waiters that died or gave
//!    up are skipped by server time however many there are. A grant message lost to a fault costs a live waiter at
//!    most one heartbeat (1 s); a waiter that died less than its liveness window (3 s) before the release can still
//!    be handed the lock, which then lapses after its claim lease (2 s at most), never a whole lease.
//!
//! The assumptions behind these, stated plainly:
//!
//! - **Clocks.** The server expires keys by its wall clock and floors fences at it. The client measures leases with
//!   its monotonic clock plus suspended time (`CLOCK_BOOTTIME` on Linux; elsewhere a suspension longer than the
//!   lease is not seen until the next renewal). Rates may differ by the drift allowance (1 % of the lease plus
//!   2 ms). A server clock must not **step** by more than that, either way: a step *forward* by `s` (an NTP jump, a
//!   VM restored or migrated, a hand-set date) expires every key `s` early, so for up to `s` less the allowance a
//!   second owner can be granted while the first still reads held; a step *back* can let a fence drawn after a lost
//!   counter fall below earlier ones. Nothing on the client can see either. Keep servers' clocks slewed, not stepped
//!   (chrony without `makestep` after boot, `ntpd -x`), and check the fence where the work lands: it stays ordered
//!   through a forward step. On a [`Quorum`] the same holds per node: a grant held on exactly a majority is exposed
//!   once enough of its nodes step forward to leave the free nodes a majority (one node of three when the third was
//!   not in the grant, two when it was), so independent clocks help only as much as they are independent.
//! - **No eviction.** With `maxmemory` and an `allkeys-*` or `volatile-*` policy, Redis may evict a held lock's key
//!   and grant it again. Use `maxmemory-policy noeviction`; the client warns when it connects
//!   ([`Client::server_warnings`]).
//! - **Failover loses locks.** Redis replication is asynchronous: after a primary fails, a replica may be promoted
//!   without the latest grant, and a second owner can get the lock while the first still believes it holds it.
//!   A restart without persistence does the same, and so does a Sentinel failover while the old primary still takes
//!   writes (until the sentinels demote it). The first owner finds out at its next renewal
//!   ([`LossReason::Gone`] or [`LossReason::Taken`]), not before. [`Builder::replicas`] narrows this (a grant counts
//!   only once replicas acknowledged it, so a primary cut off from its replicas cannot grant); it is not consensus.
//! - **Pauses.** A holder can be paused (GC, `SIGSTOP`, a VM freeze, a page fault storm) at any point, including
//!   between checking [`Lease::is_held`] and writing. No lock service can stop a paused process from sending a
//!   write after it wakes up. **Only a resource that checks the fence is safe against that.**
//!
//! # Redis Cluster and Sentinel
//!
//! The contract above holds per lock on a Redis Cluster (`redis+cluster://h1:p1,h2:p2`) and through Sentinel
//! (`redis+sentinel://s1:p1,s2:p2/service`), with "the server" read as the lock's current primary and the failover
//! assumption above. All keys of a lock share one slot; every cluster call is bounded by the response timeout;
//! wake-ups use a sharded channel in the lock's slot on a cluster; a Sentinel client follows the primary the
//! sentinels name. The measured failure table is in DESIGN.md ("Failover on Redis: what a held lock survives").
//!
//! # etcd (feature `etcd`)
//!
//! [`Client::connect`] with `etcd://[user:password@]host:port[,host:port…]` (or `etcds://` for TLS) puts every lock of the client in an etcd
//! cluster (tested on etcd 3.4). The same API, kinds, guards, fences and loss signal; what differs is where each
//! point of the contract comes from:
//!
//! 1. **Mutual exclusion** is etcd's: each grant is one key under the lock's prefix `PREFIX/NAME/`, written under the
//!    lease of the client's session of its TTL, and a grant is admitted by its kind's rule over the keys created before it (exclusive:
//!    none; shared: only readers; permits of N: fewer than N permits). Every check after a wait is also the
//!    ownership check (its key still has its lease and creation revision), which etcd 3.4's own `Lock` RPC lacks.
//!    etcd is linearizable (Raft): a leader change or the loss of a minority of members loses no grant, unlike a
//!    Redis failover.
//! 2. **The loss signal** fires by the send time of the session's last acknowledged keep-alive plus the session TTL,
//!    less the drift allowance; etcd cannot expire the lease before that. A grant's lease is the session's: each
//!    keep-alive renews every grant of the client at once, and a renewal round that finds a grant's key deleted (a
//!    `release --force`, an `etcdctl del`) ends it as [`LossReason::Gone`].
//! 3. **The fence** is the key's creation revision: global to the cluster, so it grows across every lock (fences of
//!    one lock are not consecutive). It goes back only after a snapshot restore without revision bump.
//! 4. **A crashed holder** frees its locks one lease after its last keep-alive: the lock's [`Mutex::ttl`] rounded up
//!    to whole seconds (etcd's unit; less than 2 s, etcd's shortest lease, is refused), 30 s by default
//!    ([`Builder::session_ttl`] changes the default). The client keeps one session, one etcd lease, per distinct TTL,
//!    opened by the first lock that asks for it; a lost session is replaced by a new one at the next acquisition.
//! 5. **Waiting** watches the key just ahead (the last writer ahead for a reader; the whole prefix for a permit), so
//!    a release wakes one waiter, never a herd; every kind is FIFO by creation revision across all processes.
//!
//! Not on etcd, refused with [`Error::Unsupported`] when asked, before anything is taken, and answered `false` by
//! [`Client::supports`] at start-up (see [What each store can do](#what-each-store-can-do)): fixed leases
//! ([`Mutex::fixed_lease`], [`Mutex::wait_and_hold`]), [`Guard::extend`], several permits in one grant
//! ([`Semaphore::acquire_many`] with more than 1), a stored permit count ([`Semaphore::set_permits`]; each grant's
//! key carries the count it was asked with), [`WriteGuard::downgrade`] (which then releases the write grant before
//! it returns) and nested holds by token ([`ReentrantMutex::lock_as`]). A handle's [`Mutex::ttl`] chooses the session
//! its grants live under; [`Mutex::renew_every`] does not apply (a session is kept alive every third of its TTL).
//! Names do not claim a kind on etcd (no [`Error::WrongKind`]): kinds on one name exclude each other by
//! their rules. `etcdctl lock PREFIX/NAME` (Go's `concurrency.Mutex`) and a lock of any kind called `NAME`
//! exclude each other in both directions (it waits for every older key under `PREFIX/NAME/`). A lock named `a/b` lies inside the range of a lock named `a`, whose waiters count its
//! keys as exclusive: holding `a/b` holds `a` back (never the other way). `etcds://` speaks TLS (feature `tls` too),
//! with the [`Builder`]'s CA and client identity as for `rediss://`.
//!
//! # ZooKeeper (feature `zookeeper`)
//!
//! [`Client::connect`] with `zk://[user:password@]host:port[,host:port…][/chroot]` puts every lock of the client in a
//! ZooKeeper ensemble (tested on ZooKeeper 3.8.0, standalone and three servers). The same API as on etcd, with the
//! same refusals; where each point of the contract comes from:
//!
//! 1. **Mutual exclusion** is ZooKeeper's: each grant is an ephemeral sequential node of the client's session under
//!    the lock's node `/PREFIX/NAME` (under the URL's chroot), admitted by its kind's rule over the nodes ahead of it
//!    in sequence order, as on etcd. ZooKeeper is linearizable for writes (ZAB): a leader change or the loss of a
//!    minority of servers loses no grant. A create whose answer was lost is adopted only when its node belongs to
//!    this session.
//! 2. **The loss signal** fires by the send time of the session's last answered keep-alive (a `sync`, every eighth
//!    of the session timeout) plus five eighths of the negotiated session timeout, less the drift allowance: the
//!    leader hears of a session's activity on a follower only at its next ping, up to half a tick later (a tick is at
//!    most half the session timeout when the ensemble's `minSessionTimeout` is its default of two ticks). ZooKeeper's
//!    `Expired` ends every grant of the session at once, and a grant's node deleted by anyone else (a
//!    `release --force`, a `zkCli delete`) ends it as [`LossReason::Gone`]: at once through a watch on the node, and
//!    at the latest after the next answered keep-alive, which reads every grant's node back.
//! 3. **The fence** is the node's `czxid`: global to the ensemble and growing, never the sequence number (per lock
//!    node, restarted when the node is reaped, 32 bits). It goes back only after a restore of an older snapshot.
//! 4. **A crashed holder** frees its locks one session timeout after its last request. The session timeout asked for
//!    is the lock's [`Mutex::ttl`] (at least 1 s; 30 s by default, [`Builder::session_ttl`] changes the default; one
//!    session per distinct TTL), as the ensemble negotiates it: by default it clamps to 2–20 ticks, the session runs
//!    with the negotiated timeout, its grants' [`Lease::ttl`] is five eighths of it, and a timeout negotiated other
//!    than asked is logged as a warning. [`LockInfo`]'s [`Holder::remaining`] is `None` on ZooKeeper, which does not tell one client how
//!    long another's session has left.
//! 5. **Waiting** watches the node the rule names, so a release wakes one waiter; every kind is FIFO by sequence.
//!
//! Other clients on the path `/PREFIX/NAME` (tested with kazoo: `zookeeper_client` `interop::*`):
//!
//! | recipe | waits for leasehold's holders | leasehold waits for its holders |
//! |---|---|---|
//! | kazoo `Lock`, `WriteLock` | of every kind | every kind |
//! | kazoo `ReadLock` | of every kind (it does not share with a leasehold reader ahead of it) | every kind but a reader |
//! | kazoo `Semaphore` | of every kind (it counts every child as a lease) | **no** |
//! | Curator `InterProcessMutex`, `InterProcessReadWriteLock` | **no** (it sorts leasehold's nodes after its own) | its writers: every kind; its readers: every kind but a reader |
//! | Curator `InterProcessSemaphoreV2` | **no** | **no** |
//!
//! Every leasehold node ends in `__lock__`, the marker kazoo's locks wait for; kazoo reads nothing else of a name, so
//! a leasehold reader is waited for by kazoo's `ReadLock` too rather than let a kazoo `Lock` in beside it. Digest credentials come from the URL; TLS is not supported. [`Guard::zookeeper_write`]
//! commits writes to the ensemble only while the grant's node exists (ZooKeeper's `multi` with a check): the
//! store's own fenced write.
//!
//! # PostgreSQL, MySQL and MariaDB (features `postgres`, `mysql`)
//!
//! [`Client::connect`] with `postgres://user:password@host:port/db` (or `postgresql://`; feature `postgres`) or
//! `mysql://user:password@host:port/db` (or `mariadb://`; feature `mysql`) puts every lock of the client in lease
//! tables of that database, for teams whose only shared store is their database. The same API as on etcd and
//! ZooKeeper, with the same refusals; tested on PostgreSQL 15 and MariaDB 10.11, written for PostgreSQL 12+, MySQL 8.0+
//! and MariaDB 10.6+. Where each point of the contract comes from:
//!
//! 1. **Mutual exclusion** is the database's: every grant and waiter is a row of `PREFIX_entry`, admitted by its kind's
//!    rule over the live rows ahead of it in fence order, as on etcd. A row is live while its client's session row in
//!    `PREFIX_session` has an `expires_at` in the future **on the server's clock** (`now()`, `UTC_TIMESTAMP(6)`): no
//!    statement reads the client's clock. Another client takes over a dead session's locks only by deleting the
//!    session (and its rows), in a statement that re-checks the expiry on the row's newest version, so a renewal that
//!    raced it wins. Every statement is autocommit on the client's own connections, never in a transaction of yours.
//! 2. **The loss signal** fires by the send time of the session's last answered renewal plus the session TTL, less
//!    the drift allowance: the server computes the new expiry from its clock when the renewal starts, after it was
//!    sent. One `UPDATE` of one row per client renews every grant of the client, every quarter of the TTL, and the
//!    same statement reads the client's rows back, so a grant whose row was deleted (`release --force`) ends as
//!    [`LossReason::Gone`].
//! 3. **The fence** is the entry's: from the global sequence `PREFIX_fence` on PostgreSQL, from the lock's row in
//!    `PREFIX_lock` (`LAST_INSERT_ID(fence + 1)`) on MySQL. It is taken under the lock's row lock in the transaction
//!    that inserts the entry, so one lock's fences are issued and committed in order; neither source ever goes back
//!    (lock rows are never deleted). A restore of an older backup, or a failover to an asynchronous replica that had
//!    not received the last grants, can lose grants and fences: the contract asks for synchronous replication or one
//!    primary.
//! 4. **A crashed holder** frees its locks one lease after its last renewal: the lock's [`Mutex::ttl`] (at least 1 s;
//!    30 s by default, [`Builder::session_ttl`] changes the default), the TTL of the session row it lives under (one
//!    per distinct TTL). [`Holder::remaining`] is the holder's session time left, on the server's clock.
//! 5. **Waiting** is FIFO by fence for every kind. On PostgreSQL a release `NOTIFY`s in its own transaction and one
//!    `LISTEN` connection per client wakes the waiters of that lock; a waiter also checks again when the entry it
//!    waits for expires (expiry sends no notification). MySQL has no notification: a waiter blocks on the *bell* of
//!    the entry it waits for, a `GET_LOCK` that entry's client took in the entry's transaction and frees after its
//!    delete; a permit waiter blocks on the oldest entry ahead's bell for its poll interval (on MariaDB; on MySQL,
//!    whose `GET_LOCK` takes whole seconds, it polls), and a waiter behind an entry without a held bell polls, from
//!    5 ms doubling to 50 ms; a release by the same client wakes them at once.
//!
//! The tables are created on first use (`CREATE … IF NOT EXISTS`, on PostgreSQL in one transaction under an advisory
//! lock), so the client's database user needs the right to create tables once; a user without it works on tables an
//! operator created with the statements in DESIGN.md ("The SQL stores"). Lock names are byte strings: `Lock`, `lock`
//! and `LOCK`, `café` and `cafe` are different locks on both (`COLLATE "C"`, `VARBINARY`). The session row is
//! deleted when the client is dropped. On PostgreSQL, `sslmode=require` in the URL (feature `tls` too) carries every
//! connection over TLS, verified against the [`Builder`]'s CA (the system's trust store without one), with its client
//! identity when given; other `sslmode`s stay in the clear. TLS to MySQL is not supported yet. Advisory locks and `GET_LOCK` are not used, since
//! they have no server-side deadline, so no loss signal could fire before the server releases them.
//!
//! ## The fenced transaction
//!
//! A database offers what no other store can: a write of yours committed in the same database as the lock, only
//! while the grant is live. [`Guard::commit_postgres`] and [`Guard::commit_mysql`] take your open transaction (on your
//! own connection, any isolation level), run one check as its last statement, and commit, or roll back and return
//! [`Error::LeaseLost`]. The check finds the grant's entry with its session unexpired on the server's clock *at that
//! moment*, and locks the entry in share mode; a takeover must delete the entry, so it waits for your commit. Your
//! writes therefore never land after another holder was granted, however long your transaction ran, or your process
//! was paused. [`Guard::sql_commit_check`] gives the statement and its parameters for another driver.
//!
//! # A quorum of independent primaries (Redlock)
//!
//! [`Quorum`] holds a lock on a majority of independent Redis primaries, so the failover assumption above becomes
//! one about majorities: the contract holds while a majority of nodes keep their data, and a node that lost its data
//! stays away for longer than the longest lease plus [`PROPOSAL_LEAD`] (the Redlock restart rule). Point 1 holds on
//! every node, and two majorities share a node, so no two owners hold a quorum lock at once (for
//! [`QuorumRwLock`]: no writer beside anyone else). Point 2 holds with the deadline counted from before the round's
//! first request, and renewals and [`QuorumGuard::extend`] count only with a majority. Point 3 holds for sections
//! that exclude each other: the fence is written on a majority while it holds the grant (in the grant itself when
//! the nodes take the round's proposed fence, otherwise by a write-back), and the next grant's majority includes one
//! of those nodes. Point 5 is weaker: a release is announced on every node and wakes the waiters, who then compete
//! in rounds. The argument and its failure table are in DESIGN.md ("Redlock").
//!
//! # Fencing
//!
//! Pass the guard's [`fence`](Lease::fence) with every write to the protected resource, and have the resource reject a write
//! whose fence is lower than the highest it has accepted. Here the resource is a Redis hash written by a script
//! that does the check atomically; a SQL store would do the same with
//! `UPDATE … SET …, fence = $f WHERE id = $id AND fence <= $f`.
//!
//! ```no_run
//! # async fn demo(locks: leasehold::Client, mut store: redis::aio::MultiplexedConnection) -> Result<(), leasehold::Error> {
//! // KEYS[1] the record; ARGV[1] the writer's fence; ARGV[2] the new value.
//! // Returns 1 when written, 0 when a newer fence has written already (the writer is stale).
//! let fenced_write = redis::Script::new(r"
//!     local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
//!     if tonumber(ARGV[1]) < seen then return 0 end
//!     redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'stock', ARGV[2])
//!     return 1
//! ");
//!
//! let guard = locks.mutex("stock:sku-1").lock().await?;
//! let written: i64 = fenced_write
//!     .key("stock:sku-1")
//!     .arg(guard.fence().get())
//!     .arg(99)
//!     .invoke_async(&mut store)
//!     .await?;
//! if written == 0 {
//!     // We were paused past our lease and someone else wrote since: our write was refused, as it must be.
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Fences survive restarts
//!
//! Each grant's fence is the larger of the lock's last fence plus one and the server time in microseconds, drawn in
//! the same script as the grant. A counter that is missing (the first grant, a restart without persistence, its
//! retention ran out, see [`Builder::fence_retention`]) or stale (a restore from an older snapshot, a replica
//! promoted before it caught up) is overtaken by the clock, so new fences exceed the old ones unless the server
//! clock stepped back. Fences are therefore large numbers, not 1, 2, 3; only their order matters.
//!
//! # Waiting
//!
//! Waiters do not poll. A client that finds a lock busy joins the lock's queue in Redis (one entry per client,
//! however many of its tasks wait, holding the token of its latest attempt and a liveness deadline in server time
//! that each attempt renews). The release **hands the lock over** in the same script: the oldest live waiting
//! client's token becomes the owner, with a short claim lease (`min(lease, 2 s)`) and its fence drawn in that step,
//! and the grant is published on that client's own pub/sub channel. The waiter starts at once, without another round
//! trip, and its lease keeper extends the claim to the whole lease right away. Its validity deadline comes from the
//! instant it sent the attempt that stored the token (the grant ran after that attempt, so the claim ends no earlier
//! than that instant plus the claim); a grant whose deadline leaves less than a quarter of the claim is confirmed with
//! one round trip first. Nobody can barge in between a release and the next owner, processes are served in arrival
//! order, and a release costs O(1) acquire attempts however many tasks and processes wait. Inside a process, waiters
//! of one lock queue in FIFO order and only the first contends in Redis. The first waiter also looks again when the
//! holder's lease would end and at least once a second (its heartbeat, which keeps its queue entry alive), so a lost
//! message, a crashed holder or a waiter that died costs at most that (or the claim), never a hang.
//!
//! A wait rides out a Redis restart or outage (connection errors, timeouts, `LOADING` and the like): it logs one
//! warning with target `leasehold::outage` and tries again with backoff until Redis answers or its deadline
//! passes; [`Mutex::fail_fast`] ends it at the first error instead.
//!
//! # Observing
//!
//! - **`tracing`**: an `acquire` span per wait; debug events for grants (lock, hold, fence, lease), busy answers,
//!   waits, releases and renewal batches; a warning for every lost lease (lock, hold, fence, reason) and for a wait
//!   that meets a Redis outage (target `leasehold::outage`). A grant's events go out under its kind's target
//!   (`leasehold::mutex`, `leasehold::fair_mutex`, `leasehold::rw_lock`, `leasehold::semaphore`,
//!   `leasehold::reentrant_mutex`), so a filter such as `leasehold::semaphore=debug` shows one kind; the `hold`
//!   field says what was granted in words (`exclusive`, `read share`, `write lock`, `2 permits`, `nested hold`).
//!   Renewal batches are under `leasehold::keeper`, the quorum's rounds under `leasehold::quorum`.
//! - **`metrics`** (feature `metrics`), through the [`metrics`](https://docs.rs/metrics) facade, so any exporter
//!   (Prometheus, StatsD, ...) picks them up. No label carries the lock name, which would make the series unbounded
//!   for one-lock-per-entity names.
//!
//! | name | kind | what |
//! |---|---|---|
//! | `leasehold_acquisitions_total` | counter | grants |
//! | `leasehold_busy_total` | counter | acquire attempts that found the lock held (a waiting call may count several) |
//! | `leasehold_acquire_timeouts_total` | counter | `lock_timeout` calls whose time ran out |
//! | `leasehold_wait_seconds` | histogram | from an acquire call to its grant |
//! | `leasehold_hold_seconds` | histogram | from a grant to its release or loss |
//! | `leasehold_renewals_total` | counter | leases renewed by the keeper |
//! | `leasehold_renewal_failures_total` | counter | leases whose renewal call failed (retried until the deadline) |
//! | `leasehold_losses_total` | counter, label `reason` = `expired`, `gone` or `taken` | leases lost |
//! - **Holders**: [`Mutex::describe`] attaches a description that [`Client::inspect`] and
//!   [`Client::held_locks`] return.
//!
//! # Keys
//!
//! A lock named `N` uses the key `PREFIX:{N}` (the owner token, with the lease as its expiry), the key
//! `PREFIX:{N}:fence` (the last fence, kept for [`Builder::fence_retention`] from its creation), the list
//! `PREFIX:{N}:queue` (waiting client ids), the hash `PREFIX:{N}:waiters` (per waiting client: its liveness deadline,
//! claim lease and latest token) and the key `PREFIX:{N}:released` (the last release's token, for the rest of its
//! lease, so that a retried release is recognised); see [`lock_keys`]. The braces make `N` the Redis Cluster hash
//! tag. Client `C` hears of grants on the channel `PREFIX:wake:C` (`PREFIX:wake:=C` through Sentinel; on a cluster, a
//! sharded channel per lock, `PREFIX:{N}:wake:C`). The prefix defaults to `leasehold`; names are 1 to [`MAX_NAME_LEN`] bytes and may not start
//! with `}` (Redis Cluster would then hash each key of the lock to its own slot). Redis 6.2 or later is required.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod backend;
mod capability;
mod client;
mod engine;
mod error;
mod fence;
mod kinds;
mod stores_table;

pub use backend::quorum::{
    Quorum, QuorumGuard, QuorumMutex, QuorumRwLock, DEFAULT_NODE_TIMEOUT, MIN_NODES, PROPOSAL_LEAD,
};
pub use backend::redis::checks::ServerWarning;
#[doc(hidden)]
pub use capability::store_supports;
pub use capability::Capability;
pub use client::{
    Builder, Client, HoldMode, Holder, LockInfo, LockKind, DEFAULT_CONNECTION_TIMEOUT,
    DEFAULT_FENCE_RETENTION, DEFAULT_RESPONSE_TIMEOUT,
};
pub use engine::keys::{lock_keys, DEFAULT_PREFIX, MAX_NAME_LEN};
pub use engine::lease::{Lease, LossReason};
pub use engine::ttl::{MAX_TTL, MIN_TTL};

/// The shortest etcd session TTL ([`Builder::session_ttl`]): etcd raises shorter leases to its own minimum.
#[cfg(feature = "etcd")]
pub const MIN_SESSION_TTL: std::time::Duration = backend::etcd::MIN_TTL;

/// A write of [`Guard::zookeeper_write`], committed only while the grant holds.
#[cfg(feature = "zookeeper")]
pub use backend::zookeeper::write::ZkWrite;

/// The etcd session TTL of the locks that set none, unless [`Builder::session_ttl`] sets one: [`DEFAULT_TTL`], the
/// default lease of every store.
#[cfg(feature = "etcd")]
pub const DEFAULT_SESSION_TTL: std::time::Duration = backend::etcd::DEFAULT_TTL;
pub use error::{Error, InvalidArgument};
pub use fence::{Fence, MAX_DESCRIPTION_LEN, MAX_VALUE_LEN};
pub use kinds::election::{
    Election, Leader, Leadership, Observed, Observer, DEFAULT_OBSERVE_EVERY,
};
pub use kinds::fair::FairMutex;
pub use kinds::guard::{Guard, MutexGuard};
pub use kinds::multi::{MultiGuard, MultiLock};
pub use kinds::mutex::{Mutex, DEFAULT_TTL};
pub use kinds::reentrant::{ReentrantGuard, ReentrantMutex, MAX_DEPTH};
pub use kinds::rwlock::{RwLock, WriteGuard};
pub use kinds::semaphore::{Semaphore, MAX_PERMITS};

/// Re-exported so that callers can name the connection and error types without a second `redis` dependency.
pub use redis;

/// Re-exported for [`Guard::commit_postgres`]: the transaction it commits is this crate's.
#[cfg(feature = "postgres")]
pub use tokio_postgres;

/// Re-exported for [`Guard::commit_mysql`]: the transaction it commits is this crate's.
#[cfg(feature = "mysql")]
pub use mysql_async;

/// The statement of [`Guard::sql_commit_check`], for a transaction on a driver of your own.
#[cfg(sql_stores)]
pub use backend::sql::fenced::SqlCommitCheck;

/// Not a public interface, and not stable: the etcd lock recipe below [`Client`]'s etcd store (feature `etcd`), for
/// leasehold's own tests of the recipe.
#[cfg(feature = "etcd")]
#[doc(hidden)]
pub mod __etcd {
    /// leasehold's own etcd client, for the command's bench floor and the tests that talk to etcd directly.
    pub use crate::backend::etcd::rpc;
    pub use crate::backend::etcd::{
        EngineError, EtcdError, Grant, Kind, Released, Session, SessionLoss, SessionOptions,
        DEFAULT_TTL, MAX_PATH_LEN, MIN_TTL,
    };
}

/// Not a public interface: what leasehold's own tests need to replay its scripts by hand.
#[doc(hidden)]
pub mod __private {
    pub use crate::backend::redis::scripts::source as script_source;

    /// How many coalesced calls of one kind a client has out before its requests queue.
    pub const MAX_IN_FLIGHT: usize = crate::backend::redis::batch::MAX_IN_FLIGHT;

    /// The Redis Cluster hash slot of the lock `name`'s keys, as leasehold computes it.
    pub fn slot_of(prefix: &str, name: &str) -> Option<u16> {
        crate::engine::keys::LockKeys::new(prefix, name)
            .ok()
            .map(|keys| keys.slot())
    }

    /// The seed nodes of a `redis+cluster://` (or `rediss+cluster://`) URL, as a client reads them; `None` for any
    /// other URL, or one a client would refuse.
    pub fn cluster_seeds(url: &str) -> Option<Vec<redis::ConnectionInfo>> {
        match crate::backend::redis::topology::Endpoint::parse(url) {
            Ok(crate::backend::redis::topology::Endpoint::Cluster(cluster)) => Some(cluster.seeds),
            _ => None,
        }
    }
}

#[cfg(test)]
mod bounds {
    fn send_sync_static<T: Send + Sync + 'static>() {}

    #[test]
    fn public_handles_are_send_sync_static() {
        send_sync_static::<crate::Client>();
        send_sync_static::<crate::Mutex>();
        send_sync_static::<crate::MutexGuard>();
        send_sync_static::<crate::Lease>();
        send_sync_static::<crate::Error>();
    }
}

//! The grant: enqueue, wait, check, release. Kind-agnostic; a [`Kind`] brings only its admission rule.
//!
//! 1. **Enqueue** (one `Txn`): create the waiter key with the session's lease unless it exists, and range over the
//!    lock's keys in create-revision order. The range sees the put, so it holds the waiter's key (its create revision
//!    is the grant's place in the queue and its fence) and every key ahead of it. When those admit it by the kind's
//!    rule, the grant is made in this one round trip, for every kind.
//! 2. **Wait**: watch the lock's prefix from the member's current revision and follow every delete under it, until the
//!    keys left ahead admit the waiter: it is granted on the watch's word, with no round trip of its own. The watch
//!    also carries every event on the waiter's own key, in revision order, so a grant on its word is the one a check
//!    at that revision would have made. When something was written between the read and the watch's start, the keys
//!    ahead are read again once (a watch from a past revision would be served by etcd's 100 ms catch-up loop).
//! 3. **Check** (one `Txn`), after a wait the watch could not follow to its end (an event on the waiter's own key, a
//!    watch cancelled, broken, or silent for a TTL): if our key still has our lease and our create revision, read the
//!    keys ahead of it and apply the kind's rule. The compare makes every check also the ownership check that etcd
//!    3.4's server-side `Lock` lacks after a wait (etcd#9921): a key whose lease was revoked while it waited is never
//!    granted.
//! 4. **Release** (one `Txn`): delete our key if it still has our lease and create revision, so a stale release
//!    never deletes a successor's key.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{
    self, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};

use super::kind::{key_kind, prefix, waiter_key, waiter_stem};
use super::session::{Session, Shared};
use super::store::Etcd;
use super::{EtcdError, Kind};
use crate::backend::admission::admitted;
use crate::backend::session::recipe;
use crate::backend::session::{random_bytes, SessionLoss, StoreError};
use crate::fence::Fence;

/// A grant: a waiter key that was admitted, with the revision that orders and fences it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a grant holds its lock until it is released or its session ends"]
pub struct Grant {
    key: String,
    revision: i64,
    lease: i64,
    kind: Kind,
    /// Whether the key may be written again once this grant's release deletes it (see [`super::kind::FreeKeys`]).
    reusable: bool,
}

impl Grant {
    /// The fence: the waiter key's create revision. etcd's revision is global to the cluster and only grows, so
    /// fences strictly increase across successive holders of a lock (and of every other lock).
    pub fn fence(&self) -> Fence {
        Fence::new(self.revision.unsigned_abs())
    }

    /// The waiter key's create revision.
    pub(crate) fn revision(&self) -> i64 {
        self.revision
    }

    /// The waiter key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The kind it was granted as.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The lease the key lives under (the session's).
    pub fn lease_id(&self) -> i64 {
        self.lease
    }
}

/// The outcome of [`Session::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The key was ours and is deleted.
    Released,
    /// The key was already gone (its lease ended, or a retried release had deleted it); nothing was deleted.
    AlreadyGone,
}

/// What names an acquisition's waiter key before it is written: the key, and whether the enqueue that wrote it was
/// answered on its first try (then no other try of it can land after the clean-up's delete).
pub(crate) struct Claim {
    key: String,
    settled: bool,
}

/// Draws the acquisition's waiter key under the lock at `path` (refused when `path` is no lock path).
pub(crate) fn claim(session: &Shared, path: &str, kind: Kind) -> Result<Claim, EtcdError> {
    let prefix = prefix(path)?;
    let stem = waiter_stem(&prefix, session.conn.lease, kind);
    let free = session.conn.free_keys().take(&stem);
    let key = match free {
        Some(key) => key,
        None => waiter_key(&stem, grant_id()?),
    };
    Ok(Claim {
        key,
        settled: false,
    })
}

/// Deletes, in the background, the waiter key of an acquisition that ended without a grant (see [`Cleanup`]).
pub(crate) fn abandon(session: &Arc<Shared>, claim: Claim) {
    let cleanup = Cleanup {
        session: Arc::clone(session),
        key: claim.key,
        again: !claim.settled,
    };
    session.background.spawn(cleanup.run());
}

/// Deletes a waiter key nobody will use: at once, and, when a try of the enqueue that wrote it may still be on its
/// way (`again`), once more after two call timeouts unless the session ends first (its keys go with its lease). Past
/// that, the session's lease bounds how long the key can block others: until the session is closed or dropped (which
/// revokes the lease), or its TTL after the process died.
struct Cleanup {
    session: Arc<Shared>,
    key: String,
    again: bool,
}

impl Cleanup {
    async fn run(self) {
        let pause = 2 * self.session.conn.endpoints.call_timeout();
        self.delete(pause / 2).await;
        if !self.again {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => self.delete(pause / 2).await,
            _ = self.session.lost() => {}
        }
    }

    /// One delete of the key if it still lives under the session's lease, tried on each member in turn.
    async fn delete(&self, timeout: Duration) {
        for mut client in self.session.conn.endpoints.clients() {
            let delete = Txn::new()
                .when([Compare::lease(
                    self.key.as_str(),
                    CompareOp::Equal,
                    self.session.conn.lease,
                )])
                .and_then([TxnOp::delete(self.key.as_str(), None)]);
            match tokio::time::timeout(timeout, client.txn(delete)).await {
                Ok(Ok(_)) => return,
                outcome => {
                    tracing::debug!(key = %self.key, ?outcome, "deleting an abandoned etcd waiter key failed")
                }
            }
        }
    }
}

impl Session {
    /// Waits until the lock at `path` admits this session as `kind`, and returns the grant.
    ///
    /// `path` is the etcd prefix of the lock without its trailing `/`: waiters write under `path/`, as
    /// `etcdctl lock path` does, so the two exclude each other.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidPath`]; [`EngineError::SessionLost`] when the session's lease ends first;
    /// [`EngineError::LostWhileWaiting`] when the key was gone when its turn came; [`EtcdError::Timeout`] or
    /// [`EtcdError::Etcd`] when etcd does not answer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (or any error) deletes the waiter key in the background, at once, and once more after two
    /// call timeouts when a retried enqueue may still land (see `Cleanup`); at worst the key stays until the session's
    /// lease ends. [`Session::close`] revokes the lease, which deletes it at once.
    pub async fn acquire(&self, path: &str, kind: Kind) -> Result<Grant, EtcdError> {
        // The engine's recipe, ending at the first error (as the recipe's own tests expect).
        let outage = crate::backend::session::wait::Outage::new(path);
        recipe::acquire::<Etcd>(self.shared(), path, kind, "leasehold", true, true, &outage)
            .await?
            .ok_or(EtcdError::Protocol("a wait that ended without a grant"))
    }

    /// Deletes the grant's key if it is still the grant's (same lease, same create revision).
    ///
    /// # Errors
    ///
    /// [`EtcdError::Timeout`] or [`EtcdError::Etcd`] when etcd does not answer; the key then goes with the lease.
    ///
    /// # Cancel safety
    ///
    /// The delete may or may not have happened; a second release answers [`Released::AlreadyGone`] if it did.
    pub async fn release(&self, grant: Grant) -> Result<Released, EtcdError> {
        release(self.shared(), &grant).await
    }

    /// Whether the grant's key still exists with its lease and create revision: the ownership check, asked alone.
    ///
    /// # Errors
    ///
    /// [`EtcdError::Timeout`] or [`EtcdError::Etcd`] when etcd does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_owner(&self, grant: &Grant) -> Result<bool, EtcdError> {
        let (key, revision, lease) = (grant.key.as_str(), grant.revision, grant.lease);
        let response = self
            .shared()
            .conn
            .endpoints
            .call("ownership check", |mut c| {
                let txn = Txn::new().when(owned(key, lease, revision));
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(response.succeeded())
    }
}

/// The keys ahead of a waiter, oldest first, each with its kind, and the revision they are known at.
pub(crate) type KeysAhead = (Vec<(Kind, Vec<u8>)>, i64);

/// An acquisition's waiter key, written: the grant it will be once admitted, and the keys ahead of it as its last
/// round trip or watch left them, for the next check to use instead of reading them again.
pub(crate) struct Waiter {
    pub(crate) grant: Grant,
    fresh: std::sync::Mutex<Option<KeysAhead>>,
}

impl Waiter {
    fn new(grant: Grant, fresh: Option<KeysAhead>) -> Waiter {
        Waiter {
            grant,
            fresh: std::sync::Mutex::new(fresh),
        }
    }

    /// Leaves the keys ahead, known at a revision, for the next check.
    fn keep(&self, ahead: KeysAhead) {
        *self.fresh.lock().unwrap_or_else(|e| e.into_inner()) = Some(ahead);
    }

    /// What the last round trip or watch left, once.
    fn take(&self) -> Option<KeysAhead> {
        self.fresh.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Writes the claimed waiter key under the lock at `path`, storing `value` (the hold, so that `inspect` can name the
/// holder), and reads the keys ahead of it in the same transaction: the waiter, and whether those admit it at once
/// (by the kind's rule: then the grant takes this one round trip, for every kind).
pub(crate) async fn enqueue_claimed(
    session: &Shared,
    path: &str,
    kind: Kind,
    value: &str,
    claim: &mut Claim,
) -> Result<(Waiter, bool), EtcdError> {
    let prefix = prefix(path)?;
    let (revision, ahead, tries) = enqueue(session, &prefix, &claim.key, value).await?;
    claim.settled = tries == 1;
    let grant = Grant {
        key: claim.key.clone(),
        revision,
        lease: session.conn.lease,
        kind,
        reusable: claim.settled,
    };
    let first = admitted(kind, &ahead.0);
    Ok((Waiter::new(grant, (!first).then_some(ahead)), first))
}

/// Deletes the grant's key if it is still the grant's (same lease, same create revision).
pub(crate) async fn release(session: &Shared, grant: &Grant) -> Result<Released, EtcdError> {
    let (key, revision, lease) = (grant.key.as_str(), grant.revision, grant.lease);
    let response = session
        .conn
        .endpoints
        .call("release", |mut c| {
            let txn = Txn::new()
                .when(owned(key, lease, revision))
                .and_then([TxnOp::delete(key, None::<DeleteOptions>)]);
            async move { c.txn(txn).await }
        })
        .await?;
    Ok(if response.succeeded() {
        if grant.reusable {
            session.conn.free_keys().put(grant.key.clone());
        }
        Released::Released
    } else {
        Released::AlreadyGone
    })
}

/// Writes `hold` as the grant's key's value if the key is still the grant's (same lease, same create revision): true
/// when it was. The key keeps its create revision, so the grant's fence and its place are unchanged (etcd's own
/// `Proclaim` guards its put the same way).
pub(crate) async fn rewrite(
    session: &Shared,
    grant: &Grant,
    hold: &str,
) -> Result<bool, EtcdError> {
    let (key, revision, lease) = (grant.key.as_str(), grant.revision, grant.lease);
    let response = session
        .conn
        .endpoints
        .call("proclaim", |mut c| {
            let txn = Txn::new()
                .when(owned(key, lease, revision))
                .and_then([TxnOp::put(
                    key,
                    hold,
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            async move { c.txn(txn).await }
        })
        .await?;
    Ok(response.succeeded())
}

/// Counts the grant's term of an election (see [`Primitives::begin_term`](crate::backend::session::Primitives)): one
/// transaction that puts the count at `record` one higher and the grant's key's value `hold` and the count, if the
/// key is still the grant's and the count is still the one read. A count moved by a transaction whose answer was
/// lost (the call sent again) is found by the key already holding `hold` and that count.
pub(crate) async fn begin_term(
    session: &Shared,
    grant: &Grant,
    record: &str,
    hold: &str,
) -> Result<Option<u64>, EtcdError> {
    let (key, revision, lease) = (grant.key.as_str(), grant.revision, grant.lease);
    let endpoints = &session.conn.endpoints;
    for _ in 0..TERM_TRIES {
        let read = endpoints
            .call(
                "count a term",
                |mut c| async move { c.get(record, None).await },
            )
            .await?;
        let (count, counted) = match read.kvs().first() {
            Some(kv) => (parse_count(kv.value())?, kv.mod_revision()),
            None => (0, 0),
        };
        let term = count + 1;
        let response = endpoints
            .call("count a term", |mut c| {
                let mut compares = owned(key, lease, revision).to_vec();
                compares.push(Compare::mod_revision(record, CompareOp::Equal, counted));
                let txn = Txn::new()
                    .when(compares)
                    .and_then([
                        TxnOp::put(record, term.to_string(), None),
                        TxnOp::put(
                            key,
                            format!("{hold}{term}"),
                            Some(PutOptions::new().with_lease(lease)),
                        ),
                    ])
                    .or_else([TxnOp::get(key, None)]);
                async move { c.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            return Ok(Some(term));
        }
        let mine = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(mut read) => Some(read.take_kvs()),
            _ => None,
        });
        let Some(kv) = mine.and_then(|kvs| kvs.into_iter().next()) else {
            return Ok(None);
        };
        if kv.create_revision() != revision || kv.lease() != lease {
            return Ok(None);
        }
        // Still the grant's: the count moved. By this grant's own transaction, sent again?
        if let Some(counted) = kv.value().strip_prefix(hold.as_bytes()) {
            if let Ok(term) = parse_count(counted) {
                if term > 0 {
                    return Ok(Some(term));
                }
            }
        }
    }
    Err(EtcdError::Protocol(
        "counting a term: the count kept changing under a grant that holds the lock",
    ))
}

/// How many times [`begin_term`] reads the count and tries its transaction.
const TERM_TRIES: usize = 4;

/// A term count as etcd stores it: decimal digits.
pub(crate) fn parse_count(value: &[u8]) -> Result<u64, EtcdError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or(EtcdError::Protocol("a term count that is not a number"))
}

/// 64 random bits from the OS: the grant's id, unique among the grants of a session.
fn grant_id() -> Result<u64, EtcdError> {
    Ok(u64::from_le_bytes(random_bytes()?))
}

/// The compare that says a key is still this grant's.
fn owned(key: &str, lease: i64, revision: i64) -> [Compare; 2] {
    [
        Compare::lease(key, CompareOp::Equal, lease),
        Compare::create_revision(key, CompareOp::Equal, revision),
    ]
}

/// Writes the waiter key unless it exists (a retry finds its own key), and returns its create revision, the keys ahead
/// of it (see [`KeysAhead`]) and how many tries the write took.
///
/// One transaction: the put, then one range of the lock's keys in create-revision order. A range after a put in the
/// same transaction sees the put (etcd applies a transaction's operations in order, on one view), so the range holds
/// the waiter's own key, with its create revision and lease, and every key ahead of it; none can be added ahead later,
/// as a key's create revision is the revision that created it.
async fn enqueue(
    session: &Shared,
    prefix: &str,
    key: &str,
    value: &str,
) -> Result<(i64, KeysAhead, u32), EtcdError> {
    let lease = session.conn.lease;
    let mut tries = 0;
    let response = session
        .conn
        .endpoints
        .call("enqueue", |mut c| {
            tries += 1;
            let keys = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_keys_only();
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
                    TxnOp::get(prefix, Some(keys.clone())),
                ])
                .or_else([TxnOp::get(prefix, Some(keys))]);
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| lease_gone_is_loss(e, session))?;
    let seen = revision(&response, "enqueue")?;
    let ranges = ranges(&response, "enqueue")?;
    let [keys] = ranges.as_slice() else {
        return Err(EtcdError::Protocol("enqueue"));
    };
    let mine = keys
        .iter()
        .find(|kv| kv.key() == key.as_bytes())
        .ok_or(EtcdError::Protocol("enqueue"))?;
    if mine.lease() != lease {
        return Err(EtcdError::lost_while_waiting(key.to_owned()));
    }
    let revision = mine.create_revision();
    let ahead = keys
        .iter()
        .take_while(|kv| kv.create_revision() < revision)
        .map(|kv| (key_kind(prefix, kv.key()), kv.key().to_vec()))
        .collect();
    Ok((revision, (ahead, seen), tries))
}

/// The revision a transaction was answered at.
fn revision(response: &TxnResponse, op: &'static str) -> Result<i64, EtcdError> {
    response
        .header()
        .map(|h| h.revision())
        .ok_or(EtcdError::Protocol(op))
}

/// A put under a lease etcd no longer has fails with "requested lease not found": the session is lost.
fn lease_gone_is_loss(e: EtcdError, session: &Shared) -> EtcdError {
    match &e {
        EtcdError::Etcd {
            source: rpc::Error::GRpcStatus(status),
            ..
        } if status.message().contains("lease not found") => {
            EtcdError::session_lost(session.loss().unwrap_or(SessionLoss::Ended))
        }
        _ => e,
    }
}

/// If the waiter's key is still its own, the keys ahead of it (see [`KeysAhead`]): those its enqueue or its last wait left
/// (known then to be its own), or else read now.
pub(crate) async fn ahead(
    session: &Shared,
    path: &str,
    waiter: &Waiter,
) -> Result<KeysAhead, EtcdError> {
    if let Some(fresh) = waiter.take() {
        return Ok(fresh);
    }
    read_ahead(session, path, &waiter.grant).await
}

/// If the grant's key is still its own, reads the keys ahead of it (see [`KeysAhead`]).
async fn read_ahead(session: &Shared, path: &str, grant: &Grant) -> Result<KeysAhead, EtcdError> {
    let prefix = prefix(path)?;
    let prefix = prefix.as_str();
    let (key, revision, lease) = (grant.key.as_str(), grant.revision, grant.lease);
    let response = session
        .conn
        .endpoints
        .call("admission check", |mut c| {
            let ahead = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(revision - 1)
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_keys_only();
            let txn = Txn::new()
                .when(owned(key, lease, revision))
                .and_then([TxnOp::get(prefix, Some(ahead))]);
            async move { c.txn(txn).await }
        })
        .await?;
    if !response.succeeded() {
        session.check_alive()?;
        return Err(EtcdError::lost_while_waiting(key.to_owned()));
    }
    let seen = self::revision(&response, "admission check")?;
    let ranges = ranges(&response, "admission check")?;
    let [ahead] = ranges.as_slice() else {
        return Err(EtcdError::Protocol("admission check"));
    };
    let ahead = ahead
        .iter()
        .map(|kv| (key_kind(prefix, kv.key()), kv.key().to_vec()))
        .collect();
    Ok((ahead, seen))
}

/// The key-values of every range response of a transaction, in order.
fn ranges(response: &TxnResponse, op: &'static str) -> Result<Vec<Vec<rpc::KeyValue>>, EtcdError> {
    response
        .op_responses()
        .into_iter()
        .filter(|r| !matches!(r, TxnOpResponse::Put(_)))
        .map(|r| match r {
            TxnOpResponse::Get(mut get) => Ok(get.take_kvs()),
            _ => Err(EtcdError::Protocol(op)),
        })
        .collect()
}

/// Waits until the keys ahead of the waiter, read at revision `seen`, have gone enough to admit it by its kind's rule,
/// and leaves them for the check after the wait (which then needs no round trip); or until anything the watch cannot
/// follow happens, after which the check reads them again.
///
/// One watch on the lock's prefix follows every delete under it, so the waiter knows which keys ahead are left at each
/// revision, and every event on its own key: the delete that admits it is heard with everything before it, its own
/// key's delete or overwrite (a `release --force`, its lease ended) included. So a grant on the watch's word is the
/// one the check would have made at that revision, ownership check included (etcd#9921); an event on its own key ends
/// the wait and the check decides.
///
/// The watch starts at the member's current revision, not at `seen + 1`: a watch that starts at a revision the member
/// has passed is served by etcd's catch-up loop, which runs every 100 ms, where a current one hears of a delete at
/// once. What happened between `seen` and the watch's start is covered by reading the keys ahead again once it is
/// open, when anything was written in between. A watch that cannot be opened, is cancelled, breaks, or hears nothing
/// for one TTL (a member that died without a word) ends the wait without leaving anything: the check reads again.
pub(crate) async fn wait(
    session: &Shared,
    path: &str,
    waiter: &Waiter,
    ahead: &[(Kind, Vec<u8>)],
    seen: i64,
) -> Result<(), EtcdError> {
    let grant = &waiter.grant;
    let watched = prefix(path)?;
    let (i, mut client) = session.conn.endpoints.current();
    let opened = async {
        let options = WatchOptions::new().with_prefix();
        let mut stream = client.watch(watched, Some(options)).await?;
        // The first answer says the watch exists, and the revision it starts after.
        let created = stream.message().await?;
        Ok::<_, rpc::Error>((
            stream,
            created.and_then(|c| c.header().map(|h| h.revision())),
        ))
    };
    let mut ahead = ahead.to_vec();
    let mut stream = match tokio::time::timeout(session.conn.endpoints.call_timeout(), opened).await
    {
        Ok(Ok((stream, Some(from)))) => {
            if from > seen {
                // Writes came between the read and the watch: one of them may be the delete we wait for.
                let (again, at) = read_ahead(session, path, grant).await?;
                if admitted(grant.kind, &again) {
                    waiter.keep((again, at));
                    return Ok(());
                }
                ahead = again;
            }
            stream
        }
        _ => {
            session.conn.endpoints.failed(i);
            // Check again (through the call's own retries) after a short pause, rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Ok(());
        }
    };
    let mine = grant.key.as_bytes();
    let followed = async {
        loop {
            let response = match stream.message().await {
                Ok(Some(response)) if !response.canceled() => response,
                Ok(Some(_)) => return None,
                Ok(None) | Err(_) => {
                    session.conn.endpoints.failed(i);
                    return None;
                }
            };
            let before = ahead.len();
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                if kv.key() == mine {
                    return None;
                }
                if event.event_type() == rpc::EventType::Delete {
                    ahead.retain(|(_, key)| key.as_slice() != kv.key());
                }
            }
            if ahead.len() < before && admitted(grant.kind, &ahead) {
                return response.header().map(|h| h.revision());
            }
        }
    };
    if let Ok(Some(at)) = tokio::time::timeout(session.ttl, followed).await {
        waiter.keep((ahead, at));
    }
    Ok(())
}

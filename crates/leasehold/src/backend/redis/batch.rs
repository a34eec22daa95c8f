//! Coalesced requests: the acquire attempts (and, apart, the releases) that tasks of one client make at the same
//! moment travel as one script call covering many locks, instead of one call each.
//!
//! Opportunistic, never a delay: a request is sent at once, alone, while fewer than [`MAX_IN_FLIGHT`] calls of its
//! kind are out. Only when that many are out does it queue, and when one of them returns, whatever queued meanwhile
//! goes out as one call (up to [`MAX_BATCH`] locks; on a Redis Cluster, one call per hash slot, and the calls of one
//! node in one pipeline). So a lone request costs exactly what it did, and under load the calls grow instead of their number.
//!
//! Each lock's outcome is its own (the scripts answer per lock), and so is its cancel safety: a request whose caller
//! went away while it queued is never sent; one whose caller went away while its call was out is settled by
//! [`Item::orphaned`] (a grant that landed is released), after the call returned, so the undoing runs after what it
//! undoes. The outcome travels back with its item, so that a caller that goes away just as its outcome is sent (on
//! another thread) settles it itself ([`Answer`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::RedisError;
use tokio::sync::oneshot;

use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::scripts::{Numbers, ScriptCall};
use crate::backend::redis::store::RedisStore;

/// How many calls of one kind may be out at once before requests queue. Fewer make bigger calls (less server work
/// per lock) but keep Redis and the client waiting on each other; 8 gave the most throughput in `leasehold bench`'s
/// uncontended-64 (2, 8, 16 and 64 compared in alternating runs; see DESIGN.md, "Coalesced requests").
pub(crate) const MAX_IN_FLIGHT: usize = 8;

/// The most locks one coalesced call carries.
pub(crate) const MAX_BATCH: usize = 64;

/// A request that failed as a whole: the Redis error, and whether it may have reached the server (`false` only when
/// the connection was refused, so that nothing was sent).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) err: RedisError,
    pub(crate) reached: bool,
}

/// One lock's request of some kind (an acquire attempt, a release).
pub(crate) trait Item: Send + Sync + Sized + 'static {
    /// One lock's answer, as the script gave it.
    type Outcome: Send + 'static;

    /// The client's coalescer for this kind.
    fn coalescer(inner: &RedisStore) -> &Coalescer<Self>;

    /// The Redis Cluster hash slot of the lock: one script call covers one slot.
    fn slot(&self) -> u16;

    /// The script call for `items`, all of one slot (idempotent per token: it may be sent again after a dropped
    /// connection or a moved slot).
    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall;

    /// The replica acknowledgements a call must wait for.
    fn acks(inner: &RedisStore) -> Option<ReplicaAcks>;

    /// One outcome per item, in order, from what the call of `items` returned.
    fn outcomes(
        items: &[Self],
        sent: Sent<Numbers>,
        inner: &RedisStore,
    ) -> Result<Vec<Self::Outcome>, Failure>;

    /// Settles a request whose caller went away while its call was out: `outcome` is what the server answered, or
    /// `None` when that is unknown (the call failed after it may have run).
    fn orphaned(self, inner: &Arc<RedisStore>, outcome: Option<Self::Outcome>);
}

/// Sends `items` (sorted by slot when calls must keep to one) as one script call per slot: one call in all on one
/// server; on a cluster, a pipeline per node ([`crate::backend::redis::conn::Conn::invoke_by_node`]). One result per item, in order.
async fn call<T: Item>(inner: &RedisStore, items: &[T]) -> Vec<Result<T::Outcome, Failure>> {
    let by_slot = T::coalescer(inner).by_slot;
    let one_slot = !by_slot || items.first().map(T::slot) == items.last().map(T::slot);
    if one_slot {
        let sent = inner
            .conn
            .invoke_acked(&T::script(inner, items), T::acks(inner))
            .await;
        return each(T::outcomes(items, sent, inner), items.len());
    }
    let mut runs = Vec::new();
    let mut start = 0;
    for end in 1..=items.len() {
        if end == items.len() || items[end].slot() != items[start].slot() {
            runs.push(start..end);
            start = end;
        }
    }
    let calls: Vec<(u16, ScriptCall)> = runs
        .iter()
        .map(|run| {
            (
                items[run.start].slot(),
                T::script(inner, &items[run.clone()]),
            )
        })
        .collect();
    let sent = inner.conn.invoke_by_node(&calls, T::acks(inner)).await;
    let mut results = Vec::with_capacity(items.len());
    for (run, sent) in runs.into_iter().zip(sent) {
        let len = run.len();
        results.extend(each(T::outcomes(&items[run], sent, inner), len));
    }
    results
}

/// [`call`] for one item: the path of every lone request, without the vectors of a batch.
async fn call_one<T: Item>(inner: &RedisStore, item: &T) -> Result<T::Outcome, Failure> {
    let items = std::slice::from_ref(item);
    let sent = inner
        .conn
        .invoke_acked(&T::script(inner, items), T::acks(inner))
        .await;
    let mut outcomes = T::outcomes(items, sent, inner)?;
    match (outcomes.pop(), outcomes.is_empty()) {
        (Some(outcome), true) => Ok(outcome),
        _ => Err(wrong_length()),
    }
}

/// The failure of a call that answered for another number of locks than it carried.
fn wrong_length() -> Failure {
    Failure {
        err: RedisError::from((
            redis::ErrorKind::Parse,
            "a coalesced reply of the wrong length",
        )),
        reached: true,
    }
}

/// A call's outcomes as one result per item: a failed call (or one that answered for the wrong number of locks)
/// fails each of its items.
fn each<O>(outcomes: Result<Vec<O>, Failure>, len: usize) -> Vec<Result<O, Failure>> {
    let failure = match outcomes {
        Ok(outcomes) if outcomes.len() == len => return outcomes.into_iter().map(Ok).collect(),
        Ok(_) => wrong_length(),
        Err(failure) => failure,
    };
    (0..len)
        .map(|_| {
            Err(Failure {
                err: failure.err.clone(),
                reached: failure.reached,
            })
        })
        .collect()
}

/// Where a queued request's outcome goes: back to its caller, with the item, so that a caller that stops listening
/// after the outcome was sent (its future dropped on another thread at that very moment) still settles it.
type Reply<T> = oneshot::Sender<(T, Result<<T as Item>::Outcome, Failure>)>;

/// Hands `item`'s outcome to its caller, or settles it when the caller went away.
fn deliver<T: Item>(
    inner: &Arc<RedisStore>,
    item: T,
    reply: Reply<T>,
    result: Result<T::Outcome, Failure>,
) {
    if let Err((item, result)) = reply.send((item, result)) {
        settle_orphan(inner, item, result);
    }
}

/// Settles the outcome of a request whose caller went away: a grant is released, and so is whatever a request that
/// may have reached the server may have granted.
fn settle_orphan<T: Item>(inner: &Arc<RedisStore>, item: T, result: Result<T::Outcome, Failure>) {
    match result {
        Ok(outcome) => item.orphaned(inner, Some(outcome)),
        Err(failure) if failure.reached => item.orphaned(inner, None),
        Err(_) => {}
    }
}

/// The caller's end of a queued request. Dropped (its future cancelled), it stops the reply and settles an outcome
/// that was sent before that: a grant sent a moment before the caller went away is never left unreleased.
struct Answer<'a, T: Item> {
    inner: &'a Arc<RedisStore>,
    rx: oneshot::Receiver<(T, Result<T::Outcome, Failure>)>,
}

impl<T: Item> Drop for Answer<'_, T> {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok((item, result)) = self.rx.try_recv() {
            settle_orphan(self.inner, item, result);
        }
    }
}

/// The requests of one kind for one client.
pub(crate) struct Coalescer<T: Item> {
    state: Mutex<State<T>>,
    /// Whether calls must stay within one hash slot (Redis Cluster).
    by_slot: bool,
}

struct State<T: Item> {
    in_flight: usize,
    queue: VecDeque<(T, Reply<T>)>,
}

impl<T: Item> Coalescer<T> {
    pub(crate) fn new(by_slot: bool) -> Coalescer<T> {
        Coalescer {
            state: Mutex::new(State {
                in_flight: 0,
                queue: VecDeque::new(),
            }),
            by_slot,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call ended (its slot is free): the requests that queued meanwhile, as the next call (the slot passes to
    /// it), or `None` and the slot is released.
    fn next_batch(&self) -> Option<(Vec<T>, Vec<Reply<T>>)> {
        let mut batch = {
            let mut state = self.lock();
            let mut batch = Vec::new();
            while batch.len() < MAX_BATCH {
                let Some((item, reply)) = state.queue.pop_front() else {
                    break;
                };
                if !reply.is_closed() {
                    batch.push((item, reply)); // else its caller went away before it was sent: nothing to undo
                }
            }
            if batch.is_empty() {
                state.in_flight -= 1;
                return None;
            }
            batch
        };
        if self.by_slot {
            // One script call per slot, and one pipeline per node for them all (see `call`).
            batch.sort_by_key(|(item, _)| item.slot());
        }
        Some(batch.into_iter().unzip())
    }
}

/// Runs `item` in a call: its own, at once, or a coalesced one with the requests that queued with it.
///
/// Cancel safe: dropped before its call left, the request is never sent; dropped while it was out, its outcome goes to
/// [`Item::orphaned`].
pub(crate) async fn run<T: Item>(inner: &Arc<RedisStore>, item: T) -> Result<T::Outcome, Failure> {
    let mut item = Some(item);
    let answer = {
        let mut state = T::coalescer(inner).lock();
        if state.in_flight < MAX_IN_FLIGHT {
            state.in_flight += 1;
            None
        } else {
            let (reply, answer) = oneshot::channel();
            if let Some(item) = item.take() {
                state.queue.push_back((item, reply));
            }
            Some(answer)
        }
    };
    if let Some(rx) = answer {
        let mut answer = Answer { inner, rx };
        return match (&mut answer.rx).await {
            Ok((_, result)) => result,
            Err(_) => Err(abandoned()),
        };
    }
    // Our own call, alone. Whatever ends it (a reply, or this future dropped), the slot passes on.
    let mut lead = Lead { inner, item };
    let result = match &lead.item {
        Some(item) => call_one(inner, item).await,
        None => Err(abandoned()),
    };
    lead.item = None;
    result
}

/// The failure of a request whose call was dropped unfinished (its runtime shut down): its outcome is unknown.
fn abandoned() -> Failure {
    Failure {
        err: RedisError::from((redis::ErrorKind::Io, "request abandoned")),
        reached: true,
    }
}

/// The caller's own call. Dropped (its future cancelled, or done), it passes the slot on to the queued requests; an
/// item still here was in a call whose outcome nobody will read.
struct Lead<'a, T: Item> {
    inner: &'a Arc<RedisStore>,
    item: Option<T>,
}

impl<T: Item> Drop for Lead<'_, T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            item.orphaned(self.inner, None);
        }
        flush::<T>(self.inner);
    }
}

/// Sends what queued, in calls of its own (a task), until nothing is left; then frees the slot.
fn flush<T: Item>(inner: &Arc<RedisStore>) {
    let Some(batch) = T::coalescer(inner).next_batch() else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to send them on (it is shutting down): their callers get "abandoned" (senders dropped).
        T::coalescer(inner).lock().in_flight -= 1;
        return;
    };
    let inner = Arc::clone(inner);
    runtime.spawn(async move {
        let mut next = Some(batch);
        while let Some((items, replies)) = next {
            let mut out = InCall {
                inner: &inner,
                items,
                replies,
                done: false,
            };
            let results = call(&inner, &out.items).await;
            out.done = true;
            let items = std::mem::take(&mut out.items);
            let replies = std::mem::take(&mut out.replies);
            settle(&inner, items, replies, results);
            next = T::coalescer(&inner).next_batch();
        }
    });
}

/// A coalesced call in progress. Dropped unfinished (its runtime shut down), it tells its callers the outcome is
/// unknown, and settles the requests of callers that went away.
struct InCall<'a, T: Item> {
    inner: &'a Arc<RedisStore>,
    items: Vec<T>,
    replies: Vec<Reply<T>>,
    done: bool,
}

impl<T: Item> Drop for InCall<'_, T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let items = std::mem::take(&mut self.items);
        let replies = std::mem::take(&mut self.replies);
        for (item, reply) in items.into_iter().zip(replies) {
            deliver(self.inner, item, reply, Err(abandoned()));
        }
    }
}

/// Hands each caller its outcome; the outcomes of callers that went away are settled by their item.
fn settle<T: Item>(
    inner: &Arc<RedisStore>,
    items: Vec<T>,
    replies: Vec<Reply<T>>,
    results: Vec<Result<T::Outcome, Failure>>,
) {
    let mut results = results.into_iter();
    for (item, reply) in items.into_iter().zip(replies) {
        let result = results.next().unwrap_or_else(|| Err(abandoned()));
        deliver(inner, item, reply, result);
    }
}

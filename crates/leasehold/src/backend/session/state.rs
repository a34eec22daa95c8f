//! What a session keeps: its deadline and loss, the grants that follow it (`SessionState`), and the clean-ups left to
//! the background (`Background`).
//!
//! A grant's [`LeaseShared`] follows its session: every keep-alive is registered with it before it leaves
//! ([`SessionState::begin_round`], as the Redis keeper registers a renewal) and confirmed when answered, so the
//! deadline arithmetic and the loss timers are the Redis leases'. A lost session ends every following lease at once.
//!
//! A keep-alive renews the session, not each grant's entry, which anyone may delete (`release --force`, `etcdctl
//! del`, `zkCli delete`, a `DELETE`) while the session lives on. So after each answered keep-alive the engine reads
//! the entries of the grants it renewed ([`SessionState::check_entries`], or the store's answer itself when it carries
//! them), and a grant whose entry is gone or not its own any more ends as [`LossReason::Gone`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::engine::clock;
use crate::engine::lease::{LeaseShared, LossReason, Request};

/// What the session's keeper last established.
#[derive(Debug, Clone, Copy)]
struct State<L> {
    deadline: Instant,
    /// The send time and number of the last answered keep-alive (the session's opening is number 0).
    acked: (Instant, i64),
    lost: Option<L>,
}

/// A session's deadline and loss (`L`: why a session is lost, as its store says it), and the grants that follow it,
/// each with what its store keeps of it (`F`: etcd keeps the key and revision it reads back; ZooKeeper nothing).
pub(crate) struct SessionState<L, F> {
    state: watch::Sender<State<L>>,
    followers: std::sync::Mutex<Vec<(Weak<LeaseShared>, F)>>,
    /// What a passed deadline reads as.
    expired: L,
    /// Whether an entry check ([`SessionState::check_entries`]) is running.
    checking: Arc<AtomicBool>,
}

/// The most entries one read of [`SessionState::check_entries`] carries (etcd's default `--max-txn-ops` is 128;
/// ZooKeeper's multi-read has no count limit, but its packet must fit `jute.maxbuffer`, 1 MB by default).
pub(crate) const CHECK_BATCH: usize = 100;

/// Clears the running flag when an entry check ends, however it ends.
struct CheckDone(Arc<AtomicBool>);

impl Drop for CheckDone {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<L, F> SessionState<L, F>
where
    L: Copy + PartialEq + Send + Sync + 'static,
    F: Clone,
{
    /// A session opened by a request sent at `sent`, whose deadline is `deadline`; `expired` is the loss a passed
    /// deadline reads as.
    pub(crate) fn new(sent: Instant, deadline: Instant, expired: L) -> Self {
        SessionState {
            state: watch::Sender::new(State {
                deadline,
                acked: (sent, 0),
                lost: None,
            }),
            followers: std::sync::Mutex::new(Vec::new()),
            expired,
            checking: Arc::default(),
        }
    }

    fn followers(&self) -> std::sync::MutexGuard<'_, Vec<(Weak<LeaseShared>, F)>> {
        self.followers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the session lost (the first reason sticks: true when this was it), and ends the lease of every grant
    /// that follows it as `ends_as`.
    pub(crate) fn lose(&self, reason: L, ends_as: LossReason) -> bool {
        let first = self.state.send_if_modified(|state| {
            let first = state.lost.is_none();
            if first {
                state.lost = Some(reason);
            }
            first
        });
        let followers = std::mem::take(&mut *self.followers());
        for (lease, _) in followers {
            if let Some(lease) = lease.upgrade() {
                lease.end(ends_as);
            }
        }
        first
    }

    /// Records the keep-alive sent at `sent`, number `round`, as answered: moves the deadline to `deadline` if that
    /// is later, unless the session is already lost.
    pub(crate) fn extend(&self, sent: Instant, round: i64, deadline: Instant) {
        self.state.send_if_modified(|state| {
            let later = state.lost.is_none() && deadline > state.deadline;
            if later {
                state.deadline = deadline;
                state.acked = (sent, round);
            }
            later
        });
    }

    /// The send time and number of the last answered keep-alive: where a new grant's lease starts from (creating
    /// its entry renews nothing).
    pub(crate) fn acked(&self) -> (Instant, i64) {
        self.state.borrow().acked
    }

    /// The local deadline.
    pub(crate) fn deadline(&self) -> Instant {
        self.state.borrow().deadline
    }

    /// The loss recorded so far, not counting a passed deadline.
    pub(crate) fn recorded_loss(&self) -> Option<L> {
        self.state.borrow().lost
    }

    /// How many grants follow the session.
    pub(crate) fn following(&self) -> usize {
        self.followers().len()
    }

    /// Makes `lease` follow the session, keeping `what` with it. False (and the lease ended) when the session is
    /// already lost.
    pub(crate) fn follow(&self, lease: &Arc<LeaseShared>, what: F) -> bool {
        self.followers().push((Arc::downgrade(lease), what));
        // Checked after registering: a loss after this point ends the lease through `lose`.
        if self.loss().is_some() {
            lease.end(LossReason::Expired);
            return false;
        }
        true
    }

    /// Registers the keep-alive about to be sent (renewing `ttl`) with every following grant still held; drops the
    /// others.
    pub(crate) fn begin_round(&self, ttl: Duration) -> Vec<(Arc<LeaseShared>, Request, F)> {
        let mut begun = Vec::new();
        self.followers().retain(|(follower, what)| {
            let Some(lease) = follower.upgrade() else {
                return false;
            };
            match lease.begin(ttl) {
                Some(request) => {
                    begun.push((lease, request, what.clone()));
                    true
                }
                None => false,
            }
        });
        begun
    }

    /// The second check, after an answered keep-alive: reads what the store keeps of each grant in `begun` (the
    /// round's grants) in batches of [`CHECK_BATCH`], all batches at once, and ends as [`LossReason::Gone`] the lease
    /// of each grant whose entry `read` finds gone or not its own. `read` answers a batch with one verdict per entry,
    /// in order (true: still the grant's), or `None` when it got no answer: the keep-alives decide meanwhile, and the
    /// next round reads again.
    ///
    /// Runs in the background, off the keep-alive loop (with thousands of grants the reads take a while, and the next
    /// keep-alive must not wait for them), one check at a time: a round that finds one running skips its own.
    pub(crate) fn check_entries<R, Fut>(&self, begun: &[(Arc<LeaseShared>, Request, F)], read: R)
    where
        F: std::fmt::Debug + Send + Sync + 'static,
        R: Fn(Vec<F>) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Vec<bool>>> + Send,
    {
        if begun.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let done = CheckDone(Arc::clone(&self.checking));
        let grants: Vec<(Weak<LeaseShared>, F)> = begun
            .iter()
            .map(|(lease, _, what)| (Arc::downgrade(lease), what.clone()))
            .collect();
        runtime.spawn(async move {
            let reads = grants.chunks(CHECK_BATCH).map(|chunk| {
                let entries = chunk.iter().map(|(_, what)| what.clone()).collect();
                let answer = read(entries);
                async move { (chunk, answer.await) }
            });
            for (chunk, answer) in futures_util::future::join_all(reads).await {
                let Some(verdicts) = answer else { continue };
                for ((lease, what), ours) in chunk.iter().zip(verdicts) {
                    if let (false, Some(lease)) = (ours, lease.upgrade()) {
                        if lease.end(LossReason::Gone) {
                            tracing::debug!(entry = ?what, "a grant's entry is gone");
                        }
                    }
                }
            }
            drop(done);
        });
    }

    /// Why the session is lost, or `None` while it holds (its deadline not passed, no loss recorded).
    pub(crate) fn loss(&self) -> Option<L> {
        let state = *self.state.borrow();
        state
            .lost
            .or((clock::now() >= state.deadline).then_some(self.expired))
    }

    /// Resolves when the session is lost: on the keeper's word, or when the deadline passes, whichever is first,
    /// even if the keeper is stuck.
    pub(crate) async fn lost(&self) -> L {
        let mut rx = self.state.subscribe();
        loop {
            let state = *rx.borrow_and_update();
            if let Some(reason) = state.lost {
                return reason;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    // The sender lives in `self`, so this is not reached; treat it as loss all the same.
                    return self.expired;
                },
                () = passed(state.deadline) => return self.expired,
            }
        }
    }
}

impl<L: std::fmt::Debug + Copy, F> std::fmt::Debug for SessionState<L, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = *self.state.borrow();
        f.debug_struct("SessionState")
            .field("deadline", &state.deadline)
            .field("lost", &state.lost)
            .finish_non_exhaustive()
    }
}

/// Resolves once the lease clock reaches `at`, however long the machine was suspended meanwhile.
pub(crate) async fn passed(at: Instant) {
    while clock::now() < at {
        tokio::time::sleep_until(clock::timer_for(at)).await;
    }
}

/// The clean-ups running in the background, for [`Client::flush_releases`](crate::Client) and
/// [`Client::close`](crate::Client::close): the releases of dropped guards, and the deletes of the entries of abandoned
/// acquisitions (a waiter that gave up, or whose future was dropped).
#[derive(Debug, Default)]
pub(crate) struct Background {
    running: AtomicUsize,
    idle: Notify,
}

impl Background {
    /// Runs `release` (a release, or the clean-up of an abandoned acquisition) in the background, counted until it
    /// ends; without a runtime it is not run (the entry then goes with its session).
    pub(crate) fn spawn(self: &Arc<Self>, release: impl Future<Output = ()> + Send + 'static) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.running.fetch_add(1, Ordering::AcqRel);
        let background = Arc::clone(self);
        runtime.spawn(async move {
            release.await;
            if background.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                background.idle.notify_waiters();
            }
        });
    }

    /// Waits until every background release has ended.
    pub(crate) async fn settle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

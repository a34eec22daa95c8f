//! What `inspect` and `held_locks` share on the stores with sessions: a lock's admitted entries made into its
//! [`LockInfo`](crate::LockInfo), and the held locks among a list of names.

use std::future::Future;
use std::time::Duration;

use crate::engine::info::LockInfo;

/// One admitted entry of a lock on a store with sessions, as `inspect` reads it.
pub(crate) struct Admitted {
    /// The entry's value: the hold as Redis stores it (`dl1:…`, `r dl1:…`, `s1 dl1:…`), or whatever another client
    /// wrote.
    pub(crate) value: String,
    /// The entry's own name: what names a holder leasehold did not write.
    pub(crate) entry: String,
    pub(crate) kind: crate::backend::admission::Kind,
    pub(crate) fence: crate::Fence,
    /// The time left on its holder's session, when the store says.
    pub(crate) remaining: Option<Duration>,
}

/// The [`LockInfo`](crate::LockInfo) of lock `name` on a store with sessions: its `admitted` entries, in queue order,
/// of `entries` in all.
pub(crate) fn lock_info(name: &str, admitted: Vec<Admitted>, entries: usize) -> LockInfo {
    use crate::backend::admission::Kind;
    use crate::engine::info::{HoldMode, Holder, LockKind};
    let mut holders = Vec::new();
    let mut last_fence = None;
    let mut permits = None;
    // A bare token is a mutex's hold; `x dl1:…` a fair mutex's (both are exclusive entries).
    let mut exclusive_is_mutex = true;
    for entry in admitted {
        if holders.is_empty() {
            exclusive_is_mutex = !entry.value.starts_with("x ");
        }
        // The hold's token without its kind's tag, as Redis reports it (`r dl1:…` is the token `dl1:…`).
        let (token, mode, value, term) = if entry.value.contains(crate::fence::TOKEN_PREFIX) {
            let token = crate::fence::token_of(&entry.value).to_owned();
            let value = crate::fence::value_of(&token).map(str::to_owned);
            let term = crate::fence::term_of(&token);
            (token, HoldMode::of(&entry.value), value, term)
        } else {
            // An entry leasehold did not write (`etcdctl lock`'s, kazoo's): named by itself; what it stores is its
            // value (an `etcdctl elect` proposal, a kazoo `Election`'s identifier).
            let mode = match entry.kind {
                Kind::Shared => HoldMode::Read,
                _ => HoldMode::Exclusive,
            };
            let value = Some(entry.value.clone()).filter(|v| !v.is_empty());
            (entry.entry, mode, value, None)
        };
        if let Kind::Permits(n) = entry.kind {
            permits = Some(u64::from(n.get()));
        }
        last_fence = last_fence.max(Some(entry.fence));
        holders.push(Holder {
            description: crate::fence::description_of(&token).map(str::to_owned),
            value,
            term,
            token,
            mode,
            remaining: entry.remaining,
        });
    }
    let kind = holders.first().map(|holder| match holder.mode {
        HoldMode::Exclusive if exclusive_is_mutex => LockKind::Mutex,
        mode => mode.kind(),
    });
    LockInfo {
        name: name.to_owned(),
        kind,
        holder: holders.first().cloned(),
        waiting_clients: (entries - holders.len()) as u64,
        holders,
        last_fence,
        permits,
    }
}

/// The held locks among `names` that match the glob `pattern`, sorted by name, each read by `inspect`: a chunk of
/// names at once, as on Redis (one round of round trips per chunk, not per lock); free locks are left out.
pub(crate) async fn held_among<F, Fut>(
    mut names: Vec<String>,
    pattern: &str,
    inspect: F,
) -> Result<Vec<LockInfo>, crate::Error>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<LockInfo, crate::Error>>,
{
    names.retain(|name| crate::backend::glob_match(pattern.as_bytes(), name.as_bytes()));
    names.sort();
    names.dedup();
    let mut held = Vec::new();
    for chunk in names.chunks(crate::backend::HELD_LOCKS_CHUNK) {
        let infos = futures_util::future::join_all(chunk.iter().cloned().map(&inspect)).await;
        for info in infos {
            let info = info?;
            if info.holder.is_some() {
                held.push(info);
            }
        }
    }
    Ok(held)
}

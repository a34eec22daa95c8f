//! `leasehold status`, `list`, `release --force` and `permits`, on one server or cluster (Redis, etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB):
//! look at a lock, or remove a stuck one. The first three on a quorum of Redis servers are in `status/quorum.rs`.

pub mod quorum;

use serde_json::{json, Value};
use unicode_width::UnicodeWidthStr as _;

use crate::args::{ListArgs, ObserveArgs, PermitsArgs, ReleaseArgs, StatusArgs};
use crate::connect;
use crate::duration::show;
use crate::exit::{self, fail};

/// Runs `leasehold status`: prints the lock's state and exits 0 whether it is free or held.
///
/// # Errors
///
/// 69 when the store cannot be asked, 65 when the key is not a leasehold lock.
pub async fn status(args: StatusArgs) -> anyhow::Result<u8> {
    crate::stores::check_store(&args.store)?;
    if args.store.urls.len() > 1 {
        return quorum::status(&args).await;
    }
    let client = connect::reader(&args.store).await?;
    connect::closing(&client, async {
        let info = crate::etcd::holders_as_on_redis(client.inspect(&args.name).await?);
        let warnings: Vec<String> = client
            .server_warnings()
            .iter()
            .map(ToString::to_string)
            .collect();
        for warning in &warnings {
            exit::print_err(&format!("leasehold: warning: {warning}"));
        }
        let text = if args.json {
            let mut object = to_json(&info);
            object["warnings"] = json!(warnings);
            object.to_string()
        } else {
            sentence(&info)
        };
        print_line(&text);
        Ok(0)
    })
    .await
}

/// The sentence `status` prints for one server's view of a lock.
pub(crate) fn sentence(info: &leasehold::LockInfo) -> String {
    let fence = info.last_fence.map(leasehold::Fence::get);
    {
        let fence_text = fence.map_or("unknown".to_owned(), |f| f.to_string());
        let queued = !matches!(info.kind, None | Some(leasehold::LockKind::Mutex));
        let mut text = match &info.holder {
            Some(_) if queued => {
                let kind = info.kind.map_or(String::new(), |k| k.to_string());
                let n = info.holders.len();
                let capacity = info
                    .permits
                    .map_or(String::new(), |p| format!(" of {p} permits"));
                let mut text = format!(
                    "{:?} is a {kind}{capacity} held by {n} holder{} (last fence {fence_text})",
                    info.name,
                    if n == 1 { "" } else { "s" }
                );
                for holder in &info.holders {
                    let (left, by) = left_and_by(holder);
                    text.push_str(&format!(
                        "\n  {}{by}: {left}, token {}",
                        holder.mode,
                        token_id(&holder.token)
                    ));
                }
                text
            }
            Some(holder) => {
                let (left, by) = left_and_by(holder);
                let value = holder
                    .value
                    .as_ref()
                    .map_or(String::new(), |v| format!(", value {v:?}"));
                let value = match holder.term {
                    Some(term) => format!("{value}, term {term}"),
                    None => value,
                };
                format!(
                    "{:?} is held{by}: fence {fence_text}{value}, {left}, token {}",
                    info.name,
                    token_id(&holder.token)
                )
            }
            None => match fence {
                Some(fence) => format!("{:?} is free (last fence {fence})", info.name),
                None => format!("{:?} is free (no fence on record)", info.name),
            },
        };
        let waiters = if queued { "task" } else { "client" };
        match info.waiting_clients {
            0 => {}
            1 => text.push_str(&format!("; 1 {waiters} waiting")),
            n => text.push_str(&format!("; {n} {waiters}s waiting")),
        }
        text
    }
}

/// A holder's remaining lease ("29s left") and who it is (" by …", or nothing), for the sentences of `status`.
fn left_and_by(holder: &leasehold::Holder) -> (String, String) {
    let left = holder
        .remaining
        // ZooKeeper does not tell one client how long another's session has left.
        .map_or("no expiry reported".to_owned(), |r| {
            format!("{} left", show(r))
        });
    let by = holder
        .description
        .as_ref()
        .map_or(String::new(), |d| format!(" by {d}"));
    (left, by)
}

/// Runs `leasehold observe`: the election's leader at once, then a line per change, until SIGINT or SIGTERM (0).
///
/// # Errors
///
/// 69 when the store cannot be reached at start, 65 when the key is not a leasehold lock.
pub async fn observe(args: ObserveArgs) -> anyhow::Result<u8> {
    crate::stores::check_store(&args.store)?;
    if args.store.urls.len() > 1 {
        return Err(fail(
            exit::USAGE,
            "observe takes one store: a quorum has no elections",
        ));
    }
    let mut signals = crate::signals::Signals::catch()?;
    let client = tokio::select! {
        client = connect::reader(&args.store) => client?,
        _ = signals.recv() => return Ok(0),
    };
    connect::closing(&client, async {
        let election = client.election(&args.name).observe_every(args.every);
        let mut observer = election.observe();
        loop {
            let observed = tokio::select! {
                observed = observer.next() => observed?,
                _ = signals.recv() => return Ok(0),
            };
            let line = match &observed {
                leasehold::Observed::Leader(leader) if args.json => {
                    leader_json(&args.name, Some(leader)).to_string()
                }
                leasehold::Observed::Leader(leader) => leader_sentence(&args.name, leader),
                leasehold::Observed::Missed { terms } if args.json => {
                    json!({"name": args.name, "missed": terms}).to_string()
                }
                leasehold::Observed::Missed { terms: Some(terms) } => {
                    format!("{:?}: {terms} term(s) began and ended unseen", args.name)
                }
                leasehold::Observed::Missed { terms: None } => format!(
                    "{:?}: the store lost its count of terms; some may have passed unseen",
                    args.name
                ),
                _ if args.json => leader_json(&args.name, None).to_string(),
                _ => format!("{:?} has no leader", args.name),
            };
            print_line(&line);
        }
    })
    .await
}

/// One line of `observe`: who leads, with what value and fence.
fn leader_sentence(name: &str, leader: &leasehold::Leader) -> String {
    let by = leader
        .description
        .as_ref()
        .map_or(String::new(), |d| format!(" by {d}"));
    let value = leader
        .value
        .as_ref()
        .map_or("no value".to_owned(), |v| format!("value {v:?}"));
    let fence = leader
        .fence
        .map_or("unknown".to_owned(), |f| f.get().to_string());
    let term = leader.term.map_or(String::new(), |t| format!(", term {t}"));
    format!("{name:?} is led{by}: {value}, fence {fence}{term}")
}

/// One JSON line of `observe --json`.
fn leader_json(name: &str, leader: Option<&leasehold::Leader>) -> Value {
    let description = leader.and_then(|l| l.description.as_deref());
    json!({
        "name": name,
        "leader": leader.is_some(),
        "fence": leader.and_then(|l| l.fence).map(leasehold::Fence::get),
        "term": leader.and_then(|l| l.term),
        "value": leader.and_then(|l| l.value.as_deref()),
        "token": leader.map(|l| l.token.as_str()),
        "description": description,
        "holder": description.and_then(crate::holder::fields),
    })
}

/// Runs `leasehold list`: the held locks matching the pattern, as a table or a JSON array.
///
/// # Errors
///
/// 69 when the store cannot be asked.
pub async fn list(args: ListArgs) -> anyhow::Result<u8> {
    crate::stores::check_store(&args.store)?;
    if args.store.urls.len() > 1 {
        return quorum::list(&args).await;
    }
    let client = connect::reader(&args.store).await?;
    connect::closing(&client, async {
        let held: Vec<leasehold::LockInfo> = client
            .held_locks(&args.pattern)
            .await?
            .into_iter()
            .map(crate::etcd::holders_as_on_redis)
            .collect();
        if args.json {
            let all: Vec<Value> = held.iter().map(to_json).collect();
            print_line(&Value::Array(all).to_string());
            return Ok(0);
        }
        if held.is_empty() {
            print_line(&format!("no held locks match {:?}", args.pattern));
            return Ok(0);
        }
        exit::print_out(&table(&held));
        Ok(0)
    })
    .await
}

/// The table `list` prints: one line per lock, columns aligned as a terminal shows them.
pub(crate) fn table(held: &[leasehold::LockInfo]) -> String {
    let rows: Vec<[String; 7]> = held
        .iter()
        .map(|info| {
            let holder = info.holder.as_ref();
            let more = match info.holders.len() {
                0 | 1 => String::new(),
                n => format!(" (+{} more)", n - 1),
            };
            [
                escape(&info.name),
                info.kind.map_or("-".to_owned(), kind_word),
                info.permits.map_or("-".to_owned(), |p| p.to_string()),
                info.last_fence.map_or("-".to_owned(), |f| f.to_string()),
                holder
                    .and_then(|h| h.remaining)
                    .map_or("-".to_owned(), show),
                info.waiting_clients.to_string(),
                holder
                    .and_then(|h| h.description.as_deref())
                    .map_or_else(|| "-".to_owned(), escape)
                    + &holder
                        .and_then(|h| h.value.as_deref())
                        .map_or(String::new(), |v| format!(" (value {})", escape(v)))
                    + &more,
            ]
        })
        .collect();
    let header = [
        "NAME", "KIND", "PERMITS", "FENCE", "LEFT", "WAITING", "HOLDER",
    ]
    .map(str::to_owned);
    // Columns as the terminal shows them: a CJK character takes two, a combining mark none.
    let mut widths = [0usize; 6];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.width());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter().zip(row) {
            out.push_str(cell);
            out.push_str(&" ".repeat(width - cell.width() + 2));
        }
        out.push_str(&row[6]);
        out.push('\n');
    }
    out
}

/// `text` for one table cell: control characters (a newline, an escape sequence that would recolour or move the
/// terminal's cursor) written as Rust escapes (`\n`, `\u{1b}`), so that every lock is one line and shows what its
/// name really holds.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The JSON object of one lock, as `status --json` prints it (without the server warnings).
pub(crate) fn to_json(info: &leasehold::LockInfo) -> Value {
    let holder = info.holder.as_ref();
    let description = holder.and_then(|h| h.description.as_deref());
    json!({
        "name": info.name,
        "state": if holder.is_some() { "held" } else { "free" },
        "remaining_ms": holder.and_then(|h| h.remaining).map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
        "fence": info.last_fence.map(leasehold::Fence::get),
        "token": holder.map(|h| h.token.as_str()),
        "description": description,
        "value": holder.and_then(|h| h.value.as_deref()),
        "term": holder.and_then(|h| h.term),
        "holder": description.and_then(crate::holder::fields),
        "waiting_clients": info.waiting_clients,
        "kind": info.kind.map(kind_word),
        "permits": info.permits,
        "holders": info.holders.iter().map(|h| json!({
            "mode": h.mode.to_string(),
            "remaining_ms": h.remaining.map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
            "token": h.token,
            "description": h.description,
            "value": h.value,
            "term": h.term,
            "holder": h.description.as_deref().and_then(crate::holder::fields),
        })).collect::<Vec<_>>(),
    })
}

/// One word for a lock kind, for tables and JSON.
fn kind_word(kind: leasehold::LockKind) -> String {
    match kind {
        leasehold::LockKind::Mutex => "mutex",
        leasehold::LockKind::Fair => "fair",
        leasehold::LockKind::ReadWrite => "rw",
        leasehold::LockKind::Semaphore => "semaphore",
        leasehold::LockKind::Reentrant => "reentrant",
        _ => "other",
    }
    .to_owned()
}

/// The random part of an owner token, without the description after it.
pub(crate) fn token_id(token: &str) -> &str {
    token.split_once(' ').map_or(token, |(id, _)| id)
}

/// Runs `leasehold release --force`: deletes the lock whoever holds it and says what it removed.
///
/// # Errors
///
/// 2 without `--force`, 69 when the store cannot be asked, 65 when the key is not a leasehold lock.
pub async fn release(args: ReleaseArgs) -> anyhow::Result<u8> {
    crate::stores::check_store(&args.store)?;
    if args.store.urls.len() > 1 && args.force {
        return quorum::release(&args).await;
    }
    if !args.force {
        return Err(fail(
            exit::USAGE,
            format!(
                "release removes lock {:?} whoever holds it; add --force to do so",
                args.name
            ),
        ));
    }
    let client = connect::locks(&args.store, None).await?;
    connect::closing(&client, async {
        // Read first only to say more about what goes; the removal itself does not depend on it.
        let before = crate::etcd::holders_as_on_redis(client.inspect(&args.name).await?);
        let removed = client.force_release(&args.name).await?;
        let text = match removed {
            Some(token) => {
                let token = crate::etcd::token_as_on_redis(&token);
                let same = before.holder.as_ref().is_some_and(|h| h.token == token);
                let fence = before
                    .last_fence
                    .filter(|_| same)
                    .map_or(String::new(), |f| format!(" (fence {f})"));
                let by = before
                    .holder
                    .as_ref()
                    .filter(|_| same)
                    .and_then(|h| h.description.as_ref())
                    .map_or(String::new(), |d| format!(", held by {d}"));
                format!(
                    "removed lock {:?}: token {}{fence}{by}; its holder loses the lock at its next renewal",
                    args.name,
                    token_id(token)
                )
            }
            None => format!("lock {:?} was free; nothing removed", args.name),
        };
        print_line(&text);
        Ok(0)
    })
    .await
}

/// Runs `leasehold permits`: stores a new permit count in a semaphore in use and says what it replaced.
///
/// # Errors
///
/// 65 when NAME is another kind of lock (or not a lock), 69 when Redis cannot be asked.
pub async fn permits(args: PermitsArgs) -> anyhow::Result<u8> {
    crate::stores::check_permits(&args.store)?;
    let client = connect::locks(&args.store, None).await?;
    connect::closing(&client, async {
        let previous = client
            .semaphore(&args.name, args.permits)
            .set_permits()
            .await?;
        let text = if args.json {
            json!({ "name": args.name, "permits": args.permits, "previous": previous }).to_string()
        } else {
            match previous {
                Some(before) => format!(
                    "semaphore {:?} now has {} permits (it had {before})",
                    args.name, args.permits
                ),
                None => format!(
                    "semaphore {:?} is free: nothing stored, the next run's --permits is its count",
                    args.name
                ),
            }
        };
        print_line(&text);
        Ok(0)
    })
    .await
}

pub(crate) fn print_line(text: &str) {
    exit::print_out(&format!("{text}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_id_is_the_part_before_the_description() {
        assert_eq!(token_id("dl1:ab host=x pid=1"), "dl1:ab");
        assert_eq!(token_id("dl1:ab"), "dl1:ab");
    }
}

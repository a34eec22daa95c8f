//! `leasehold status` and `leasehold release --force`: look at a lock, or remove a stuck one.

use serde_json::json;

use crate::cli::{ReleaseArgs, StatusArgs};
use crate::connect;
use crate::duration::show;
use crate::exit::{self, fail};

/// Runs `leasehold status`: prints the lock's state and exits 0 whether it is free or held.
///
/// # Errors
///
/// 69 when Redis cannot be asked, 65 when the key is not a leasehold lock.
pub async fn status(args: StatusArgs) -> anyhow::Result<u8> {
    let client = connect::locks(&args.redis, None).await?;
    let info = client.inspect(&args.name).await?;
    let fence = info.last_fence.map(leasehold::Fence::get);
    let warnings: Vec<String> = client
        .server_warnings()
        .iter()
        .map(ToString::to_string)
        .collect();
    for warning in &warnings {
        exit::print_err(&format!("leasehold: warning: {warning}"));
    }
    let text = if args.json {
        let holder = info.holder.as_ref();
        json!({
            "name": info.name,
            "state": if holder.is_some() { "held" } else { "free" },
            "remaining_ms": holder.and_then(|h| h.remaining).map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
            "fence": fence,
            "token": holder.map(|h| h.token.as_str()),
            "waiting_clients": info.waiting_clients,
            "warnings": warnings,
        })
        .to_string()
    } else {
        let fence_text = fence.map_or("unknown".to_owned(), |f| f.to_string());
        let mut text = match &info.holder {
            Some(holder) => {
                let left = holder
                    .remaining
                    .map_or("no expiry".to_owned(), |r| format!("{} left", show(r)));
                format!(
                    "{:?} is held: fence {fence_text}, {left}, token {}",
                    info.name, holder.token
                )
            }
            None if info.reserved => format!(
                "{:?} is free, being handed to the waiting client it woke (last fence {fence_text})",
                info.name
            ),
            None => match fence {
                Some(fence) => format!("{:?} is free (last fence {fence})", info.name),
                None => format!("{:?} is free (no fence on record)", info.name),
            },
        };
        match info.waiting_clients {
            0 => {}
            1 => text.push_str("; 1 client waiting"),
            n => text.push_str(&format!("; {n} clients waiting")),
        }
        text
    };
    print_line(&text);
    Ok(0)
}

/// Runs `leasehold release --force`: deletes the lock whoever holds it and says what it removed.
///
/// # Errors
///
/// 2 without `--force`, 69 when Redis cannot be asked, 65 when the key is not a leasehold lock.
pub async fn release(args: ReleaseArgs) -> anyhow::Result<u8> {
    if !args.force {
        return Err(fail(
            exit::USAGE,
            format!(
                "release removes lock {:?} whoever holds it; add --force to do so",
                args.name
            ),
        ));
    }
    let client = connect::locks(&args.redis, None).await?;
    // Read first only to say more about what goes; the removal itself does not depend on it.
    let before = client.inspect(&args.name).await?;
    let removed = client.force_release(&args.name).await?;
    let text = match removed {
        Some(token) => {
            let same = before.holder.as_ref().is_some_and(|h| h.token == token);
            let fence = before
                .last_fence
                .filter(|_| same)
                .map_or(String::new(), |f| format!(" (fence {f})"));
            format!(
                "removed lock {:?}: token {token}{fence}; its holder loses the lock at its next renewal",
                args.name
            )
        }
        None => format!("lock {:?} was free; nothing removed", args.name),
    };
    print_line(&text);
    Ok(0)
}

fn print_line(text: &str) {
    exit::print_out(&format!("{text}\n"));
}

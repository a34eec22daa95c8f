//! `status`, `list` and `release --force` on a quorum (`--store` given 3 or more times): every node is asked on its
//! own, and a lock counts as held on the quorum when a majority of the nodes names the same holder.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{print_line, sentence, table, to_json, token_id};
use crate::args::{ListArgs, ReleaseArgs, StatusArgs, StoreArg};
use crate::connect;
use crate::exit;

/// One node's answer: its URL (password hidden) and what it said, or why it could not be asked.
type View<T> = (String, anyhow::Result<T>);

/// Asks every node of `redis` with `ask`, all at once.
async fn ask_nodes<T, F, Fut>(store: &StoreArg, ask: F) -> Vec<View<T>>
where
    F: Fn(leasehold::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, leasehold::Error>>,
{
    futures_util::future::join_all(store.urls.iter().map(|url| {
        let ask = &ask;
        async move {
            let node = StoreArg {
                urls: vec![url.clone()],
                ..store.clone()
            };
            let answer = match connect::locks(&node, None).await {
                Ok(client) => ask(client).await.map_err(anyhow::Error::from),
                Err(err) => Err(err),
            };
            (connect::redact(url), answer)
        }
    }))
    .await
}

/// The holders (their token ids) that at least `majority` of the nodes' views of one lock name, sorted.
fn majority_tokens<'a>(
    infos: impl Iterator<Item = &'a leasehold::LockInfo>,
    majority: usize,
) -> Vec<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for info in infos {
        for holder in &info.holders {
            *counts.entry(token_id(&holder.token)).or_default() += 1;
        }
    }
    let mut held: Vec<String> = counts
        .into_iter()
        .filter(|&(_, n)| n >= majority)
        .map(|(token, _)| token.to_owned())
        .collect();
    held.sort();
    held
}

/// The holder a majority of nodes names for `name` (the first, for shared locks), with its description: for the
/// conflict line of `run` on a quorum. `None` when no majority names one or the nodes cannot be asked.
pub async fn majority_holder(
    redis: &StoreArg,
    name: &str,
    majority: usize,
) -> Option<leasehold::Holder> {
    let views = ask_nodes(redis, |client| async move { client.inspect(name).await }).await;
    let infos: Vec<&leasehold::LockInfo> = views
        .iter()
        .filter_map(|(_, info)| info.as_ref().ok())
        .collect();
    let token = majority_tokens(infos.iter().copied(), majority)
        .into_iter()
        .next()?;
    infos
        .iter()
        .flat_map(|info| &info.holders)
        .find(|holder| token_id(&holder.token) == token)
        .cloned()
}

/// `leasehold status` on a quorum: each node's view, and whether a majority of nodes names the same holder (the lock
/// is held on the quorum only then), with who it is. Exits 0 as long as the question could be put; a node that
/// cannot be asked is shown as such.
pub async fn status(args: &StatusArgs) -> anyhow::Result<u8> {
    let quorum = connect::quorum(&args.store).await?;
    let name = args.name.as_str();
    let views = ask_nodes(
        &args.store,
        |client| async move { client.inspect(name).await },
    )
    .await;
    let infos = || views.iter().filter_map(|(_, info)| info.as_ref().ok());
    let held = majority_tokens(infos(), quorum.majority());
    let description = |token: &str| {
        infos()
            .flat_map(|info| &info.holders)
            .find(|holder| token_id(&holder.token) == token)
            .and_then(|holder| holder.description.clone())
    };
    let text = if args.json {
        let nodes: Vec<Value> = views
            .iter()
            .map(|(url, info)| match info {
                Ok(info) => {
                    let mut object = to_json(info);
                    object["node"] = json!(url);
                    object
                }
                Err(err) => json!({ "node": url, "error": exit::one_line(err) }),
            })
            .collect();
        json!({
            "name": args.name,
            "held_by_majority": held.first(),
            "holders_by_majority": held,
            "descriptions_by_majority": held.iter().map(|t| description(t)).collect::<Vec<_>>(),
            "majority": quorum.majority(),
            "nodes": nodes,
        })
        .to_string()
    } else {
        let mut text = if held.is_empty() {
            format!(
                "{:?} is not held on the quorum (no holder named by {} of {} nodes)",
                args.name,
                quorum.majority(),
                quorum.nodes()
            )
        } else {
            let named: Vec<String> = held
                .iter()
                .map(|token| match description(token) {
                    Some(by) => format!("{token} by {by}"),
                    None => token.clone(),
                })
                .collect();
            format!(
                "{:?} is held on the quorum (a majority of {} names {} {})",
                args.name,
                quorum.nodes(),
                if held.len() == 1 { "token" } else { "tokens" },
                named.join(", ")
            )
        };
        for (url, info) in &views {
            match info {
                Ok(info) => text.push_str(&format!("\n  {url}: {}", sentence(info))),
                Err(err) => {
                    text.push_str(&format!("\n  {url}: cannot ask: {}", exit::one_line(err)))
                }
            }
        }
        text
    };
    print_line(&text);
    Ok(0)
}

/// `leasehold list` on a quorum: the locks a majority of nodes names a holder of, each as a node of that majority
/// sees it. Exits 69 when fewer than a majority of nodes can be asked (the answer could miss held locks).
pub async fn list(args: &ListArgs) -> anyhow::Result<u8> {
    let quorum = connect::quorum(&args.store).await?;
    let pattern = args.pattern.as_str();
    let views = ask_nodes(&args.store, |client| async move {
        client.held_locks(pattern).await
    })
    .await;
    let answered: Vec<&Vec<leasehold::LockInfo>> =
        views.iter().filter_map(|(_, v)| v.as_ref().ok()).collect();
    if answered.len() < quorum.majority() {
        let why = views
            .iter()
            .filter_map(|(url, v)| {
                v.as_ref()
                    .err()
                    .map(|err| format!("{url}: {}", exit::one_line(err)))
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(exit::fail(
            exit::UNAVAILABLE,
            format!(
                "only {} of {} nodes answered, fewer than a majority ({why})",
                answered.len(),
                quorum.nodes()
            ),
        ));
    }
    let mut by_name: HashMap<&str, Vec<&leasehold::LockInfo>> = HashMap::new();
    for info in answered.iter().flat_map(|infos| infos.iter()) {
        by_name.entry(info.name.as_str()).or_default().push(info);
    }
    let mut held: Vec<leasehold::LockInfo> = by_name
        .into_values()
        .filter_map(|infos| {
            let tokens = majority_tokens(infos.iter().copied(), quorum.majority());
            let first = tokens.first()?;
            // A node of the majority, as it sees the lock: its holders are the quorum's.
            let seen = infos
                .iter()
                .find(|info| info.holders.iter().any(|h| token_id(&h.token) == first))?;
            Some((*seen).clone())
        })
        .collect();
    held.sort_by(|a, b| a.name.cmp(&b.name));
    if args.json {
        let all: Vec<Value> = held.iter().map(to_json).collect();
        print_line(&Value::Array(all).to_string());
    } else if held.is_empty() {
        print_line(&format!(
            "no locks held on the quorum match {:?}",
            args.pattern
        ));
    } else {
        exit::print_out(&table(&held));
    }
    Ok(0)
}

/// `leasehold release --force` on a quorum: removes the lock on every node that can be asked, and says per node
/// what went. Exits 69 when some node could not be asked (its copy of the lock stays until its lease ends), after
/// removing it everywhere else.
pub async fn release(args: &ReleaseArgs) -> anyhow::Result<u8> {
    let quorum = connect::quorum(&args.store).await?;
    let name = args.name.as_str();
    let views = ask_nodes(&args.store, |client| async move {
        client.force_release(name).await
    })
    .await;
    let mut lines = Vec::new();
    let mut unreachable = 0;
    for (url, removed) in &views {
        lines.push(match removed {
            Ok(Some(token)) => format!("  {url}: removed token {}", token_id(token)),
            Ok(None) => format!("  {url}: was free"),
            Err(err) => {
                unreachable += 1;
                format!("  {url}: cannot ask: {}", exit::one_line(err))
            }
        });
    }
    let removed = views
        .iter()
        .filter(|(_, r)| matches!(r, Ok(Some(_))))
        .count();
    let head = format!(
        "removed lock {name:?} on {removed} of {} nodes; its holder loses the lock at its next renewal",
        quorum.nodes()
    );
    print_line(&format!("{head}\n{}", lines.join("\n")));
    if unreachable > 0 {
        return Err(exit::fail(
            exit::UNAVAILABLE,
            format!("{unreachable} of {} nodes could not be asked; the lock stays there until its lease ends", quorum.nodes()),
        ));
    }
    Ok(0)
}

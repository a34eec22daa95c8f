//! A cluster reached through a plain `redis://` URL naming one of its nodes (a managed cluster behind one endpoint):
//! the client recognises the node and uses the cluster client, and a client that cannot recognise it fails at once
//! with a typed error instead of retrying a redirection forever.

use std::time::Duration;

use leasehold::{Error, InvalidArgument};
use leasehold_tests::cluster::slot_of;
use leasehold_tests::RedisCluster;

use crate::{eventually, waiter_ready, within};

/// The primary that serves the lock `name`.
fn primary_of(cluster: &RedisCluster, name: &str) -> usize {
    cluster.primary_of_slot(slot_of(&format!("leasehold:{{{name}}}")))
}

/// A name whose lock lives on another primary than `node`.
fn name_elsewhere(cluster: &RedisCluster, node: usize, stem: &str) -> String {
    (0..)
        .map(|i| format!("{stem}-{i}"))
        .find(|name| primary_of(cluster, name) != node)
        .unwrap()
}

pub async fn a_redis_url_naming_one_node_locks_waits_and_hands_off_across_slots(
    cluster: &mut RedisCluster,
) {
    let node = cluster.primaries()[0];
    let url = format!("redis://127.0.0.1:{}", cluster.port(node));
    let holder_client = leasehold::Client::connect(&url).await.unwrap();
    let waiter_client = leasehold::Client::connect(&url).await.unwrap();
    assert!(holder_client.is_cluster(), "{url} was taken for one server");
    // One name per primary: the node named in the URL serves only one of them.
    let mut names: Vec<String> = Vec::new();
    for i in 0.. {
        let name = format!("node-url-{i}");
        if !names
            .iter()
            .any(|n| primary_of(cluster, n) == primary_of(cluster, &name))
        {
            names.push(name);
        }
        if names.len() == 3 {
            break;
        }
    }
    for name in &names {
        let holder = holder_client
            .mutex(name)
            .ttl(Duration::from_secs(60))
            .try_lock()
            .await
            .unwrap();
        assert!(matches!(
            waiter_client.mutex(name).try_lock().await,
            Err(Error::Busy { .. })
        ));
        let waiter = {
            let client = waiter_client.clone();
            let name = name.clone();
            tokio::spawn(async move {
                client
                    .mutex(&name)
                    .lock_timeout(Duration::from_secs(30))
                    .await
            })
        };
        eventually(
            Duration::from_secs(10),
            "the waiter subscribed and queued",
            || waiter_ready(cluster, name),
        )
        .await;
        let fence = holder.fence();
        holder.release().await.unwrap();
        let guard = within(Duration::from_secs(10), "the hand-off", waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(guard.fence() > fence);
        guard.release().await.unwrap();
    }
}

pub async fn a_database_other_than_0_on_a_cluster_node_is_refused(cluster: &mut RedisCluster) {
    let url = format!(
        "redis://127.0.0.1:{}/3",
        cluster.port(cluster.primaries()[0])
    );
    match leasehold::Client::connect(&url).await {
        Err(Error::InvalidArgument(InvalidArgument::BadUrl(why))) => {
            assert!(why.contains("database 0"), "{why}");
        }
        other => panic!("expected a refused database, got {other:?}"),
    }
}

/// A Redis user that may run neither `INFO` nor `CLUSTER SLOTS` cannot tell the client that the node is one of a
/// cluster: the client takes it for one server, and a lock whose key another node serves fails at once with
/// [`Error::ClusterNode`] (waiting or not), where it used to retry the `MOVED` answer forever.
pub async fn a_redirection_on_a_single_server_client_fails_at_once(cluster: &mut RedisCluster) {
    // The node that serves the connect-time probe key, so that the client connects.
    let node = primary_of(cluster, "leasehold-connect-check");
    let user = "blind";
    let mut admin = cluster.connection(node);
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            user,
            "on",
            ">pw",
            "resetkeys",
            "~leasehold:*",
            "resetchannels",
        ])
        .arg(&[
            "&leasehold:wake:*",
            "-@all",
            "+ping",
            "+evalsha",
            "+script|load",
            "+publish",
        ])
        .arg(&[
            "+subscribe",
            "+time",
            "+get",
            "+set",
            "+del",
            "+pexpire",
            "+pttl",
            "+rpush",
        ])
        .arg(&[
            "+lrem", "+llen", "+lpop", "+lindex", "+hset", "+hget", "+hdel", "+type",
        ])
        .query::<()>(&mut admin)
        .unwrap();
    let url = format!("redis://{user}:pw@127.0.0.1:{}", cluster.port(node));
    let client = leasehold::Client::connect(&url).await.unwrap();
    assert!(!client.is_cluster());
    let name = name_elsewhere(cluster, node, "blind");
    let waited = within(
        Duration::from_secs(5),
        "the redirected lock's failure",
        client.mutex(&name).lock_timeout(Duration::from_secs(60)),
    )
    .await;
    match waited {
        Err(Error::ClusterNode { url, answer }) => {
            assert_eq!(
                url,
                format!(
                    "redis+cluster://{user}:***@127.0.0.1:{}",
                    cluster.port(node)
                )
            );
            assert!(answer.starts_with("MOVED"), "{answer}");
        }
        other => panic!("expected Error::ClusterNode, got {other:?}"),
    }
    let tried = client.mutex(&name).try_lock().await;
    assert!(matches!(tried, Err(Error::ClusterNode { .. })), "{tried:?}");
    let message = tried.unwrap_err().to_string();
    assert!(message.contains("use redis+cluster://"), "{message}");
    assert!(!message.contains("pw@"), "{message}");
    redis::cmd("ACL")
        .arg(&["DELUSER", user])
        .query::<()>(&mut admin)
        .unwrap();
}

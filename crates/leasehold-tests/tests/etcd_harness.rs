//! The etcd harness itself (`leasehold_tests::etcd`): a member starts and serves, a three-member cluster elects a
//! leader, replaces it after a `SIGKILL`, and takes the killed member back. Every wait is bounded.

use std::time::{Duration, Instant};

use leasehold::__etcd::rpc::{Client, ConnectOptions};
use leasehold_tests::{EtcdCluster, EtcdServer};

/// The bound on any one request of these tests; a request to a dead leader would otherwise hang for ~7 s.
const CALL: Duration = Duration::from_secs(2);
/// How long a put may keep failing while a new leader is elected (measured: about 1.3 s).
const FAILOVER: Duration = Duration::from_secs(10);

async fn client(endpoint: &str) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(CALL)
        .with_timeout(CALL);
    Client::connect([endpoint], Some(options)).await.unwrap()
}

async fn get(client: &mut Client, key: &str) -> Option<String> {
    let response = tokio::time::timeout(CALL, client.get(key, None))
        .await
        .expect("a get within its bound")
        .unwrap();
    response
        .kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_owned())
}

/// Puts `key` through `endpoint`, retrying while the cluster has no leader, for at most [`FAILOVER`].
async fn put_eventually(endpoint: &str, key: &str, value: &str) {
    let deadline = Instant::now() + FAILOVER;
    let mut client = client(endpoint).await;
    loop {
        match tokio::time::timeout(CALL, client.put(key, value, None)).await {
            Ok(Ok(_)) => return,
            outcome => assert!(
                Instant::now() < deadline,
                "no put through {endpoint} within {FAILOVER:?}: {outcome:?}"
            ),
        }
    }
}

#[tokio::test]
async fn a_single_member_answers_and_keeps_its_data_across_a_restart() {
    let mut etcd = EtcdServer::start();
    assert_eq!(etcd.url(), format!("etcd://{}", etcd.endpoint()));
    let mut c = client(&etcd.endpoint()).await;
    c.put("k", "v", None).await.unwrap();
    assert_eq!(get(&mut c, "k").await.as_deref(), Some("v"));

    let pid = etcd.pid().unwrap();
    etcd.kill();
    assert_eq!(etcd.pid(), None);
    etcd.restart();
    assert_ne!(etcd.pid(), Some(pid));

    let mut c = client(&etcd.endpoint()).await;
    assert_eq!(
        get(&mut c, "k").await.as_deref(),
        Some("v"),
        "the data directory survives a restart"
    );
}

#[tokio::test]
async fn a_cluster_replaces_a_killed_leader_and_takes_it_back() {
    let mut cluster = EtcdCluster::start();
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(cluster.url(), format!("etcd://{}", endpoints.join(",")));

    let leader = cluster.leader();
    put_eventually(&endpoints[leader], "before", "1").await;

    let killed_at = Instant::now();
    cluster.kill(leader);
    let next = cluster.leader();
    eprintln!("new leader agreed after {:?}", killed_at.elapsed());
    assert_ne!(next, leader);
    let survivor = (leader + 1) % 3;
    put_eventually(&endpoints[survivor], "during", "2").await;
    eprintln!("put through a survivor after {:?}", killed_at.elapsed());

    cluster.restart(leader);
    assert_eq!(
        cluster.leader(),
        next,
        "a rejoining member does not depose the leader"
    );
    // Linearizable reads through the restarted member: it serves what was written while it was down.
    let mut rejoined = client(&endpoints[leader]).await;
    assert_eq!(get(&mut rejoined, "before").await.as_deref(), Some("1"));
    assert_eq!(get(&mut rejoined, "during").await.as_deref(), Some("2"));

    // A paused follower does not stop the others; resumed, it serves again.
    let follower = (next + 1) % 3;
    cluster.pause(follower);
    let other = (0..3).find(|&i| i != follower).unwrap();
    put_eventually(&endpoints[other], "paused", "3").await;
    cluster.resume(follower);
    let mut resumed = client(&endpoints[follower]).await;
    assert_eq!(get(&mut resumed, "paused").await.as_deref(), Some("3"));
}

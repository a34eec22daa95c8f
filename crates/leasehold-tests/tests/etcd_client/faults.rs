//! etcd's own faults: a member partitioned, the keep-alive stream cut, a connection gone silent. (Members killed,
//! paused and restarted, a session cut off until the server expires it, and many grants on one session are the same
//! on ZooKeeper: `shared/replicated.rs`.)

use leasehold_tests::{EtcdCluster, EtcdServer, TcpProxy};
use tokio::time::Instant;

use crate::{client, fresh_prefix, renewed_after, EVENT};

/// A proxy in front of each member; the client knows the members only through them.
async fn proxies(cluster: &EtcdCluster) -> (Vec<TcpProxy>, String) {
    let mut proxies = Vec::new();
    for endpoint in cluster.endpoints() {
        proxies.push(TcpProxy::start(endpoint.parse().unwrap()).await);
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let url = format!("etcd://{}", hosts.join(","));
    (proxies, url)
}

pub async fn a_partitioned_member_is_routed_around(cluster: &mut EtcdCluster) {
    let prefix = fresh_prefix();
    let (proxies, url) = proxies(cluster).await;
    let a = client(&url, &prefix).await;
    let b = client(&cluster.url(), &prefix).await;
    let held = a.mutex("door").lock().await.unwrap();
    // The client starts on the first member: cut it off, connections open and new ones alike.
    let cut_at = Instant::now();
    proxies[0].blackhole();
    renewed_after(&held.lease(), cut_at).await;
    assert!(b.mutex("door").try_lock().await.unwrap_err().is_busy());
    // New requests go to the members it still reaches.
    let second = tokio::time::timeout(EVENT, a.mutex("window").lock())
        .await
        .unwrap()
        .unwrap();
    second.release().await.unwrap();
    held.release().await.unwrap();
    b.mutex("door")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

pub async fn a_cut_keep_alive_stream_is_reopened(_cluster: &mut EtcdCluster) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let proxy = TcpProxy::start(etcd.endpoint().parse().unwrap()).await;
    let prefix = fresh_prefix();
    let a = client(&format!("etcd://{}", proxy.addr()), &prefix).await;
    let held = a.mutex("stream").lock().await.unwrap();
    for _ in 0..3 {
        let cut_at = Instant::now();
        proxy.cut_all();
        renewed_after(&held.lease(), cut_at).await;
    }
    held.release().await.unwrap();
}

pub async fn a_silently_dead_connection_is_replaced_within_the_lease(_cluster: &mut EtcdCluster) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let proxy = TcpProxy::start(etcd.endpoint().parse().unwrap()).await;
    let prefix = fresh_prefix();
    let a = client(&format!("etcd://{}", proxy.addr()), &prefix).await;
    let held = a.mutex("quiet").lock().await.unwrap();
    // The connection goes silent (no reset, no close) and stays dead; new connections get through again at once.
    proxy.blackhole();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    proxy.restore();
    let restored_at = Instant::now();
    // The client notices the dead connection and opens another before its lease (5 s) runs out.
    renewed_after(&held.lease(), restored_at).await;
    held.release().await.unwrap();
}

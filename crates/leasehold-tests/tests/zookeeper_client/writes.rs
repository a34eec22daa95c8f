//! Writes inside ZooKeeper guarded by the grant's node (`Guard::zookeeper_write`).

use leasehold::{Error, LossReason, ZkWrite};
use leasehold_tests::ZkEnsemble;

use crate::{client, fresh_prefix};

pub async fn guarded_writes_commit_only_while_the_grant_holds(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let url = ensemble.url();
    let (a, b) = (client(&url, &prefix).await, client(&url, &prefix).await);
    let raw = zookeeper_client::Client::connect(&ensemble.endpoints().join(","))
        .await
        .unwrap();
    let data = format!("/{prefix}-data");
    // A read through another session may reach a follower that has not applied the write yet (ZooKeeper's reads are
    // not linearizable across sessions; a loaded machine shows it): `sync` first brings that server up to the leader.
    let read = || async {
        raw.sync(&data).await?;
        raw.get_data(&data).await.map(|(bytes, _)| bytes)
    };

    let guard = a.mutex("config").lock().await.unwrap();
    guard
        .zookeeper_write(&[ZkWrite::Create {
            path: data.clone(),
            data: b"v1".to_vec(),
        }])
        .await
        .unwrap();
    assert_eq!(read().await.unwrap(), b"v1");
    // All or nothing: a refused write (the node exists) leaves the one before it uncommitted.
    let refused = guard
        .zookeeper_write(&[
            ZkWrite::SetData {
                path: data.clone(),
                data: b"half".to_vec(),
            },
            ZkWrite::Create {
                path: data.clone(),
                data: Vec::new(),
            },
        ])
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Store { .. }), "{refused:?}");
    assert_eq!(read().await.unwrap(), b"v1");

    // The lock is taken from its holder: its writes are refused, and the data stays.
    b.force_release("config").await.unwrap();
    let late = guard
        .zookeeper_write(&[ZkWrite::SetData {
            path: data.clone(),
            data: b"late".to_vec(),
        }])
        .await
        .unwrap_err();
    assert!(
        matches!(
            late,
            Error::LeaseLost {
                reason: LossReason::Gone,
                ..
            }
        ),
        "{late:?}"
    );
    assert_eq!(read().await.unwrap(), b"v1");
    // The new holder writes.
    let next = b.mutex("config").lock().await.unwrap();
    next.zookeeper_write(&[ZkWrite::Delete { path: data.clone() }])
        .await
        .unwrap();
    assert_eq!(read().await.unwrap_err(), zookeeper_client::Error::NoNode);
    next.release().await.unwrap();
}

//! What each kind admits, in what order, with what fences.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::__etcd::{Kind, Released};
use leasehold_tests::EtcdServer;

use crate::{raw, session, still_waiting, wait_keys, within};

pub async fn two_clients_exclude_each_other(etcd: &mut EtcdServer) {
    let (a, b) = (session(etcd, 10).await, Arc::new(session(etcd, 10).await));
    let first = a.acquire("mutex/two", Kind::Exclusive).await.unwrap();
    let waiter = Arc::clone(&b);
    let mut second =
        tokio::spawn(async move { waiter.acquire("mutex/two", Kind::Exclusive).await });
    still_waiting("the second client's acquire", &mut second).await;

    let fence = first.fence();
    assert_eq!(a.release(first).await.unwrap(), Released::Released);
    let second = within("the grant after release", second)
        .await
        .unwrap()
        .unwrap();
    assert!(second.fence() > fence);
    assert_eq!(b.release(second).await.unwrap(), Released::Released);
}

pub async fn three_waiters_are_granted_in_fifo_order(etcd: &mut EtcdServer) {
    let path = "mutex/fifo";
    let mut look = raw(etcd).await;
    let holder = session(etcd, 10).await;
    let held = holder.acquire(path, Kind::Exclusive).await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 1..=3 {
        let s = session(etcd, 10).await;
        let order = order_tx.clone();
        waiters.push(tokio::spawn(async move {
            let grant = s.acquire(path, Kind::Exclusive).await.unwrap();
            order.send(i).unwrap();
            s.release(grant).await.unwrap();
        }));
        // Enqueued before the next one starts: the queue order is the spawn order.
        wait_keys(&mut look, path, 1 + i).await;
    }
    holder.release(held).await.unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(within("the next grant", order_rx.recv()).await.unwrap());
    }
    assert_eq!(order, [1, 2, 3]);
    for waiter in waiters {
        within("a waiter's end", waiter).await.unwrap();
    }
}

pub async fn readers_share_and_a_writer_excludes(etcd: &mut EtcdServer) {
    let path = "rw/one";
    let mut look = raw(etcd).await;
    let readers = session(etcd, 10).await;
    let r1 = readers.acquire(path, Kind::Shared).await.unwrap();
    let r2 = within("a second read share", readers.acquire(path, Kind::Shared))
        .await
        .unwrap();

    let writers = Arc::new(session(etcd, 10).await);
    let w = Arc::clone(&writers);
    let mut writer = tokio::spawn(async move { w.acquire(path, Kind::Exclusive).await });
    wait_keys(&mut look, path, 3).await;
    still_waiting("the writer", &mut writer).await;
    // A reader after a waiting writer waits for it (FIFO; writers are not starved).
    let late = Arc::new(session(etcd, 10).await);
    let l = Arc::clone(&late);
    let mut late_reader = tokio::spawn(async move { l.acquire(path, Kind::Shared).await });
    wait_keys(&mut look, path, 4).await;
    still_waiting("the reader behind the writer", &mut late_reader).await;

    readers.release(r1).await.unwrap();
    still_waiting("the writer while one reader holds", &mut writer).await;
    readers.release(r2).await.unwrap();
    let w = within("the writer's grant", &mut writer)
        .await
        .unwrap()
        .unwrap();
    still_waiting("the reader while the writer holds", &mut late_reader).await;
    writers.release(w).await.unwrap();
    let r3 = within("the late reader's grant", late_reader)
        .await
        .unwrap()
        .unwrap();
    late.release(r3).await.unwrap();
}

pub async fn a_semaphore_of_two_admits_two(etcd: &mut EtcdServer) {
    let path = "sem/two";
    let two = Kind::Permits(NonZeroU32::new(2).unwrap());
    let mut look = raw(etcd).await;
    let a = session(etcd, 10).await;
    let p1 = a.acquire(path, two).await.unwrap();
    let p2 = within("a second permit", a.acquire(path, two))
        .await
        .unwrap();
    assert_ne!(p1.key(), p2.key(), "two grants of one session are two keys");

    let b = Arc::new(session(etcd, 10).await);
    let waiter = Arc::clone(&b);
    let mut third = tokio::spawn(async move { waiter.acquire(path, two).await });
    wait_keys(&mut look, path, 3).await;
    still_waiting("a third permit", &mut third).await;
    a.release(p2).await.unwrap();
    let p3 = within("the third permit", third).await.unwrap().unwrap();
    a.release(p1).await.unwrap();
    b.release(p3).await.unwrap();
}

pub async fn fences_strictly_increase_across_holders(etcd: &mut EtcdServer) {
    let (a, b) = (session(etcd, 10).await, session(etcd, 10).await);
    let mut last = None;
    for round in 0..6 {
        let s = if round % 2 == 0 { &a } else { &b };
        let grant = s.acquire("fence/one", Kind::Exclusive).await.unwrap();
        if let Some(last) = last {
            assert!(grant.fence() > last, "{} after {last}", grant.fence());
        }
        last = Some(grant.fence());
        s.release(grant).await.unwrap();
    }
}

/// Not a check, a measurement: uncontended grant + release, a keep-alive round trip, and the time from a release to
/// the next waiter's grant, on this machine's single member.
pub async fn measured_latencies(etcd: &mut EtcdServer) {
    const N: u32 = 50;
    let s = session(etcd, 10).await;
    let started = Instant::now();
    for _ in 0..N {
        let grant = s.acquire("measure/grant", Kind::Exclusive).await.unwrap();
        s.release(grant).await.unwrap();
    }
    let cycle = started.elapsed() / N;

    let mut client = raw(etcd).await;
    let lease = client.lease_grant(10, None).await.unwrap().id();
    let (mut keeper, mut stream) = client.lease_keep_alive(lease).await.unwrap();
    let started = Instant::now();
    for _ in 0..N {
        keeper.keep_alive().await.unwrap();
        stream.message().await.unwrap().unwrap();
    }
    let keep_alive = started.elapsed() / N;
    client.lease_revoke(lease).await.unwrap();

    let waiter = Arc::new(session(etcd, 10).await);
    let mut handoffs = Duration::ZERO;
    for _ in 0..10 {
        let held = s.acquire("measure/handoff", Kind::Exclusive).await.unwrap();
        let w = Arc::clone(&waiter);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let grant = w.acquire("measure/handoff", Kind::Exclusive).await.unwrap();
            tx.send(Instant::now()).unwrap();
            w.release(grant).await.unwrap();
        });
        wait_keys(&mut client, "measure/handoff", 2).await;
        let released = Instant::now();
        s.release(held).await.unwrap();
        handoffs += within("the handoff", rx).await.unwrap() - released;
        within("the waiter's release", task).await.unwrap();
    }
    println!(
        "etcd measured: acquire+release {cycle:?}, keep-alive round trip {keep_alive:?}, release -> next waiter granted {:?}",
        handoffs / 10
    );
}

//! Mutual exclusion across real OS processes, the lock on the cluster.

use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold_tests::{ChildGuard, RedisCluster, RedisServer};

const PROCESSES: usize = 8;
const SECTIONS: u32 = 100;

pub async fn eight_processes_never_overlap_on_a_cluster(cluster: &mut RedisCluster) {
    // The shared data lives on a server of its own (its keys would span slots on the cluster); the lock is on the
    // cluster.
    let store = RedisServer::start();
    let url = cluster.url();
    let data = store.url();
    let mut workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let child = Command::new(env!("CARGO_BIN_EXE_leasehold-worker"))
                .args([
                    "count-on",
                    &url,
                    &data,
                    "cluster-counter",
                    &SECTIONS.to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            ChildGuard::new(child)
        })
        .collect();
    for w in &mut workers {
        let status = w
            .wait_timeout(Duration::from_secs(120))
            .expect("worker finished in time");
        assert!(status.success(), "worker failed: {status}");
    }
    leasehold_tests::assert_exclusive_sections(&store, PROCESSES * SECTIONS as usize);
}

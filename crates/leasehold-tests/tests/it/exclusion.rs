//! Mutual exclusion across real OS processes.

use std::time::Duration;

use leasehold_tests::RedisServer;

use crate::worker;

const PROCESSES: usize = 8;
const SECTIONS: u32 = 100;

#[test]
fn eight_processes_never_overlap_and_the_counter_is_exact() {
    let server = RedisServer::start();
    let url = server.url();
    let mut workers: Vec<_> = (0..PROCESSES)
        .map(|_| worker(&["count", &url, "shared-counter", &SECTIONS.to_string()]))
        .collect();
    for w in &mut workers {
        let status = w
            .wait_timeout(Duration::from_secs(120))
            .expect("worker finished in time");
        assert!(status.success(), "worker failed: {status}");
    }

    leasehold_tests::assert_exclusive_sections(&server, PROCESSES * SECTIONS as usize);
}

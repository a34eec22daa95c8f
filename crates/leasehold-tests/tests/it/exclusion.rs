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

    let mut conn = server.connection();
    let counter: i64 = redis::cmd("GET")
        .arg("test:counter")
        .query(&mut conn)
        .unwrap();
    let overlaps: Option<i64> = redis::cmd("GET")
        .arg("test:overlaps")
        .query(&mut conn)
        .unwrap();
    let fences: Vec<u64> = redis::cmd("LRANGE")
        .arg("test:fences")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();

    assert_eq!(overlaps, None, "two critical sections overlapped");
    assert_eq!(
        counter,
        (PROCESSES as i64) * i64::from(SECTIONS),
        "lost updates"
    );
    assert_eq!(fences.len(), PROCESSES * SECTIONS as usize);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences, in critical-section order, must strictly increase"
    );
}

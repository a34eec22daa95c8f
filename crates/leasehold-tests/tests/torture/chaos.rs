//! The rig: the servers, the proxies, the worker processes, and the scheduler that injects faults.

use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold_tests::{ChildGuard, RedisServer, TcpProxy, TempDir, XorShift as Rng};
use nix::sys::signal::Signal;

use crate::check::{check, Report, Rule};
use crate::history::{read_all, Fault, Stats, Window};

/// The lock's name.
const NAME: &str = "torture";

fn now_ns() -> u64 {
    leasehold_tests::monotonic_ns()
}

struct Worker {
    child: ChildGuard,
    incarnation: usize,
}

pub struct Rig {
    /// Listens to every channel; replaced after each restart.
    bystander: redis::aio::PubSub,
    lock: RedisServer,
    store: RedisServer,
    proxies: Vec<TcpProxy>,
    workers: Vec<Worker>,
    dir: TempDir,
    ttl: Duration,
    rng: Rng,
    seed: u64,
    windows: Vec<Window>,
    /// The lock kind, as the worker takes it (`mutex`, `fair`, `semaphore:N`, `rw`).
    kind: String,
}

impl Rig {
    pub async fn start(workers: usize, ttl: Duration, seed: u64, kind: &str) -> Rig {
        let lock = RedisServer::start_with(&["--enable-debug-command", "local"]);
        // A bystander listening to every channel (monitoring, a debugging session): every PUBLISH counts it, so a
        // queue whose liveness were judged by PUBLISH's count would wake dead clients.
        let bystander = bystander(&lock).await;
        let store = RedisServer::start();
        let mut proxies = Vec::new();
        for _ in 0..workers {
            proxies.push(TcpProxy::start(lock.addr()).await);
        }
        let mut rig = Rig {
            bystander,
            lock,
            store,
            proxies,
            workers: Vec::new(),
            dir: TempDir::new("torture"),
            ttl,
            rng: Rng::new(seed),
            seed,
            windows: Vec::new(),
            kind: kind.to_owned(),
        };
        for i in 0..workers {
            let child = rig.spawn(i, 0);
            rig.workers.push(Worker {
                child,
                incarnation: 0,
            });
        }
        rig
    }

    fn spawn(&self, worker: usize, incarnation: usize) -> ChildGuard {
        let log = self
            .dir
            .path()
            .join(format!("worker-{worker}-{incarnation}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_torture-worker"))
            .arg("run")
            .arg(self.proxies[worker].url())
            .arg(self.store.url())
            .arg(NAME)
            .arg(worker.to_string())
            .arg(self.ttl.as_millis().to_string())
            .arg((self.seed ^ ((worker as u64 + 1) << 32) ^ incarnation as u64).to_string())
            .arg(&log)
            .arg(&self.kind)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start torture-worker");
        ChildGuard::new(child)
    }

    fn record(&mut self, fault: Fault, worker: Option<usize>, start: u64) {
        self.windows.push(Window {
            fault,
            worker,
            start,
            end: now_ns(),
        });
    }

    /// Injects faults for `length`: bursts of faults one after another, then a calm spell long enough for the
    /// recovery allowance to run out, in which the tight stall bound applies.
    pub async fn torture(&mut self, length: Duration) {
        let end = tokio::time::Instant::now() + length;
        // Let the workers get going before the first fault.
        tokio::time::sleep(self.ttl * 2).await;
        while tokio::time::Instant::now() < end {
            // A snapshot now: a restart in this burst comes back from it, with a stale fence counter, stale keys
            // and a stale queue (stock redis-server persists to RDB snapshots by default).
            let _: redis::RedisResult<()> = redis::cmd("SAVE").query(&mut self.lock.connection());
            let burst = tokio::time::Instant::now()
                + self
                    .rng
                    .between(Duration::from_secs(2), Duration::from_secs(6));
            while tokio::time::Instant::now() < burst.min(end) {
                let gap = self.rng.between(self.ttl / 5, self.ttl * 2);
                tokio::time::sleep(gap).await;
                self.one_fault().await;
            }
            // More dead clients than a release once gave up after (16): in the calm spell that follows, once they
            // are past their liveness, no release may stall on them.
            let dead = 17 + self.rng.below(8);
            self.queue_and_die(dead);
            tokio::time::sleep(crate::check::CALM).await;
        }
    }

    async fn one_fault(&mut self) {
        let ttl = self.ttl;
        let worker = self.rng.below(self.workers.len() as u64) as usize;
        let start = now_ns();
        match self.rng.below(10) {
            0 => {
                let pause = self.rng.between(ttl * 3 / 2, ttl * 3);
                let _ = self.workers[worker].child.signal(Signal::SIGSTOP);
                tokio::time::sleep(pause).await;
                let _ = self.workers[worker].child.signal(Signal::SIGCONT);
                self.record(Fault::Stop, Some(worker), start);
            }
            1 => {
                let _ = self.workers[worker].child.signal(Signal::SIGKILL);
                let _ = self.workers[worker].child.wait();
                let incarnation = self.workers[worker].incarnation + 1;
                self.workers[worker] = Worker {
                    child: self.spawn(worker, incarnation),
                    incarnation,
                };
                self.record(Fault::Kill, Some(worker), start);
            }
            2 => {
                let cut = self.rng.between(ttl / 2, ttl * 2);
                self.proxies[worker].blackhole();
                tokio::time::sleep(cut).await;
                self.proxies[worker].restore();
                self.record(Fault::Blackhole, Some(worker), start);
            }
            3 => {
                let delay = self.rng.between(Duration::from_millis(2), ttl / 3);
                let length = self.rng.between(ttl, ttl * 4);
                self.proxies[worker].delay(delay);
                tokio::time::sleep(length).await;
                self.proxies[worker].delay(Duration::ZERO);
                self.record(Fault::Delay, Some(worker), start);
            }
            4 => {
                let sleep = self.rng.between(ttl / 5, ttl * 3 / 2);
                let mut con = self.lock.connection();
                tokio::task::block_in_place(|| {
                    let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg(sleep.as_secs_f64())
                        .query(&mut con);
                });
                self.record(Fault::DebugSleep, None, start);
            }
            5 => {
                let pause = self.rng.between(ttl / 5, ttl * 2);
                let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(pause.as_millis() as u64)
                    .query(&mut self.lock.connection());
                tokio::time::sleep(pause).await;
                self.record(Fault::Pause, None, start);
            }
            6 => {
                // A crash (SIGKILL), and a restart from the snapshot taken at the start of the burst.
                tokio::task::block_in_place(|| self.lock.restart());
                self.bystander = bystander(&self.lock).await;
                self.record(Fault::Restart, None, start);
            }
            7 => {
                self.lock.flushall();
                self.record(Fault::Flushall, None, start);
            }
            8 => {
                let _: redis::RedisResult<()> = redis::cmd("DEL")
                    .arg(format!("leasehold:{{{NAME}}}:fence"))
                    .query(&mut self.lock.connection());
                self.record(Fault::DelFence, None, start);
            }
            _ => {
                let n = 1 + self.rng.below(20);
                self.queue_and_die(n);
            }
        }
    }

    /// `n` clients join the lock's queue and vanish.
    fn queue_and_die(&mut self, n: u64) {
        let start = now_ns();
        let clients: Vec<ChildGuard> = (0..n)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_torture-worker"))
                    .args(["queue-and-die", &self.lock.url(), NAME, &self.kind])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map(ChildGuard::new)
                    .expect("cannot start torture-worker")
            })
            .collect();
        tokio::task::block_in_place(|| {
            for mut client in clients {
                let _ = client.wait_timeout(Duration::from_secs(10));
            }
        });
        self.record(Fault::QueueAndDie, None, start);
    }

    /// The fault windows, one per line, for a verbose report.
    pub fn windows(&self) -> String {
        self.windows
            .iter()
            .map(|w| format!("{:?} {:?} {}..{}", w.fault, w.worker, w.start, w.end))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops the workers, reads their histories and checks them.
    pub async fn finish(mut self) -> Outcome {
        for worker in &mut self.workers {
            let _ = worker.child.signal(Signal::SIGKILL);
            let _ = worker.child.wait();
        }
        let (grants, stats) = read_all(self.dir.path());
        let report = check(&grants, &self.windows, self.ttl, Rule::of(&self.kind));
        let keys_without_ttl = keys_without_ttl(&self.lock);
        Outcome {
            report,
            stats,
            faults: self.windows.len(),
            keys_without_ttl,
        }
    }
}

/// A connection subscribed to every channel (`PSUBSCRIBE *`), as a monitoring tool would be.
async fn bystander(server: &RedisServer) -> redis::aio::PubSub {
    let mut pubsub = server.client().get_async_pubsub().await.unwrap();
    pubsub.psubscribe("*").await.unwrap();
    pubsub
}

/// Keys on the lock server that would never expire.
fn keys_without_ttl(server: &RedisServer) -> Vec<String> {
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    keys.into_iter()
        .filter(|key| redis::cmd("PTTL").arg(key).query::<i64>(&mut con).unwrap() == -1)
        .collect()
}

pub struct Outcome {
    report: Report,
    stats: Stats,
    faults: usize,
    keys_without_ttl: Vec<String>,
}

impl Outcome {
    pub fn violations(&self) -> usize {
        self.report.violations() + self.keys_without_ttl.len()
    }

    /// The one-line summary.
    pub fn line(&self, kind: &str, seed: u64, seconds: u64) -> String {
        let r = &self.report;
        format!(
            "torture kind={kind} seed={seed} secs={seconds} sections={} faults={} overlaps={} fence_regressions={} late_losses={} \
             stalls={} keys_without_ttl={} | excused_overlaps={} writes={} refused={} occupied={} errors={}",
            self.stats.sections,
            self.faults,
            r.overlaps.len(),
            r.fence_regressions.len(),
            r.late_losses.len(),
            r.stalls.len(),
            self.keys_without_ttl.len(),
            r.excused_overlaps.len(),
            self.stats.writes,
            self.stats.refused,
            self.stats.occupied,
            self.stats.errors,
        )
    }

    /// Every violation, one per line.
    pub fn details(&self) -> String {
        let r = &self.report;
        let mut lines = Vec::new();
        lines.extend(r.overlaps.iter().map(|v| format!("overlap: {v}")));
        lines.extend(
            r.fence_regressions
                .iter()
                .map(|v| format!("fence regression: {v}")),
        );
        lines.extend(r.late_losses.iter().map(|v| format!("late loss: {v}")));
        lines.extend(r.stalls.iter().map(|v| format!("stall: {v}")));
        lines.extend(
            self.keys_without_ttl
                .iter()
                .map(|k| format!("key without TTL: {k}")),
        );
        lines.extend(
            r.excused_overlaps
                .iter()
                .map(|v| format!("(excused: data loss) overlap: {v}")),
        );
        lines.join("\n")
    }
}

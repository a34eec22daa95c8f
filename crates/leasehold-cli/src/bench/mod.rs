//! `leasehold bench`: leasehold against the raw-Redis floor and a peer's recipe, on any Redis, in one run.
//!
//! | scenario | what runs |
//! |---|---|
//! | `floor-1` | 1 task: `SET NX PX` + owner-checked delete script, on a redis-rs `ConnectionManager` |
//! | `uncontended-1` | 1 task: leasehold `lock()` + `release()` on its own key |
//! | `floor-64` / `uncontended-64` | the same with 64 tasks in this process, distinct keys |
//! | `floor-8p` | 8 worker processes spinning on ONE key: `SET NX PX` until granted, then the owner-checked delete |
//! | `peer-1`, `peer-64`, `peer-8p` | rslock's recipe, the best Rust peer's: the floor's commands on a redis-rs `MultiplexedConnection`; when busy, the delete of its own token and a random sleep below 2 ms |
//! | `contended-8p` | 8 worker processes looping on ONE lock (leasehold), empty critical section |
//! | `handoff` | 2 worker processes taking turns: release → the waiting other holds it |
//! | `renew-10k` | one worker process holds 10,000 locks through 3 renewal periods (1 s) of a 3 s lease |
//!
//! Every scenario runs on a Redis Cluster too (`--store redis+cluster://h:p,h:p,…`): the floor then uses redis-rs's
//! cluster connection, the server's CPU time and script calls are summed over every primary, and the in-process
//! scenarios say how their keys spread over slots and primaries (`bench:N`, which leasehold uses as the hash tag).
//!
//! On a quorum of independent servers (`--store` given three times or more, or `--quorum N` private servers), the
//! scenarios are the quorum's, each beside its single-node figure on the first node:
//!
//! | scenario | what runs |
//! |---|---|
//! | `quorum-floor-1` | 1 task: `SET NX PX` to every node at once, done at a majority's OK; the delete on every node |
//! | `quorum-1` | 1 task: leasehold `QuorumMutex` `try_lock()` + `release()`, p50 beside each node's round trip |
//! | `uncontended-1` | as above, on the first node alone |
//! | `quorum-64` | `quorum-1` with 64 tasks, distinct keys |
//! | `quorum-contended-8p` | 8 worker processes looping `lock()` + `release()` on ONE quorum mutex |
//! | `contended-8p` | as above, on the first node alone |
//!
//! The server CPU of a quorum scenario is summed over every node.
//!
//! On etcd (`--store etcd://host:port[,host:port…]`), the scenarios that make sense there, against etcd's own floor
//! (see [`etcd`]), with the server CPU read from every member's `/metrics` page:
//!
//! | scenario | what runs |
//! |---|---|
//! | `etcd-lock-1`, `etcd-lock-64` | 1 or 64 tasks: etcd's `Lock` RPC under a lease, then `Unlock` (what a Go user gets) |
//! | `etcd-lock-8p` | 8 worker processes waiting in etcd's `Lock` RPC on ONE name |
//! | `uncontended-1`, `-64`, `contended-8p`, `handoff`, `fair-8p`, `fair-handoff`, `rw-8p`, `semaphore-8p` | as on Redis, leasehold on etcd; the first four against the etcd floor |
//! | `renew-10k` | as on Redis: the 10,000 locks follow one session lease, so its renewal calls are the session's keep-alives |
//!
//! `floor-*` and `peer-*` (raw Redis, rslock) are skipped there, with a note.

mod etcd;
mod plot;
mod quorum;
mod raw;
mod scenario;
mod stats;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::exit;
use crate::server::PrivateServer;
use quorum::Nodes;
use scenario::{Recipe, Setup};
use stats::{OnQuorum, Outcome, Renewal};

/// Every scenario of one server or cluster, in the order they run.
pub const SCENARIOS: [&str; 15] = [
    "floor-1",
    "peer-1",
    "uncontended-1",
    "floor-64",
    "peer-64",
    "uncontended-64",
    "floor-8p",
    "peer-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// Every scenario of a quorum, in the order they run: each of the quorum's beside its figure on the first node alone.
pub const QUORUM_SCENARIOS: [&str; 6] = [
    "quorum-floor-1",
    "quorum-1",
    "uncontended-1",
    "quorum-64",
    "quorum-contended-8p",
    "contended-8p",
];

/// Every scenario on etcd, in the order they run: etcd's own floor (its `Lock` RPC) in place of the Redis floor, and
/// no peer (rslock's recipe is Redis's).
pub const ETCD_SCENARIOS: [&str; 12] = [
    "etcd-lock-1",
    "uncontended-1",
    "etcd-lock-64",
    "uncontended-64",
    "etcd-lock-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// What the bench runs on: the scenario list and the topology's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// One Redis server or cluster.
    One,
    /// A quorum of independent Redis servers.
    Quorum,
    /// An etcd cluster.
    Etcd,
}

impl Topology {
    fn scenarios(self) -> &'static [&'static str] {
        match self {
            Topology::One => &SCENARIOS,
            Topology::Quorum => &QUORUM_SCENARIOS,
            Topology::Etcd => &ETCD_SCENARIOS,
        }
    }
}

/// `leasehold bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Use this Redis server (or cluster: redis+cluster://host:port,host:port,…) instead of starting a private one.
    /// Given 3 times or more: a quorum of independent servers (Redlock), with the scenarios quorum-floor-1, quorum-1,
    /// quorum-64, quorum-contended-8p, and uncontended-1 and contended-8p on the first server alone. An etcd cluster:
    /// etcd://host:port[,host:port…], against etcd's own lock (etcd-lock-1, -64, -8p).
    #[arg(long = "store", visible_alias = "redis", value_name = "URL")]
    pub store: Vec<String>,

    /// Start N private servers (3 to 15) instead of one, and bench a quorum of them (as --store given N times).
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "store",
        value_parser = clap::value_parser!(u8).range(3..=15)
    )]
    pub quorum: Option<u8>,

    /// How long each scenario measures (after a short warm-up).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::duration::parse)]
    pub duration: Duration,

    /// Print one JSON object per scenario instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Also draw the acquire-latency distribution (CDF, log-scale time) of every scenario into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,

    /// Run only these scenarios (comma-separated).
    #[arg(long, value_name = "A,B", value_delimiter = ',', value_parser = parse_scenario)]
    pub scenarios: Vec<String>,
}

fn parse_scenario(name: &str) -> Result<String, String> {
    if [&SCENARIOS[..], &QUORUM_SCENARIOS, &ETCD_SCENARIOS]
        .iter()
        .any(|list| list.contains(&name))
    {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "unknown scenario {name:?}; known: {}; on a quorum: {}; on etcd: {}",
            SCENARIOS.join(", "),
            QUORUM_SCENARIOS.join(", "),
            ETCD_SCENARIOS.join(", ")
        ))
    }
}

/// A usage error unless `--store` names one server (or cluster, or etcd cluster), or the distinct independent servers
/// of a quorum.
fn check_servers(urls: &[String]) -> anyhow::Result<()> {
    let usage = |message: &str| Err(exit::fail(exit::USAGE, message));
    if urls.len() > 1 && urls.iter().any(|url| crate::etcd::is_etcd(url)) {
        return usage(
            "--store given several times with an etcd URL: one etcd URL names every member of the cluster \
             (etcd://h1:2379,h2:2379,h3:2379); a quorum is made of independent Redis servers",
        );
    }
    match urls.len() {
        0 | 1 => return Ok(()),
        2 => return usage(
            "--store given twice: one server (or cluster) takes one --store, a quorum at least 3",
        ),
        _ => {}
    }
    for (i, url) in urls.iter().enumerate() {
        if urls[..i].contains(url) {
            return usage("a quorum's servers must be distinct: one given twice would vote twice");
        }
        if leasehold::__private::cluster_seeds(url).is_some() {
            return usage("a quorum is made of independent servers (redis://…), not of clusters");
        }
    }
    Ok(())
}

/// The servers of the run: `--store` as given, or private ones (kept running while the returned servers live).
fn servers(args: &BenchArgs) -> anyhow::Result<(Vec<String>, Vec<PrivateServer>)> {
    if !args.store.is_empty() {
        return Ok((args.store.clone(), Vec::new()));
    }
    let mut private = Vec::new();
    for _ in 0..args.quorum.map_or(1, usize::from) {
        private.push(
            PrivateServer::start().map_err(|e| exit::fail(exit::UNAVAILABLE, e.to_string()))?,
        );
    }
    Ok((private.iter().map(PrivateServer::url).collect(), private))
}

/// A usage error when a chosen scenario does not run on this topology.
fn check_scenarios(chosen: &[String], topology: Topology) -> anyhow::Result<()> {
    let runs = topology.scenarios();
    let Some(name) = chosen.iter().find(|name| !runs.contains(&name.as_str())) else {
        return Ok(());
    };
    let message = match topology {
        Topology::Quorum => format!(
            "{name} does not run on a quorum; there: {}",
            QUORUM_SCENARIOS.join(", ")
        ),
        Topology::Etcd => format!(
            "{name} does not run on etcd (the raw-Redis floor, rslock's recipe and the quorum are Redis's); there: {}",
            ETCD_SCENARIOS.join(", ")
        ),
        Topology::One if ETCD_SCENARIOS.contains(&name.as_str()) => {
            format!("{name} needs an etcd store: --store etcd://host:port")
        }
        Topology::One => {
            format!("{name} needs a quorum: --quorum N, or --store given 3 times or more")
        }
    };
    Err(exit::fail(exit::USAGE, message))
}

/// The note printed on etcd: what its floor is, and which scenarios of a Redis run it skips.
const ON_ETCD: &str = "on etcd: × floor is against etcd-lock-1, -64, -8p, etcd's own Lock RPC under a lease (in place \
                       of floor-1, -64, -8p, the raw-Redis floor); peer-1, -64, -8p (rslock's recipe, for Redis) are \
                       skipped";

/// The floor scenario a leasehold scenario is set against, on each store (at most one of them runs).
fn floors_of(name: &str) -> &'static [&'static str] {
    match name {
        "uncontended-1" => &["floor-1", "etcd-lock-1"],
        "uncontended-64" => &["floor-64", "etcd-lock-64"],
        "contended-8p" | "fair-8p" => &["floor-8p", "etcd-lock-8p"],
        "quorum-1" => &["quorum-floor-1"],
        _ => &[],
    }
}

/// Runs the benchmark and prints its results.
pub async fn bench(args: BenchArgs) -> anyhow::Result<u8> {
    if args.duration > Duration::from_secs(3600) {
        return Err(exit::fail(exit::USAGE, "--duration is limited to 1h"));
    }
    check_servers(&args.store)?;
    let is_quorum = args.quorum.is_some() || args.store.len() >= leasehold::MIN_NODES;
    let on_etcd = args.store.iter().any(|url| crate::etcd::is_etcd(url));
    let topology = match (is_quorum, on_etcd) {
        (true, _) => Topology::Quorum,
        (false, true) => Topology::Etcd,
        (false, false) => Topology::One,
    };
    check_scenarios(&args.scenarios, topology)?;
    let (urls, private) = servers(&args)?;
    // Fail early, with the usual exit status, when a server cannot be used.
    for url in &urls {
        crate::connect::client(url, None).await?;
    }
    let nodes = if is_quorum {
        Some(Arc::new(Nodes::open(&urls)?))
    } else {
        None
    };
    let url = urls[0].clone();
    // One server or cluster; on a quorum, its first node (the single-node comparisons).
    let setup = Setup {
        raw: raw::Raw::open(&url)?,
        url,
        quorum: None,
        warmup: (args.duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        duration: args.duration,
        progress: !args.json,
    };
    // The quorum scenarios' setup; without a quorum none of them is chosen.
    let all_nodes = Setup {
        quorum: nodes.clone(),
        ..setup.clone()
    };
    let rtt_time = (setup.duration / 5).max(Duration::from_millis(200));
    let wanted = |name: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|s| s == name);
    let chosen: Vec<&'static str> = topology
        .scenarios()
        .iter()
        .copied()
        .filter(|n| wanted(n))
        .collect();
    if on_etcd && args.json {
        exit::print_err(&format!("bench: {ON_ETCD}"));
    }
    let run = async {
        let mut outcomes: Vec<Outcome> = Vec::new();
        for (index, &name) in chosen.iter().enumerate() {
            let mut outcome = match name {
                "quorum-floor-1" | "quorum-1" => {
                    async {
                        let rtts = match &nodes {
                            Some(nodes) => Some(nodes.round_trips(rtt_time).await?),
                            None => None,
                        };
                        let recipe = if name == "quorum-floor-1" {
                            Recipe::Floor
                        } else {
                            Recipe::Leasehold
                        };
                        let mut outcome = scenario::in_process(&all_nodes, name, 1, recipe).await?;
                        outcome.node_rtts = rtts;
                        anyhow::Ok(outcome)
                    }
                    .await
                }
                "quorum-64" => scenario::in_process(&all_nodes, name, 64, Recipe::Leasehold).await,
                "quorum-contended-8p" => {
                    scenario::contended(&all_nodes, name, 8, Recipe::Leasehold, "mutex").await
                }
                "floor-1" | "etcd-lock-1" => {
                    scenario::in_process(&setup, name, 1, Recipe::Floor).await
                }
                "peer-1" => scenario::in_process(&setup, name, 1, Recipe::Peer).await,
                "uncontended-1" => scenario::in_process(&setup, name, 1, Recipe::Leasehold).await,
                "floor-64" | "etcd-lock-64" => {
                    scenario::in_process(&setup, name, 64, Recipe::Floor).await
                }
                "peer-64" => scenario::in_process(&setup, name, 64, Recipe::Peer).await,
                "uncontended-64" => scenario::in_process(&setup, name, 64, Recipe::Leasehold).await,
                "floor-8p" | "etcd-lock-8p" => {
                    scenario::contended(&setup, name, 8, Recipe::Floor, "mutex").await
                }
                "peer-8p" => scenario::contended(&setup, name, 8, Recipe::Peer, "mutex").await,
                "contended-8p" => {
                    scenario::contended(&setup, name, 8, Recipe::Leasehold, "mutex").await
                }
                "handoff" => scenario::handoff(&setup, name, "mutex").await,
                "fair-8p" => scenario::contended(&setup, name, 8, Recipe::Leasehold, "fair").await,
                "fair-handoff" => scenario::handoff(&setup, name, "fair").await,
                "rw-8p" => scenario::contended(&setup, name, 8, Recipe::Leasehold, "rw").await,
                "semaphore-8p" => {
                    scenario::contended(&setup, name, 8, Recipe::Leasehold, "semaphore:4").await
                }
                _ => scenario::renew(&setup, name).await,
            }
            .with_context(|| format!("scenario {name}"))?;
            outcome.floor_rate = outcomes
                .iter()
                .find(|o| floors_of(name).contains(&o.scenario))
                .map(Outcome::rate);
            let peer = match name {
                "uncontended-1" => Some("peer-1"),
                "uncontended-64" => Some("peer-64"),
                "contended-8p" => Some("peer-8p"),
                _ => None,
            };
            outcome.peer_rate = peer
                .and_then(|p| outcomes.iter().find(|o| o.scenario == p))
                .map(Outcome::rate);
            outcome.on_quorum = nodes.as_ref().map(|nodes| OnQuorum {
                nodes: nodes.len(),
                all_nodes: name.starts_with("quorum-"),
            });
            outcome.on_etcd = on_etcd;
            // On stderr whether it is a terminal or not (a CI log, a pipe): a long run is never silent.
            exit::print_err(&result_line(&outcome, index + 1, chosen.len()));
            if args.json {
                println!("{}", outcome.to_json());
            }
            outcomes.push(outcome);
        }
        anyhow::Ok(outcomes)
    };
    let outcomes = tokio::select! {
        outcomes = run => outcomes?,
        _ = tokio::signal::ctrl_c() => return Err(exit::fail(130, "interrupted")),
    };
    if !args.json {
        print!("{}", table(&outcomes));
        if on_etcd {
            println!("{ON_ETCD}");
        }
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&outcomes))
            .with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            println!("latency plot written to {}", path.display());
        }
    }
    drop(private);
    Ok(0)
}

/// On a cluster, how many requests carried a period's renewal calls (one pipeline per node, ideally).
fn requests(r: &Renewal) -> String {
    r.requests_per_period
        .map(|n| format!(" in {n:.0} requests"))
        .unwrap_or_default()
}

/// The line printed on stderr when a scenario ends: what it measured, in a few words.
fn result_line(o: &Outcome, number: usize, of: usize) -> String {
    let what = match &o.renewal {
        Some(r) => format!(
            "{} locks {} through {} renewal periods, {:.0} renewal calls per period{}",
            r.locks,
            if r.all_held { "held" } else { "NOT all held" },
            r.periods,
            r.calls_per_period,
            requests(r)
        ),
        None => format!(
            "{} acquisitions in {}, {:.0}/s, p50 {:.0} µs",
            o.acquisitions,
            crate::duration::show(o.elapsed),
            o.rate(),
            o.samples.quantile_us(0.5)
        ),
    };
    format!("bench [{number}/{of}] {}: {what}", o.scenario)
}

/// The results as a text table: one unit per column, named in the header.
fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    // Wide enough for the longest name (quorum-contended-8p); as wide as ever without a quorum.
    let name_width = outcomes
        .iter()
        .map(|o| o.scenario.chars().count())
        .max()
        .unwrap_or(0)
        .max(15);
    out.push_str(&format!(
        "{:<name_width$} {:>11} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}  {}\n",
        "scenario",
        "acquires/s",
        "p50 µs",
        "p99 µs",
        "max µs",
        "× floor",
        "srv µs/cycle",
        "cli µs/cycle",
        "notes"
    ));
    for o in outcomes {
        let (p50, p99, max) = if o.samples.len() > 0 {
            (
                micros(o.samples.quantile_us(0.5)),
                micros(o.samples.quantile_us(0.99)),
                micros(o.samples.quantile_us(1.0)),
            )
        } else {
            ("-".to_owned(), "-".to_owned(), "-".to_owned())
        };
        let ratio = o
            .floor_ratio()
            .map_or("-".to_owned(), |r| format!("{r:.2}"));
        let mut notes = Vec::new();
        if let Some(peer) = o.peer_ratio() {
            notes.push(format!("× peer {peer:.2}"));
        }
        if let Some(share) = o.share_ratio() {
            notes.push(format!("share min/max {share:.2}"));
        }
        if let Some(s) = o.spread {
            notes.push(format!(
                "{} {} on {} {}, {} of {} primaries",
                s.keys,
                if s.keys == 1 { "key" } else { "keys" },
                s.slots,
                if s.slots == 1 { "slot" } else { "slots" },
                s.primaries,
                s.of_primaries
            ));
        }
        if let Some(p99) = o.write_p99_us {
            notes.push(format!("writes p99 {} µs", micros(p99)));
        }
        if let (Some(rtt), Some(ratio)) = (o.rtt_p50_us, o.handoff_to_rtt()) {
            notes.push(format!(
                "p50 = {ratio:.2} × raw round trip ({} µs)",
                micros(rtt)
            ));
        }
        if let (Some(rtts), Some(ratio)) = (&o.node_rtts, o.p50_to_majority_rtt()) {
            let each: Vec<String> = rtts.p50_us.iter().map(|&us| micros(us)).collect();
            notes.push(format!(
                "node round trips {} µs; p50 = {ratio:.2} × the {} fastest ({} µs); all at once: {} µs to a \
                 majority, {} µs to all",
                each.join(", "),
                ordinal(rtts.majority),
                micros(rtts.majority_us()),
                micros(rtts.at_once_majority_us),
                micros(rtts.at_once_all_us)
            ));
        }
        if o.on_quorum.is_some_and(|q| !q.all_nodes) {
            notes.push("first node alone".to_owned());
        }
        if let Some(r) = &o.renewal {
            notes.push(format!(
                "{} locks {}, {:.0} renewal calls/period{}, {:.2} s CPU, {:.0} B/lock",
                r.locks,
                if r.all_held {
                    "all held"
                } else {
                    "NOT all held"
                },
                r.calls_per_period,
                requests(r),
                r.cpu_seconds,
                r.bytes_per_lock
            ));
        }
        let server = o
            .server_us_per_cycle()
            .map_or("-".to_owned(), |us| format!("{us:.1}"));
        let client = o
            .client_us_per_cycle()
            .map_or("-".to_owned(), |us| format!("{us:.1}"));
        let row = format!(
            "{:<name_width$} {:>11.0} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}  {}",
            o.scenario,
            o.rate(),
            p50,
            p99,
            max,
            ratio,
            server,
            client,
            notes.join("; ")
        );
        out.push_str(row.trim_end());
        out.push('\n');
    }
    match outcomes.iter().find(|o| o.cpu_primaries.is_some()) {
        Some(Outcome {
            cpu_primaries: Some(members),
            on_etcd: true,
            ..
        }) => out.push_str(&format!(
            "on etcd: srv µs/cycle is the CPU time of all {members} members the URL names together\n"
        )),
        Some(Outcome {
            cpu_primaries: Some(primaries),
            ..
        }) => out.push_str(&format!(
            "on a cluster: srv µs/cycle is the CPU time of all {primaries} primaries together (replicas not counted)\n"
        )),
        _ => {}
    }
    if let Some(q) = outcomes
        .iter()
        .find_map(|o| o.on_quorum.filter(|q| q.all_nodes))
    {
        out.push_str(&format!(
            "on a quorum: srv µs/cycle of a quorum-* row is the CPU time of all {} nodes together\n",
            q.nodes
        ));
    }
    out
}

/// `3rd`, for "the 3rd fastest".
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Microseconds, whole: every latency column is in µs, however large.
fn micros(us: f64) -> String {
    format!("{us:.0}")
}

#[cfg(test)]
mod tests {

    use super::stats::Renewal;
    use super::*;

    #[test]
    fn the_table_has_one_unit_per_column_named_in_the_header() {
        let mut floor = Outcome::measured("floor-1", &[30, 40, 50]);
        // 300 µs of server CPU over 3 cycles.
        floor.server_cpu_s = Some(0.000_3);
        let mut lock = Outcome::measured("uncontended-1", &[45, 60, 25_000]);
        lock.floor_rate = Some(4.0);
        lock.peer_rate = Some(6.0);
        let mut renew = Outcome::measured("renew-10k", &[]);
        renew.acquisitions = 10_000;
        renew.renewal = Some(Renewal {
            locks: 10_000,
            all_held: true,
            periods: 3,
            calls_per_period: 27.0,
            requests_per_period: None,
            cpu_seconds: 0.1,
            bytes_per_lock: 779.0,
        });
        let text = table(&[floor, lock, renew]);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0][..9],
            [
                "scenario",
                "acquires/s",
                "p50",
                "µs",
                "p99",
                "µs",
                "max",
                "µs",
                "×"
            ]
        );
        assert_eq!(
            rows[1][..7],
            ["floor-1", "3", "40", "50", "50", "-", "100.0"]
        );
        assert_eq!(rows[2][6], "-", "no server figure: a dash");
        // 25 ms stays in µs: a column never switches unit.
        assert_eq!(
            rows[2][..6],
            ["uncontended-1", "3", "60", "25000", "25000", "0.75"]
        );
        // Beside the peer's recipe in the same run, in the notes: 3/s against 6/s.
        assert!(
            text.lines().nth(2).unwrap().ends_with("× peer 0.50"),
            "{text}"
        );
        assert_eq!(rows[3][..6], ["renew-10k", "10000", "-", "-", "-", "-"]);
        for row in &rows[1..] {
            for cell in &row[1..6] {
                assert!(
                    *cell == "-" || cell.parse::<f64>().is_ok(),
                    "{cell:?} in {text}"
                );
            }
        }
    }

    #[test]
    fn a_cluster_table_says_where_keys_live_and_whose_cpu_it_sums() {
        let mut floor = Outcome::measured("floor-64", &[30, 40, 50]);
        floor.server_cpu_s = Some(0.000_3);
        floor.client_cpu_s = Some(0.000_06);
        floor.cpu_primaries = Some(3);
        floor.spread = Some(raw::Spread {
            keys: 64,
            slots: 64,
            primaries: 3,
            of_primaries: 3,
        });
        let text = table(&[floor]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].ends_with("100.0         20.0  64 keys on 64 slots, 3 of 3 primaries"),
            "{text}"
        );
        assert_eq!(
            lines[2],
            "on a cluster: srv µs/cycle is the CPU time of all 3 primaries together (replicas not counted)"
        );
        let single = table(&[Outcome::measured("floor-1", &[30])]);
        assert_eq!(single.lines().count(), 2, "one server: no footer");
    }

    #[test]
    fn a_quorum_table_sets_the_acquire_beside_the_round_trip_to_each_node() {
        let on_all = Some(OnQuorum {
            nodes: 5,
            all_nodes: true,
        });
        let mut floor = Outcome::measured("quorum-floor-1", &[100, 110, 120]);
        floor.on_quorum = on_all;
        let mut lock = Outcome::measured("quorum-1", &[130, 140, 150]);
        lock.on_quorum = on_all;
        lock.floor_rate = Some(3.0);
        lock.server_cpu_s = Some(0.000_3);
        lock.node_rtts = Some(quorum::NodeRtts {
            p50_us: vec![70.0, 60.0, 400.0, 90.0, 65.0],
            majority: 3,
            at_once_majority_us: 110.0,
            at_once_all_us: 420.0,
        });
        let mut single = Outcome::measured("uncontended-1", &[50, 60, 70]);
        single.on_quorum = Some(OnQuorum {
            nodes: 5,
            all_nodes: false,
        });
        let mut contended = Outcome::measured("quorum-contended-8p", &[500, 600, 700]);
        contended.on_quorum = on_all;
        let text = table(&[floor, lock, single, contended]);
        let lines: Vec<&str> = text.lines().collect();
        // The name column is as wide as the longest name, and every row keeps to it.
        let rate_end = lines[0].find("acquires/s").unwrap() + "acquires/s".len();
        assert_eq!(rate_end, "quorum-contended-8p".len() + 1 + 11, "{text}");
        for line in &lines[1..5] {
            assert!(line[..rate_end].ends_with('3'), "{line:?} in {text}");
        }
        assert_eq!(
            lines[2].split_whitespace().take(7).collect::<Vec<_>>(),
            ["quorum-1", "3", "140", "150", "150", "1.00", "100.0"]
        );
        assert!(
            lines[2].ends_with(
                "node round trips 70, 60, 400, 90, 65 µs; p50 = 2.00 × the 3rd fastest (70 µs); \
                 all at once: 110 µs to a majority, 420 µs to all"
            ),
            "{text}"
        );
        assert!(lines[3].ends_with("  first node alone"), "{text}");
        assert_eq!(
            lines[5],
            "on a quorum: srv µs/cycle of a quorum-* row is the CPU time of all 5 nodes together"
        );
        assert_eq!(lines.len(), 6, "{text}");
        // Without a quorum, the name column keeps its width.
        let single = table(&[Outcome::measured("floor-1", &[30])]);
        assert_eq!(
            single.find("acquires/s"),
            Some(16 + 11 - "acquires/s".len())
        );
    }

    #[test]
    fn ordinals_name_the_majority() {
        let names: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 23].map(ordinal).into();
        assert_eq!(
            names,
            ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd"]
        );
    }

    #[test]
    fn result_lines_say_what_each_scenario_measured() {
        let floor = Outcome::measured("floor-1", &[30, 40, 50]);
        assert_eq!(
            result_line(&floor, 1, 7),
            "bench [1/7] floor-1: 3 acquisitions in 1s, 3/s, p50 40 µs"
        );
        let mut renew = Outcome::measured("renew-10k", &[]);
        renew.renewal = Some(Renewal {
            locks: 10_000,
            all_held: false,
            periods: 3,
            calls_per_period: 27.4,
            requests_per_period: None,
            cpu_seconds: 0.1,
            bytes_per_lock: 779.0,
        });
        assert_eq!(
            result_line(&renew, 7, 7),
            "bench [7/7] renew-10k: 10000 locks NOT all held through 3 renewal periods, 27 renewal calls per period"
        );
        if let Some(r) = renew.renewal.as_mut() {
            r.requests_per_period = Some(6.3);
        }
        assert_eq!(
            result_line(&renew, 7, 7),
            "bench [7/7] renew-10k: 10000 locks NOT all held through 3 renewal periods, 27 renewal calls per period in 6 requests"
        );
    }
}

//! `leasehold bench`: leasehold against the raw-Redis floor, on any Redis, in one run.
//!
//! | scenario | what runs |
//! |---|---|
//! | `floor-1` | 1 task: `SET NX PX` + owner-checked delete script, on a redis-rs `ConnectionManager` |
//! | `uncontended-1` | 1 task: leasehold `lock()` + `release()` on its own key |
//! | `floor-64` / `uncontended-64` | the same with 64 tasks in this process, distinct keys |
//! | `floor-8p` | 8 worker processes spinning on ONE key: `SET NX PX` until granted, then the owner-checked delete |
//! | `contended-8p` | 8 worker processes looping on ONE lock (leasehold), empty critical section |
//! | `handoff` | 2 worker processes taking turns: release → the waiting other holds it |
//! | `renew-10k` | one worker process holds 10,000 locks through 3 renewal periods (1 s) of a 3 s lease |
//!
//! Every scenario runs on a Redis Cluster too (`--redis redis+cluster://h:p,h:p,…`): the floor then uses redis-rs's
//! cluster connection, the server's CPU time and script calls are summed over every primary, and the in-process
//! scenarios say how their keys spread over slots and primaries (`bench:N`, which leasehold uses as the hash tag).

mod plot;
mod raw;
mod scenario;
mod stats;
pub mod worker;

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::exit;
use crate::server::PrivateServer;
use scenario::Setup;
use stats::Outcome;

/// Every scenario, in the order they run.
pub const SCENARIOS: [&str; 12] = [
    "floor-1",
    "uncontended-1",
    "floor-64",
    "uncontended-64",
    "floor-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// `leasehold bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Use this Redis server (or cluster: redis+cluster://host:port,host:port,…) instead of starting a private one.
    #[arg(long = "redis", value_name = "URL")]
    pub redis: Option<String>,

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
    if SCENARIOS.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "unknown scenario {name:?}; known: {}",
            SCENARIOS.join(", ")
        ))
    }
}

/// Runs the benchmark and prints its results.
pub async fn bench(args: BenchArgs) -> anyhow::Result<u8> {
    if args.duration > Duration::from_secs(3600) {
        return Err(exit::fail(exit::USAGE, "--duration is limited to 1h"));
    }
    let (url, private) = match &args.redis {
        Some(url) => (url.clone(), None),
        None => {
            let server =
                PrivateServer::start().map_err(|e| exit::fail(exit::UNAVAILABLE, e.to_string()))?;
            (server.url(), Some(server))
        }
    };
    // Fail early, with the usual exit status, when the server cannot be used.
    crate::connect::client(&url, None).await?;
    let setup = Setup {
        raw: raw::Raw::open(&url)?,
        url,
        warmup: (args.duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        duration: args.duration,
        progress: !args.json,
    };
    let wanted = |name: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|s| s == name);
    let chosen: Vec<&'static str> = SCENARIOS.into_iter().filter(|n| wanted(n)).collect();
    let run = async {
        let mut outcomes: Vec<Outcome> = Vec::new();
        for (index, &name) in chosen.iter().enumerate() {
            let mut outcome = match name {
                "floor-1" => scenario::in_process(&setup, name, 1, true).await,
                "uncontended-1" => scenario::in_process(&setup, name, 1, false).await,
                "floor-64" => scenario::in_process(&setup, name, 64, true).await,
                "uncontended-64" => scenario::in_process(&setup, name, 64, false).await,
                "floor-8p" => scenario::contended(&setup, name, 8, true, "mutex").await,
                "contended-8p" => scenario::contended(&setup, name, 8, false, "mutex").await,
                "handoff" => scenario::handoff(&setup, name, "mutex").await,
                "fair-8p" => scenario::contended(&setup, name, 8, false, "fair").await,
                "fair-handoff" => scenario::handoff(&setup, name, "fair").await,
                "rw-8p" => scenario::contended(&setup, name, 8, false, "rw").await,
                "semaphore-8p" => scenario::contended(&setup, name, 8, false, "semaphore:4").await,
                _ => scenario::renew(&setup, name).await,
            }
            .with_context(|| format!("scenario {name}"))?;
            let floor = match name {
                "uncontended-1" => Some("floor-1"),
                "uncontended-64" => Some("floor-64"),
                "contended-8p" | "fair-8p" => Some("floor-8p"),
                _ => None,
            };
            outcome.floor_rate = floor
                .and_then(|f| outcomes.iter().find(|o| o.scenario == f))
                .map(Outcome::rate);
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

/// The line printed on stderr when a scenario ends: what it measured, in a few words.
fn result_line(o: &Outcome, number: usize, of: usize) -> String {
    let what = match &o.renewal {
        Some(r) => format!(
            "{} locks {} through {} renewal periods, {:.0} renewal calls per period",
            r.locks,
            if r.all_held { "held" } else { "NOT all held" },
            r.periods,
            r.calls_per_period
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
    out.push_str(&format!(
        "{:<15} {:>11} {:>9} {:>9} {:>9} {:>9} {:>12}  {}\n",
        "scenario", "acquires/s", "p50 µs", "p99 µs", "max µs", "× floor", "srv µs/cycle", "notes"
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
        if let Some(r) = &o.renewal {
            notes.push(format!(
                "{} locks {}, {:.0} renewal calls/period, {:.2} s CPU, {:.0} B/lock",
                r.locks,
                if r.all_held {
                    "all held"
                } else {
                    "NOT all held"
                },
                r.calls_per_period,
                r.cpu_seconds,
                r.bytes_per_lock
            ));
        }
        let server = o
            .server_us_per_cycle()
            .map_or("-".to_owned(), |us| format!("{us:.1}"));
        let row = format!(
            "{:<15} {:>11.0} {:>9} {:>9} {:>9} {:>9} {:>12}  {}",
            o.scenario,
            o.rate(),
            p50,
            p99,
            max,
            ratio,
            server,
            notes.join("; ")
        );
        out.push_str(row.trim_end());
        out.push('\n');
    }
    if let Some(primaries) = outcomes.iter().find_map(|o| o.cpu_primaries) {
        out.push_str(&format!(
            "on a cluster: srv µs/cycle is the CPU time of all {primaries} primaries together (replicas not counted)\n"
        ));
    }
    out
}

/// Microseconds, whole: every latency column is in µs, however large.
fn micros(us: f64) -> String {
    format!("{us:.0}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::stats::{Renewal, Samples};
    use super::*;

    fn outcome(scenario: &'static str, latencies_us: &[u64]) -> Outcome {
        let mut samples = Samples::default();
        for &us in latencies_us {
            samples.push(Duration::from_micros(us));
        }
        Outcome {
            scenario,
            processes: 1,
            tasks: 1,
            elapsed: Duration::from_secs(1),
            acquisitions: samples.len() as u64,
            samples: samples.sorted(),
            per_process: Vec::new(),
            floor_rate: None,
            rtt_p50_us: None,
            renewal: None,
            server_cpu_s: None,
            cpu_primaries: None,
            write_p99_us: None,
            spread: None,
        }
    }

    #[test]
    fn the_table_has_one_unit_per_column_named_in_the_header() {
        let mut floor = outcome("floor-1", &[30, 40, 50]);
        // 300 µs of server CPU over 3 cycles.
        floor.server_cpu_s = Some(0.000_3);
        let mut lock = outcome("uncontended-1", &[45, 60, 25_000]);
        lock.floor_rate = Some(4.0);
        let mut renew = outcome("renew-10k", &[]);
        renew.acquisitions = 10_000;
        renew.renewal = Some(Renewal {
            locks: 10_000,
            all_held: true,
            periods: 3,
            calls_per_period: 27.0,
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
        let mut floor = outcome("floor-64", &[30, 40, 50]);
        floor.server_cpu_s = Some(0.000_3);
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
            lines[1].ends_with("100.0  64 keys on 64 slots, 3 of 3 primaries"),
            "{text}"
        );
        assert_eq!(
            lines[2],
            "on a cluster: srv µs/cycle is the CPU time of all 3 primaries together (replicas not counted)"
        );
        let single = table(&[outcome("floor-1", &[30])]);
        assert_eq!(single.lines().count(), 2, "one server: no footer");
    }

    #[test]
    fn result_lines_say_what_each_scenario_measured() {
        let floor = outcome("floor-1", &[30, 40, 50]);
        assert_eq!(
            result_line(&floor, 1, 7),
            "bench [1/7] floor-1: 3 acquisitions in 1s, 3/s, p50 40 µs"
        );
        let mut renew = outcome("renew-10k", &[]);
        renew.renewal = Some(Renewal {
            locks: 10_000,
            all_held: false,
            periods: 3,
            calls_per_period: 27.4,
            cpu_seconds: 0.1,
            bytes_per_lock: 779.0,
        });
        assert_eq!(
            result_line(&renew, 7, 7),
            "bench [7/7] renew-10k: 10000 locks NOT all held through 3 renewal periods, 27 renewal calls per period"
        );
    }
}

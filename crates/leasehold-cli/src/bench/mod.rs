//! `leasehold bench`: leasehold against the raw-Redis floor, on any Redis, in one run.
//!
//! | scenario | what runs |
//! |---|---|
//! | `floor-1` | 1 task: `SET NX PX` + owner-checked delete script, on a redis-rs `ConnectionManager` |
//! | `uncontended-1` | 1 task: leasehold `lock()` + `release()` on its own key |
//! | `floor-64` / `uncontended-64` | the same with 64 tasks in this process, distinct keys |
//! | `contended-8p` | 8 worker processes looping on ONE lock, empty critical section |
//! | `handoff` | 2 worker processes taking turns: release → the waiting other holds it |
//! | `renew-10k` | one worker process holds 10,000 locks through 3 renewal periods (1 s) of a 3 s lease |

mod plot;
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
pub const SCENARIOS: [&str; 7] = [
    "floor-1",
    "uncontended-1",
    "floor-64",
    "uncontended-64",
    "contended-8p",
    "handoff",
    "renew-10k",
];

/// `leasehold bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Use this Redis server instead of starting a private one.
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
        url,
        warmup: (args.duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        duration: args.duration,
        progress: !args.json,
    };
    let wanted = |name: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|s| s == name);
    let run = async {
        let mut outcomes: Vec<Outcome> = Vec::new();
        for name in SCENARIOS.into_iter().filter(|n| wanted(n)) {
            let mut outcome = match name {
                "floor-1" => scenario::in_process(&setup, name, 1, true).await,
                "uncontended-1" => scenario::in_process(&setup, name, 1, false).await,
                "floor-64" => scenario::in_process(&setup, name, 64, true).await,
                "uncontended-64" => scenario::in_process(&setup, name, 64, false).await,
                "contended-8p" => scenario::contended(&setup, name, 8).await,
                "handoff" => scenario::handoff(&setup, name).await,
                _ => scenario::renew(&setup, name).await,
            }
            .with_context(|| format!("scenario {name}"))?;
            let floor = match name {
                "uncontended-1" => Some("floor-1"),
                "uncontended-64" => Some("floor-64"),
                _ => None,
            };
            outcome.floor_rate = floor
                .and_then(|f| outcomes.iter().find(|o| o.scenario == f))
                .map(Outcome::rate);
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

/// The results as a text table.
fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<15} {:>11} {:>10} {:>10} {:>10} {:>9}  {}\n",
        "scenario", "acquires/s", "p50", "p99", "max", "vs floor", "notes"
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
            .map_or("-".to_owned(), |r| format!("{r:.2}x"));
        let mut notes = Vec::new();
        if let Some(share) = o.share_ratio() {
            notes.push(format!("share min/max {share:.2}"));
        }
        if let (Some(rtt), Some(ratio)) = (o.rtt_p50_us, o.handoff_to_rtt()) {
            notes.push(format!(
                "p50 = {ratio:.2} x raw round trip ({})",
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
        out.push_str(&format!(
            "{:<15} {:>11.0} {:>10} {:>10} {:>10} {:>9}  {}\n",
            o.scenario,
            o.rate(),
            p50,
            p99,
            max,
            ratio,
            notes.join("; ")
        ));
    }
    out
}

fn micros(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{us:.0}µs")
    }
}

//! The bench's output: the table of every scenario's results, and the line each scenario prints on stderr as it
//! ends.

use super::stats::{Outcome, Renewal};
use crate::stores::Store;

/// On a cluster, how many requests carried a period's renewal calls (one pipeline per node, ideally).
fn requests(r: &Renewal) -> String {
    r.requests_per_period
        .map(|n| format!(" in {n:.0} requests"))
        .unwrap_or_default()
}

/// The line printed on stderr when a scenario ends: what it measured, in a few words.
pub(super) fn result_line(o: &Outcome, number: usize, of: usize) -> String {
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

/// What a leasehold row's second ratio is against (see `bench::peers_of`): rslock's recipe on Redis, the durable
/// lease row in its place on the SQL stores.
fn peer_of(store: Store) -> &'static str {
    match store {
        Store::Postgres | Store::MySql => "row floor",
        Store::Redis | Store::Etcd | Store::ZooKeeper => "peer",
    }
}

/// The results as a text table: one unit per column, named in the header.
pub(super) fn table(outcomes: &[Outcome]) -> String {
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
            notes.push(format!("× {} {peer:.2}", peer_of(o.store)));
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
            cpu_primaries: Some(servers),
            store,
            ..
        }) if *store != Store::Redis => out.push_str(&format!(
            "on {}: srv µs/cycle is the CPU time of all {servers} {} the URL names together\n",
            store.name(),
            if *store == Store::Etcd {
                "members"
            } else {
                "servers"
            }
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
    use super::super::stats::OnQuorum;
    use super::super::{quorum, raw};
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
    fn the_sql_stores_set_leasehold_beside_their_row_floor() {
        for store in [Store::Postgres, Store::MySql] {
            let mut lock = Outcome::measured("uncontended-1", &[300]);
            lock.peer_rate = Some(lock.rate() * 2.0);
            lock.store = store;
            let text = table(&[lock]);
            assert!(text.trim_end().ends_with("× row floor 0.50"), "{text}");
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
    fn an_etcd_table_sums_the_cpu_of_the_members() {
        let mut floor = Outcome::measured("etcd-lock-1", &[600, 700, 800]);
        floor.store = Store::Etcd;
        floor.cpu_primaries = Some(3);
        floor.server_cpu_s = Some(0.003);
        let text = table(&[floor]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2],
            "on etcd: srv µs/cycle is the CPU time of all 3 members the URL names together"
        );
        let mut single = Outcome::measured("etcd-lock-1", &[600]);
        single.store = Store::Etcd;
        assert_eq!(table(&[single]).lines().count(), 2, "one member: no footer");
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

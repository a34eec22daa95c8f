//! The demo's results: a table with a line of explanation per round, or one JSON object.

use serde_json::json;

use super::buyer::{FENCED_STALL, FENCED_TTL, TEXTBOOK_TTL};
use super::{Outcome, Round, BUYERS, STOCK};
use crate::duration::show;

/// Everything the demo shows at the end.
pub struct Shown {
    /// The private server's pid and port, when the demo started one.
    pub server: Option<(u32, u16)>,
    /// One per round played.
    pub outcomes: Vec<Outcome>,
}

const HEADERS: [&str; 6] = [
    "round",
    "units sold",
    "final stock",
    "oversold by",
    "stale writes rejected",
    "time",
];

/// The table and the explanations, ready to print.
pub fn table(shown: &Shown) -> String {
    let rows: Vec<[String; 6]> = shown
        .outcomes
        .iter()
        .map(|o| {
            [
                format!("{}. {}", o.round.number(), o.round.title()),
                o.sold.to_string(),
                o.stock.to_string(),
                o.oversold().to_string(),
                o.stale_rejected.map_or("-".to_owned(), |n| n.to_string()),
                format!("{:.2}s", o.elapsed.as_secs_f64()),
            ]
        })
        .collect();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i == 0 {
                out.push_str(&format!("{cell:<width$}"));
            } else {
                out.push_str(&format!("  {cell:>width$}"));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&HEADERS.map(str::to_owned));
    out.push_str(&line(&widths.map(|w| "-".repeat(w))));
    for row in &rows {
        out.push_str(&line(row));
    }
    out.push('\n');
    for outcome in &shown.outcomes {
        let text = format!("{}. {}", outcome.round.number(), explain(outcome));
        out.push_str(&wrap(&text, TEXT_WIDTH, "   "));
    }
    out.push_str(CURE);
    out
}

/// What round 3 changed, under the table: the buyer's lines around its read and write, or the command that does the
/// same for any program.
const CURE: &str = "
The cure (round 3) is three lines around the buyer's read and write:
    let locks = leasehold::Client::connect(url).await?;
    let guard = locks.mutex(\"stock\").lock().await?;
    /* read the stock, pause, write it back minus one */ guard.release().await?;
or, around any program: leasehold run stock ./buy.sh
";

/// The explanations are wrapped to this many columns.
const TEXT_WIDTH: usize = 96;

/// `text` broken into lines of at most `width` columns (longer words stay whole), continuation lines indented.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.trim().is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = indent.to_owned();
        } else if !line.trim().is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.trim().is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// What a round's numbers mean, in one sentence.
fn explain(o: &Outcome) -> String {
    let oversold = o.oversold();
    match o.round {
        Round::NoLock if oversold > 0 => format!(
            "No lock: the {BUYERS} buyers start each purchase together, as a flash sale's requests arrive; all read \
             the same stock, and each wrote back what it read minus one over the others' writes: {} units sold from \
             a stock of {STOCK}.",
            o.sold
        ),
        Round::NoLock => "No lock: this time the buyers happened not to collide.".to_owned(),
        Round::Textbook => {
            let deletes = o.foreign_deletes.unwrap_or(0);
            let mut text = format!(
                "Textbook lock: buyer 0 read the stock holding a {} lock, then was stopped (SIGSTOP, as a GC pause or a \
                 VM freeze stops a process). The lock expired and the others sold the whole stock. Resumed (SIGCONT), \
                 buyer 0 wrote back the stock it had read, minus one, putting sold units back on the shelf, and sold \
                 them again: {} sold, {} more than there were.",
                show(TEXTBOOK_TTL),
                o.sold,
                oversold
            );
            if deletes > 0 {
                text.push_str(&format!(
                    " Blind DELs removed {deletes} lock{} another buyer held, letting two buyers in at once.",
                    if deletes == 1 { "" } else { "s" }
                ));
            }
            text
        }
        Round::Leasehold if oversold == 0 && o.stock == 0 => {
            format!("leasehold: one holder at a time; exactly {STOCK} sold, nothing left, nothing oversold.")
        }
        Round::Leasehold => "leasehold: UNEXPECTED: the locked round did not sell exactly the stock.".to_owned(),
        Round::Fenced => {
            let stale = o.stale_rejected.unwrap_or(0);
            format!(
                "leasehold + fenced store: buyer 0 froze {} with a {} lease; the next holder got a higher fence, and the \
                 store refused {stale} late write{} carrying the old one. {} sold, stock {}.",
                show(FENCED_STALL),
                show(FENCED_TTL),
                if stale == 1 { "" } else { "s" },
                o.sold,
                o.stock
            )
        }
    }
}

/// One JSON object with the same numbers as the table.
pub fn json(shown: &Shown) -> String {
    let rounds: Vec<_> = shown
        .outcomes
        .iter()
        .map(|o| {
            json!({
                "round": o.round.number(),
                "name": o.round.title(),
                "units_sold": o.sold,
                "final_stock": o.stock,
                "oversold_by": o.oversold(),
                "stale_writes_rejected": o.stale_rejected,
                "foreign_locks_deleted": o.foreign_deletes,
                "seconds": (o.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            })
        })
        .collect();
    let server = shown
        .server
        .map(|(pid, port)| json!({ "pid": pid, "port": port }));
    json!({
        "stock": STOCK,
        "buyers": BUYERS,
        "server": server,
        "rounds": rounds,
    })
    .to_string()
        + "\n"
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn outcome(round: Round, sold: i64, stock: i64) -> Outcome {
        Outcome {
            round,
            sold,
            stock,
            stale_rejected: (round == Round::Fenced).then_some(1),
            foreign_deletes: (round == Round::Textbook).then_some(2),
            elapsed: Duration::from_millis(1234),
        }
    }

    #[test]
    fn wrapping_keeps_words_and_indents() {
        assert_eq!(wrap("aa bb cc dd", 5, " "), "aa bb\n cc\n dd\n");
        assert_eq!(wrap("abcdefgh ij", 5, ""), "abcdefgh\nij\n");
    }

    #[test]
    fn the_table_lines_up_and_explains_each_round() {
        let shown = Shown {
            server: None,
            outcomes: vec![
                outcome(Round::NoLock, 812, 0),
                outcome(Round::Textbook, 163, 0),
                outcome(Round::Leasehold, 100, 0),
                outcome(Round::Fenced, 100, 0),
            ],
        };
        let text = table(&shown);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("round"));
        assert!(lines[2].starts_with("1. no lock"));
        assert!(lines[2].contains("812") && lines[2].contains("712"));
        assert!(lines[5].contains("1.23s"));
        assert!(text.contains("refused 1 late write"));
        assert!(
            text.contains("locks.mutex(\"stock\").lock().await?"),
            "{text}"
        );
        assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
        let value: serde_json::Value = serde_json::from_str(&json(&shown)).unwrap();
        assert_eq!(value["rounds"][0]["oversold_by"], 712);
        assert_eq!(
            value["rounds"][0]["stale_writes_rejected"],
            serde_json::Value::Null
        );
        assert_eq!(value["rounds"][3]["stale_writes_rejected"], 1);
        assert_eq!(value["server"], serde_json::Value::Null);
    }
}

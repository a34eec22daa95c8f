//! A one-line progress bar on stderr, drawn only when stderr is a terminal (through [`crate::stderr`]'s queue, in
//! order with every other line).

use std::io::IsTerminal as _;

const WIDTH: u64 = 30;

/// A progress bar redrawn in place with a carriage return.
pub struct Bar {
    shown: bool,
    label: String,
}

impl Bar {
    /// A bar labelled `label`; it draws nothing unless `wanted` and stderr is a terminal.
    pub fn new(wanted: bool, label: String) -> Bar {
        Bar {
            shown: wanted && std::io::stderr().is_terminal(),
            label,
        }
    }

    /// True when the bar draws anything: callers can skip the work of measuring progress otherwise.
    pub fn is_shown(&self) -> bool {
        self.shown
    }

    /// Redraws the bar at `done` of `total`, followed by `note`.
    pub fn show(&mut self, done: i64, total: i64, note: &str) {
        if !self.shown {
            return;
        }
        let total = u64::try_from(total.max(1)).unwrap_or(1);
        let done = u64::try_from(done.max(0)).unwrap_or(0).min(total);
        let filled = usize::try_from(done * WIDTH / total).unwrap_or(0);
        let empty = usize::try_from(WIDTH).unwrap_or(0) - filled;
        crate::stderr::write(format!(
            "\r\x1b[2K{} [{}{}] {note}",
            self.label,
            "#".repeat(filled),
            "-".repeat(empty)
        ));
    }

    /// Erases the bar, leaving the line free for whatever is printed next.
    pub fn clear(&mut self) {
        if self.shown {
            crate::stderr::write("\r\x1b[2K");
        }
    }

    /// Draws the bar a last time and moves to the next line, leaving it on screen.
    pub fn finish(&mut self, done: i64, total: i64, note: &str) {
        self.show(done, total, note);
        if self.shown {
            crate::stderr::write("\n");
        }
    }
}

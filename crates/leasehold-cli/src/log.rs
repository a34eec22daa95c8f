//! The library's outage warning (a wait riding out a Redis restart) printed as one `leasehold: warning:` line on
//! stderr. A subscriber of its own, a few lines long, instead of a logging framework: this is the only event the
//! command shows; everything else the library traces, the command reports in its own words.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::exit;

/// The target of the library's outage events.
const OUTAGE: &str = "leasehold::outage";

/// Prints warnings with the outage target; ignores the rest.
pub struct OutageWarnings;

/// Installs [`OutageWarnings`] for the whole process (once; later calls change nothing).
pub fn install() {
    let _ = tracing::subscriber::set_global_default(OutageWarnings);
}

impl Subscriber for OutageWarnings {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == OUTAGE && *metadata.level() <= Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if !message.0.is_empty() {
            exit::print_err(&format!("leasehold: warning: {}", message.0));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

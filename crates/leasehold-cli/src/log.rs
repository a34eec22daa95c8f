//! What the command shows of the library's `tracing` events.
//!
//! By default only the outage warning (a wait riding out a Redis restart), printed as one `leasehold: warning:`
//! line on stderr: everything else the library traces, the command reports in its own words. With `RUST_LOG` set,
//! read as `tracing-subscriber`'s `EnvFilter` reads it (`leasehold=debug`, `info`, `leasehold=trace,warn`, span
//! filters such as `[acquire]=debug`), every event it enables goes to stderr in `tracing`'s usual format, for
//! debugging.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

use crate::exit;

/// The target of the library's outage events.
const OUTAGE: &str = "leasehold::outage";

/// Prints warnings with the outage target; ignores the rest.
pub struct OutageWarnings;

/// Installs the process's subscriber: `RUST_LOG`'s, or [`OutageWarnings`] (once; later calls change nothing).
pub fn install() {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    if spec.trim().is_empty() {
        let _ = tracing::subscriber::set_global_default(OutageWarnings);
        return;
    }
    match EnvFilter::builder().parse(&spec) {
        Ok(filter) => {
            // The builder's own level (INFO by default) would cut first: let the filter decide.
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(Level::TRACE)
                .with_writer(std::io::stderr)
                .finish()
                .with(filter);
            let _ = tracing::subscriber::set_global_default(subscriber);
        }
        Err(err) => {
            exit::print_err(&format!(
                "leasehold: warning: RUST_LOG={spec:?} is not understood ({err}); it is ignored"
            ));
            let _ = tracing::subscriber::set_global_default(OutageWarnings);
        }
    }
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

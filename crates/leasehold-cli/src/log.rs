//! What the command shows of the library's `tracing` events.
//!
//! By default only the outage warning (a wait riding out a Redis restart or an etcd outage), printed as one
//! `leasehold: warning:` line on stderr: everything else the library traces, the command reports in its own words. With `RUST_LOG` set,
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
                // Queued, never written from the runtime's thread: see `crate::stderr`.
                .with_writer(crate::stderr::Event::default)
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
        let mut message = Message::default();
        event.record(&mut message);
        if !message.text.is_empty() {
            exit::print_err(&format!("leasehold: warning: {}", message.line()));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// An outage event's message, and the lock and the error when they are fields of their own (etcd's event names
/// neither in its message; Redis's names the lock and the cause in it, and has no `error` field).
#[derive(Default)]
struct Message {
    text: String,
    lock: Option<String>,
    error: Option<String>,
}

impl Message {
    /// The message, followed by ` (lock "NAME": ERROR)` when the error is a field of its own.
    fn line(&self) -> String {
        match (&self.error, &self.lock) {
            (Some(error), Some(lock)) => format!("{} (lock {lock:?}: {error})", self.text),
            (Some(error), None) => format!("{} ({error})", self.text),
            (None, _) => self.text.clone(),
        }
    }
}

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let value = format!("{value:?}");
        match field.name() {
            "message" => self.text = value,
            "lock" => self.lock = Some(value),
            "error" => self.error = Some(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_field_is_said_after_the_message() {
        let redis = Message {
            text: "Redis unavailable while waiting for lock \"a\" (x); retrying until it answers"
                .to_owned(),
            lock: Some("a".to_owned()),
            error: None,
        };
        assert_eq!(redis.line(), redis.text);
        let etcd = Message {
            text: "etcd unavailable while waiting; trying again".to_owned(),
            lock: Some("a".to_owned()),
            error: Some("etcd enqueue failed".to_owned()),
        };
        assert_eq!(
            etcd.line(),
            "etcd unavailable while waiting; trying again (lock \"a\": etcd enqueue failed)"
        );
    }
}

//! The signals `leasehold` catches: SIGINT, SIGTERM and SIGHUP.
//!
//! Catching starts when [`Signals::catch`] is called; from then on these signals no longer end `leasehold` by
//! themselves, so every caller decides what they mean: `run` passes them on to its program, `demo` cleans up.

use anyhow::Context as _;
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The caught signals, as one stream.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts catching SIGINT, SIGTERM and SIGHUP.
    ///
    /// # Errors
    ///
    /// When a handler cannot be installed (only without a tokio runtime with signals enabled).
    pub fn catch() -> anyhow::Result<Signals> {
        let install = |kind| signal(kind).context("cannot install a signal handler");
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            hangup: install(SignalKind::hangup())?,
        })
    }

    /// The next caught signal.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal that arrives while nobody awaits is kept for the next call.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Signal::SIGINT,
            Some(()) = self.terminate.recv() => Signal::SIGTERM,
            Some(()) = self.hangup.recv() => Signal::SIGHUP,
            // Only when the runtime's signal driver is gone: nothing will arrive any more.
            else => std::future::pending().await,
        }
    }
}

/// The exit status of a process ended by `signal`: 128 + its number.
pub fn exit_code(signal: Signal) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(255)
}

//! The signals `leasehold` catches: every signal whose default action would end it and that can be caught (SIGINT,
//! SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGIO, SIGPWR, SIGSYS,
//! SIGTRAP). SIGKILL cannot be caught; SIGPIPE is ignored by every Rust program; SIGTSTP/SIGCONT are job control
//! (see `child.rs`).
//!
//! Catching starts when [`Signals::catch`] is called; from then on these signals no longer end `leasehold` by
//! themselves, so every caller decides what they mean: `run` passes them on to its program (so a signal meant to end
//! the work can never end the lock holder and leave the program running without a lease), `demo` cleans up.

use anyhow::Context as _;
use futures_util::future::select_all;
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The signals caught, in the order they are checked.
const CAUGHT: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
    Signal::SIGIO,
    Signal::SIGPWR,
    Signal::SIGSYS,
    Signal::SIGTRAP,
];

/// The caught signals, as one stream.
pub struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts catching every signal in [`CAUGHT`].
    ///
    /// # Errors
    ///
    /// When a handler cannot be installed (only without a tokio runtime with signals enabled).
    pub fn catch() -> anyhow::Result<Signals> {
        let streams = CAUGHT
            .iter()
            .map(|&sig| {
                signal(SignalKind::from_raw(sig as i32))
                    .map(|stream| (sig, stream))
                    .with_context(|| format!("cannot install a handler for {sig}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Signals { streams })
    }

    /// The next caught signal.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal that arrives while nobody awaits is kept for the next call.
    pub async fn recv(&mut self) -> Signal {
        let waits = self.streams.iter_mut().map(|(sig, stream)| {
            let sig = *sig;
            Box::pin(async move { stream.recv().await.map(|()| sig) })
        });
        match select_all(waits).await {
            (Some(sig), _, _) => sig,
            // Only when the runtime's signal driver is gone: nothing will arrive any more.
            (None, _, _) => std::future::pending().await,
        }
    }
}

/// The exit status of a process ended by `signal`: 128 + its number.
pub fn exit_code(signal: Signal) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(255)
}

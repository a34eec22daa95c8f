//! `leasehold`: run any program under a distributed lock on Redis, etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB, inspect locks, and see the
//! oversell problem solved.
//!
//! One module per subcommand, plus what they share. The arrows point down: `main.rs` and `cli.rs` on top, the
//! subcommands under them, what several subcommands share at the bottom; nothing imports `cli.rs` but `main.rs`
//! (checked by `layout` `the_command_has_no_import_cycle_across_folders`, in leasehold-tests).
//!
//! | file | what it holds |
//! |---|---|
//! | `cli.rs` | the command line (clap): the subcommands, their help texts, usage errors as one line |
//! | `args.rs` | the options several modules read: the store's (`StoreArg`), and those of `run`, `status`, `list`, `release`, `permits` |
//! | `run.rs` | `leasehold run`: lock, run, stop the program on loss, release |
//! | `child.rs` | the program's process group, its signals, its terminal, its exit status |
//! | `schedule.rs` | when the program gets SIGTERM and SIGKILL: gone by its lease's deadline |
//! | `enforce.rs` | the enforcer process: kills the program when `run` stops renewing its deadline (stopped, stuck) |
//! | `signals.rs` | every catchable terminating signal, caught (and passed on to the program) |
//! | `holder.rs` | the holder description `run` attaches and `status`/`list` read back |
//! | `status.rs` | `leasehold status`, `leasehold list`, `leasehold release --force` and `leasehold permits` |
//! | `status/quorum.rs` | the first three on a quorum: every node asked, a lock held where a majority names its holder |
//! | `demo.rs`, `demo/` | `leasehold demo`: rounds, buyer processes, the fenced store, the final table |
//! | `docs.rs` | `leasehold completions` and `leasehold man`, generated from the definition `cli.rs` hands them |
//! | `bench/` | `leasehold bench`: scenarios (Redis, a quorum, etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB), worker processes, statistics, the SVG plot |
//! | `server.rs` | a private `redis-server` on a free port, killed on drop |
//! | `progress.rs` | the progress bar |
//! | `connect.rs` | connecting (prefix, TLS files), with errors mapped to exit statuses and passwords hidden |
//! | `stores.rs` | which store a URL names; what each option means on etcd, ZooKeeper and the SQL stores, refused before connecting when they cannot honour it |
//! | `etcd.rs` | etcd's errors and tagged holders, said as Redis's are |
//! | `duration.rs` | durations through `humantime`: `500ms`, `2m30s`, `1h30m`, `1d` |
//! | `log.rs` | the library's outage warning as one stderr line |
//! | `stderr.rs` | our stderr through a bounded queue and a writer thread: a blocked stderr never blocks supervision |
//! | `exit.rs` | exit statuses, the error that carries one, the panic hook |
// One narrowly scoped exception, in child.rs: the parent-death signal set in the child before exec.
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms)]

mod args;
mod bench;
mod child;
mod cli;
mod connect;
mod demo;
mod docs;
mod duration;
mod enforce;
mod etcd;
mod exit;
mod holder;
mod log;
mod progress;
mod run;
mod schedule;
mod server;
mod signals;
mod status;
mod stderr;
mod stores;

use std::process::ExitCode;

use cli::{Command, Parsed};

fn main() -> ExitCode {
    exit::install_panic_hook();
    // rustls needs a crypto backend before any rediss:// connection; the lock client installs it too, but the
    // demo's plain store connection may come first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    log::install();
    let code = match cli::parse(std::env::args_os()) {
        // No runtime for the enforcer: a loop on a pipe and a clock (see `enforce.rs`).
        Ok(Parsed::Run(cli)) => match cli.command {
            Command::Enforce(args) => return ExitCode::from(enforce::enforce(&args)),
            command => execute(command),
        },
        Ok(Parsed::Done(code)) => code,
        Err(err) => report(&err),
    };
    // Bounded: a stderr nobody reads must not keep us from exiting (see `stderr.rs`).
    stderr::flush(stderr::EXIT_FLUSH);
    ExitCode::from(code)
}

/// Runs one subcommand on a single-threaded runtime and returns the exit status. Single-threaded on purpose: the
/// demo's frozen buyer relies on a blocking sleep stopping its whole process, lease keeper included.
fn execute(command: Command) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return report(&anyhow::Error::from(err).context("cannot start the async runtime"))
        }
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::List(args) => status::list(args).await,
            Command::Observe(args) => status::observe(args).await,
            Command::Release(args) => status::release(args).await,
            Command::Permits(args) => status::permits(args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::DemoBuyer(args) => demo::buyer::buyer(args).await,
            Command::Bench(args) => bench::bench(args).await,
            Command::BenchWorker(args) => bench::worker::worker(args).await,
            Command::Completions(args) => docs::completions(&args, &cli::definition()),
            Command::Man(args) => docs::man(&args, cli::definition()),
            Command::Enforce(args) => Ok(enforce::enforce(&args)),
        }
    });
    // Background work (a release retried after the program ended, a reconnect) is not waited for.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(err) => report(&err),
    }
}

/// Prints the error as one line (unless it has no message: `run --quiet`) and returns its exit status.
fn report(err: &anyhow::Error) -> u8 {
    let line = exit::one_line(err);
    if !line.is_empty() {
        exit::print_err(&format!("leasehold: {line}"));
    }
    exit::code_of(err)
}

//! A TCP forwarder that can partition a client from Redis.
//!
//! Each accepted connection gets its own upstream connection and one task that pumps bytes both
//! ways. The proxy's mode lives in a [`watch`] channel. Its lock is what makes
//! [`TcpProxy::blackhole`] and [`TcpProxy::cut_all`] race-free: a pump writes only while holding
//! a read borrow of the mode, in which it checks that the connection may still forward, and
//! writes only with non-blocking `try_write`, so the borrow is never held across an `.await`.
//! The mode changes under the write lock, so once `blackhole` returns, no pump can be inside a
//! write, and every later write attempt sees the new mode.

use std::future::pending;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Size of each direction's copy buffer.
const BUF_SIZE: usize = 16 * 1024;

/// A TCP forwarder between clients and one upstream address, able to swallow or reset traffic
/// on demand.
///
/// Connect clients to [`url`](Self::url) instead of the server's; then
///
/// - [`blackhole`](Self::blackhole) partitions them: bytes are read and dropped in both
///   directions, nothing is closed, so the client only learns through its own timeouts;
/// - [`restore`](Self::restore) lets connections made from then on through again;
/// - [`cut_all`](Self::cut_all) resets every connection, so the client learns at once;
/// - [`delay`](Self::delay) holds every chunk of bytes, both ways, for a while before forwarding it (a slow path:
///   requests arrive late, replies come back late, and the order of bytes is kept);
/// - [`stall`](Self::stall) holds the bytes of the current connections, in order, until
///   [`unstall`](Self::unstall), while new connections pass: a flow that stalls and then recovers, its requests
///   arriving after those of connections made in between.
///
/// A connection that existed when [`blackhole`](Self::blackhole) was called, or that was
/// accepted while the proxy was blackholed, stays a black hole for the rest of its life,
/// [`restore`](Self::restore) or not: the bytes it lost have broken the protocol stream anyway.
/// Clients that reconnect after `restore` get through. A blackholed connection is never
/// closed by the proxy, not even when its peer closes its end (a partitioned network would
/// not carry that news either), until [`cut_all`](Self::cut_all) or the proxy is dropped.
///
/// Dropping the proxy stops its tasks, which closes every connection.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_tests::{RedisServer, TcpProxy};
///
/// # async fn dox() {
/// let server = RedisServer::start();
/// let proxy = TcpProxy::start(server.addr()).await;
/// let cfg = redis::AsyncConnectionConfig::new()
///     .set_response_timeout(Some(Duration::from_millis(300)));
/// let mut con = proxy
///     .client()
///     .get_multiplexed_async_connection_with_config(&cfg)
///     .await
///     .unwrap();
///
/// proxy.blackhole();
/// let err = redis::cmd("PING").query_async::<()>(&mut con).await.unwrap_err();
/// assert!(err.is_timeout());
/// # }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// How many connections the proxy has accepted so far.
    accepted: watch::Receiver<u64>,
    /// Each accepted connection's turns (see [`TcpProxy::turns`]), in the order accepted.
    turns: Turns,
    accept_task: JoinHandle<()>,
}

/// Each accepted connection's count of turns, in the order accepted.
type Turns = std::sync::Arc<std::sync::Mutex<Vec<u64>>>;

/// What one connection's two pumps share to count its turns: a chunk from the client starts one when the proxy has
/// forwarded bytes of the server to the client since the client's last chunk (or it is the first).
#[derive(Debug)]
struct Turn {
    turns: Turns,
    /// The connection's index in `turns`.
    index: usize,
    /// Whether the server's bytes were forwarded since the client's last chunk.
    answered: std::sync::atomic::AtomicBool,
}

impl Turn {
    /// A chunk of the client was read.
    fn spoke(&self) {
        if self
            .answered
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.turns.lock().unwrap_or_else(|e| e.into_inner())[self.index] += 1;
        }
    }

    /// A chunk of the server was forwarded to the client.
    fn answered(&self) {
        self.answered
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the proxy currently does with traffic.
#[derive(Debug, Clone, Copy, Default)]
struct Mode {
    /// New connections are born dead while this is set.
    blackholed: bool,
    /// Bumped by every `blackhole()`: connections born in an earlier epoch are dead.
    blackhole_epoch: u64,
    /// Bumped by every `cut_all()`: connections born in an earlier epoch are reset.
    cut_epoch: u64,
    /// How long each chunk waits before it is forwarded.
    delay: std::time::Duration,
    /// Connections born before the last `stall()` hold their bytes while this is set.
    stalling: bool,
    /// Bumped by every `stall()`.
    stall_epoch: u64,
}

/// The [`Mode`] a connection was accepted under.
#[derive(Debug, Clone, Copy)]
struct Birth {
    blackholed: bool,
    blackhole_epoch: u64,
    cut_epoch: u64,
    stall_epoch: u64,
}

impl Birth {
    fn of(mode: &Mode) -> Birth {
        Birth {
            blackholed: mode.blackholed,
            blackhole_epoch: mode.blackhole_epoch,
            cut_epoch: mode.cut_epoch,
            stall_epoch: mode.stall_epoch,
        }
    }

    /// Whether the connection must hold its bytes for now.
    fn is_stalled(&self, mode: &Mode) -> bool {
        mode.stalling && mode.stall_epoch != self.stall_epoch
    }

    /// Whether the connection must no longer forward anything.
    fn is_dead(&self, mode: &Mode) -> bool {
        self.blackholed || mode.blackhole_epoch != self.blackhole_epoch || self.is_cut(mode)
    }

    /// Whether the connection must be reset.
    fn is_cut(&self, mode: &Mode) -> bool {
        mode.cut_epoch != self.cut_epoch
    }
}

impl TcpProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every accepted connection to
    /// `upstream`, each over a new upstream connection.
    ///
    /// If `upstream` refuses a connection, the client's connection is reset.
    ///
    /// # Panics
    ///
    /// If no port can be bound, or when called outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing has been spawned until it returns.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("cannot bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (mode, _) = watch::channel(Mode::default());
        let (count, accepted) = watch::channel(0);
        let turns = Turns::default();
        let accept_task = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode.subscribe(),
            count,
            std::sync::Arc::clone(&turns),
        ));
        TcpProxy {
            addr,
            mode,
            accepted,
            turns,
            accept_task,
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the proxy listens on, on 127.0.0.1.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT` for the proxy's port, without credentials.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a redis:// URL with a port is valid")
    }

    /// Partitions every current connection and every connection accepted from now until
    /// [`restore`](Self::restore): their bytes, both ways, are read and dropped, and nothing
    /// is closed.
    ///
    /// Once this returns, not one more byte is forwarded on the current connections, in either
    /// direction, even if it was already read by the proxy. Current connections stay dead
    /// after `restore`.
    pub fn blackhole(&self) {
        self.mode.send_modify(|mode| {
            mode.blackholed = true;
            mode.blackhole_epoch += 1;
        });
    }

    /// Lets connections accepted from now on through. Connections that were blackholed stay
    /// blackholed; clients must reconnect.
    pub fn restore(&self) {
        self.mode.send_modify(|mode| mode.blackholed = false);
    }

    /// Resets every current connection, on both sides (with `SO_LINGER` 0, so a TCP `RST`
    /// rather than an orderly close). Connections accepted afterwards behave as the current
    /// mode says.
    ///
    /// Once this returns, not one more byte is forwarded on the current connections; the reset
    /// itself follows within moments, from the connections' tasks.
    pub fn cut_all(&self) {
        self.mode.send_modify(|mode| mode.cut_epoch += 1);
    }

    /// Holds the bytes of every current connection, both ways and in order, until [`unstall`](Self::unstall);
    /// connections accepted from now on pass. Nothing is dropped or closed: a stalled flow that its client gave up on
    /// still delivers what it carried, then the close, once it is released.
    pub fn stall(&self) {
        self.mode.send_modify(|mode| {
            mode.stalling = true;
            mode.stall_epoch += 1;
        });
    }

    /// Lets the stalled connections deliver what they hold, and go on.
    pub fn unstall(&self) {
        self.mode.send_modify(|mode| mode.stalling = false);
    }

    /// Holds every chunk read from now on for `delay` before forwarding it, in both directions, on current and new
    /// connections; [`Duration::ZERO`](std::time::Duration::ZERO) forwards at once again.
    pub fn delay(&self, delay: std::time::Duration) {
        self.mode.send_modify(|mode| mode.delay = delay);
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> u64 {
        *self.accepted.borrow()
    }

    /// Waits until the proxy has accepted `n` connections in all.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn accepted_at_least(&self, n: u64) {
        let mut accepted = self.accepted.clone();
        // `Err`: the accept loop is gone, and no connection will come.
        let _ = accepted.wait_for(|count| *count >= n).await;
    }

    /// Each connection's turns so far, in the order the proxy accepted them: how many times its client spoke (sent a
    /// chunk of bytes) after hearing from the server (the proxy forwarded it bytes since the client's last chunk). A
    /// client's round trips, when what it sends together is read together: with [`delay`](Self::delay), requests
    /// written back to back, before any answer, are one turn, and a request sent only once the one before was
    /// answered is a turn of its own.
    pub fn turns(&self) -> Vec<u64> {
        self.turns.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether [`blackhole`](Self::blackhole) is in force for new connections.
    pub fn is_blackholed(&self) -> bool {
        self.mode.borrow().blackholed
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Dropping the accept loop drops its `JoinSet`, which aborts every connection task,
        // which drops (closes) both sockets of every connection.
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    count: watch::Sender<u64>,
    turns: Turns,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                // Errors here are per-connection (the client gave up, or we ran out of file
                // descriptors for a moment); the listener itself stays usable.
                if let Ok((client, _)) = accepted {
                    let birth = Birth::of(&mode.borrow());
                    let turn = {
                        let mut all = turns.lock().unwrap_or_else(|e| e.into_inner());
                        all.push(0);
                        Turn {
                            turns: std::sync::Arc::clone(&turns),
                            index: all.len() - 1,
                            answered: std::sync::atomic::AtomicBool::new(true),
                        }
                    };
                    connections.spawn(serve(client, upstream, birth, mode.clone(), turn));
                    count.send_modify(|n| *n += 1);
                }
            }
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Runs one client connection until either side closes it, it is cut, or the proxy drops.
async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    birth: Birth,
    mut mode: watch::Receiver<Mode>,
    turn: Turn,
) {
    let _ = client.set_nodelay(true);
    // A connection born in a partition never reaches the server, as in a real one.
    let server = if birth.blackholed {
        None
    } else {
        match TcpStream::connect(upstream).await {
            Ok(server) => {
                let _ = server.set_nodelay(true);
                Some(server)
            }
            Err(_) => {
                let _ = client.set_zero_linger();
                return;
            }
        }
    };

    let to_server = pump(
        &client,
        server.as_ref(),
        birth,
        mode.clone(),
        || turn.spoke(),
        || {},
    );
    let to_client_mode = mode.clone();
    let to_client = async {
        match &server {
            Some(server) => {
                let answered = || turn.answered();
                pump(
                    server,
                    Some(&client),
                    birth,
                    to_client_mode,
                    || {},
                    answered,
                )
                .await
            }
            None => pending().await,
        }
    };
    tokio::select! {
        () = to_server => {}
        () = to_client => {}
        cut = mode.wait_for(|mode| birth.is_cut(mode)) => {
            // `Err` means the proxy is gone: close normally.
            if cut.is_ok() {
                let _ = client.set_zero_linger();
                if let Some(server) = &server {
                    let _ = server.set_zero_linger();
                }
            }
        }
    }
}

/// Copies `src` to `dst` until `src` closes or errs. A dead connection (see [`Birth::is_dead`])
/// keeps reading and drops what it reads; it never returns, so it never closes anything.
/// `dst` is `None` for connections born dead. `on_read` is called for each chunk read, `forwarded` whenever bytes of it were written.
async fn pump(
    src: &TcpStream,
    dst: Option<&TcpStream>,
    birth: Birth,
    mut mode: watch::Receiver<Mode>,
    on_read: impl Fn(),
    forwarded: impl Fn(),
) {
    let mut buf = vec![0; BUF_SIZE];
    loop {
        let n = match read(src, &mut buf).await {
            Ok(n) if n > 0 => n,
            // End of stream or error: pass the close on, unless partitioned.
            _ if birth.is_dead(&mode.borrow()) => return pending().await,
            _ => return,
        };
        on_read();
        let Some(dst) = dst else { continue };
        let delay = mode.borrow().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if birth.is_stalled(&mode.borrow()) {
            let _ = mode
                .wait_for(|mode| !birth.is_stalled(mode) || birth.is_dead(mode))
                .await;
        }
        let mut data = &buf[..n];
        while !data.is_empty() {
            {
                // Held across the check and the write: see the module docs.
                let current = mode.borrow();
                if birth.is_dead(&current) {
                    break;
                }
                match dst.try_write(data) {
                    Ok(written) => {
                        data = &data[written..];
                        forwarded();
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
            // `dst` is full. Wait for room, or for a mode change that may mean this data is
            // to be dropped instead (so a stalled reader cannot hold up a blackhole).
            tokio::select! {
                ready = dst.writable() => if ready.is_err() { return },
                changed = mode.changed() => if changed.is_err() { return },
            }
        }
    }
}

/// Reads what is available from `stream` into `buf`, waiting for something if need be.
async fn read(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::aio::MultiplexedConnection;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::RedisServer;

    const SHORT: Duration = Duration::from_millis(300);

    async fn connect(client: &redis::Client) -> redis::RedisResult<MultiplexedConnection> {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(SHORT))
            .set_response_timeout(Some(SHORT));
        client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
    }

    async fn ping(con: &mut MultiplexedConnection) -> redis::RedisResult<String> {
        redis::cmd("PING").query_async(con).await
    }

    #[tokio::test]
    async fn proxy_forwards_ping() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
        let mut con = connect(&proxy.client()).await.unwrap();
        assert_eq!(ping(&mut con).await.unwrap(), "PONG");
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(server.command_calls("set"), 1);
    }

    #[tokio::test]
    async fn blackholed_ping_times_out_while_the_server_still_answers_directly() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        let mut through_proxy = connect(&proxy.client()).await.unwrap();
        assert_eq!(ping(&mut through_proxy).await.unwrap(), "PONG");
        server.config_resetstat();

        proxy.blackhole();
        assert!(proxy.is_blackholed());

        let err = ping(&mut through_proxy).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
        let mut direct = connect(&server.client()).await.unwrap();
        assert_eq!(ping(&mut direct).await.unwrap(), "PONG");
        assert_eq!(
            server.command_calls("ping"),
            1,
            "only the direct PING arrived"
        );
        // A new connection through the proxy hangs in its set-up round trip.
        assert!(connect(&proxy.client()).await.unwrap_err().is_timeout());
    }

    #[tokio::test]
    async fn restore_lets_new_connections_through_but_not_old_ones() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        let mut old = connect(&proxy.client()).await.unwrap();
        proxy.blackhole();
        proxy.restore();
        assert!(!proxy.is_blackholed());

        let mut new = connect(&proxy.client()).await.unwrap();
        assert_eq!(ping(&mut new).await.unwrap(), "PONG");
        assert!(ping(&mut old).await.unwrap_err().is_timeout());
    }

    #[tokio::test]
    async fn blackhole_keeps_connections_open_and_drains_them() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
        raw.write_all(b"PING\r\n").await.unwrap();
        let mut reply = [0; 7];
        raw.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"+PONG\r\n");

        proxy.blackhole();
        // Far more than the socket buffers hold: the write completes only because the proxy
        // keeps reading.
        let junk = vec![b'x'; 16 * 1024 * 1024];
        tokio::time::timeout(Duration::from_secs(5), raw.write_all(&junk))
            .await
            .expect("the proxy drains a blackholed connection")
            .unwrap();
        let mut byte = [0];
        let read = tokio::time::timeout(SHORT, raw.read(&mut byte)).await;
        assert!(read.is_err(), "nothing arrives, not even a close: {read:?}");
    }

    #[tokio::test]
    async fn cut_all_resets_current_connections_only() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        let mut con = connect(&proxy.client()).await.unwrap();
        assert_eq!(ping(&mut con).await.unwrap(), "PONG");

        proxy.cut_all();

        let err = ping(&mut con).await.unwrap_err();
        assert!(!err.is_timeout(), "the client learns at once: {err}");
        let mut new = connect(&proxy.client()).await.unwrap();
        assert_eq!(ping(&mut new).await.unwrap(), "PONG");
    }

    #[tokio::test]
    async fn delay_holds_replies_back_and_keeps_their_order() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        let mut con = connect(&proxy.client()).await.unwrap();
        assert_eq!(ping(&mut con).await.unwrap(), "PONG");
        proxy.delay(Duration::from_millis(100));
        let started = std::time::Instant::now();
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query_async(&mut con)
            .await
            .unwrap();
        let value: String = redis::cmd("GET")
            .arg("k")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(value, "v");
        // Each request and each reply waited 100 ms.
        assert!(started.elapsed() >= Duration::from_millis(200));
        proxy.delay(Duration::ZERO);
        assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    }

    #[tokio::test]
    async fn a_dead_upstream_resets_the_client() {
        let mut server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        server.kill();
        let err = connect(&proxy.client()).await.unwrap_err();
        assert!(!err.is_timeout(), "{err}");
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_its_connections() {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.addr()).await;
        let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
        raw.write_all(b"PING\r\n").await.unwrap();
        let mut reply = [0; 7];
        raw.read_exact(&mut reply).await.unwrap();

        drop(proxy);

        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut rest)).await;
        assert!(closed.expect("closed promptly").is_ok_and(|n| n == 0));
    }

    #[test]
    fn proxy_is_send_and_sync() {
        fn bounds<T: Send + Sync + 'static>() {}
        bounds::<TcpProxy>();
        bounds::<RedisServer>();
    }
}

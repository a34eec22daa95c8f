//! The command connection: either a [`ConnectionManager`] dlock opened, or a connection the caller brought.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Any connection the caller already has: [`redis::aio::MultiplexedConnection`], [`ConnectionManager`], or any
/// other cheaply cloneable [`ConnectionLike`] that multiplexes requests.
pub(crate) trait SharedConnection: ConnectionLike + Send + Sync {
    fn boxed_clone(&self) -> Box<dyn SharedConnection>;
}

impl<T> SharedConnection for T
where
    T: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn boxed_clone(&self) -> Box<dyn SharedConnection> {
        Box::new(self.clone())
    }
}

/// The connection every command of a client goes through. Cloning it is cheap (an `Arc` or a boxed handle), and
/// each request clones it, so concurrent requests pipeline on one socket.
pub(crate) enum Conn {
    Managed(ConnectionManager),
    Shared(Box<dyn SharedConnection>),
}

impl Conn {
    pub(crate) fn shared<C>(conn: C) -> Conn
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Conn::Shared(Box::new(conn))
    }
}

impl Clone for Conn {
    fn clone(&self) -> Self {
        match self {
            Conn::Managed(c) => Conn::Managed(c.clone()),
            Conn::Shared(c) => Conn::Shared(c.boxed_clone()),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Managed(c) => c.req_packed_command(cmd),
            Conn::Shared(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(c) => c.get_db(),
            Conn::Shared(c) => c.get_db(),
        }
    }
}

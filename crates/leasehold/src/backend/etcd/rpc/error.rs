//! The error of every call of the etcd client.

use std::fmt;

/// What a call to etcd can fail with.
///
/// Its text is one phrase per variant, ahead of the text of what it wraps (`grpc request error: status: …`), as
/// `etcd-client`'s was; it names no [`source`](std::error::Error::source), so a chain printer does not say the
/// wrapped error twice.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The call was given something it cannot send (an endpoint that is not a URL, say).
    InvalidArgs(String),
    /// An I/O error outside any gRPC call.
    IoError(std::io::Error),
    /// The channel could not be set up (a bad URI, a TLS configuration it refuses).
    TransportError(tonic::transport::Error),
    /// etcd answered with a gRPC status, or the connection under the call failed (a status too: `Unavailable`,
    /// with the transport error as its source).
    GRpcStatus(tonic::Status),
    /// A watch could not be set up.
    WatchError(String),
    /// A keep-alive stream could not be set up, or etcd said at once that the lease is gone.
    LeaseKeepAliveError(String),
    /// A token etcd gave that cannot travel as gRPC metadata.
    InvalidMetadataValue(tonic::metadata::errors::InvalidMetadataValue),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgs(e) => write!(f, "invalid arguments: {e}"),
            Error::IoError(e) => write!(f, "io error: {e}"),
            Error::TransportError(e) => write!(f, "transport error: {e}"),
            Error::GRpcStatus(e) => write!(f, "grpc request error: {e}"),
            Error::WatchError(e) => write!(f, "watch error: {e}"),
            Error::LeaseKeepAliveError(e) => write!(f, "lease keep alive error: {e}"),
            Error::InvalidMetadataValue(e) => write!(f, "invalid metadata value: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::IoError(e)
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::TransportError(e)
    }
}

impl From<tonic::Status> for Error {
    fn from(e: tonic::Status) -> Self {
        Error::GRpcStatus(e)
    }
}

impl From<tonic::metadata::errors::InvalidMetadataValue> for Error {
    fn from(e: tonic::metadata::errors::InvalidMetadataValue) -> Self {
        Error::InvalidMetadataValue(e)
    }
}

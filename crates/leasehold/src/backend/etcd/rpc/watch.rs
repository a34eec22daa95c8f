//! The Watch service: one watch per stream, which ends with its stream.

use tokio::sync::mpsc;
use tonic::Streaming;

use super::client::stream_request;
use super::pb::etcdserverpb::watch_client::WatchClient;
use super::pb::etcdserverpb::{watch_request, WatchCreateRequest, WatchRequest};
use super::{Client, Error};

pub use super::pb::etcdserverpb::WatchResponse;
pub use super::pb::mvccpb::event::EventType;
pub use super::pb::mvccpb::Event;

/// Options of a watch.
#[derive(Debug, Default, Clone)]
pub struct WatchOptions {
    prefix: bool,
    start_revision: i64,
}

impl WatchOptions {
    /// The one key, from the member's current revision on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key that starts with the key watched.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// From `revision` on (etcd replays what happened since).
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }
}

impl Client {
    /// Opens a stream and creates one watch on it; its first answer says the watch is created.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`] when the stream cannot be opened.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stream is closed with the future.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream, Error> {
        let options = options.unwrap_or_default();
        let key = key.into();
        let create = WatchCreateRequest {
            range_end: if options.prefix {
                super::kv::prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            start_revision: options.start_revision,
            ..WatchCreateRequest::default()
        };
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        let (sender, answers) = self
            .call(create, |channel, first| async move {
                let (sender, request) = stream_request(first);
                let answers = WatchClient::new(channel).watch(request).await?;
                Ok(answers.map(|answers| (sender, answers)))
            })
            .await?;
        Ok(WatchStream {
            _sender: sender,
            answers,
        })
    }
}

/// The answers of one watch: its creation, then its events. Dropping it ends the watch (and its stream).
#[derive(Debug)]
pub struct WatchStream {
    /// Held so that the outgoing half of the stream stays open.
    _sender: mpsc::Sender<WatchRequest>,
    answers: Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next answer; `None` when the stream ended.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`] when the stream broke.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        Ok(self.answers.message().await?)
    }
}

impl WatchResponse {
    /// The answer's header.
    pub fn header(&self) -> Option<&super::ResponseHeader> {
        self.header.as_ref()
    }

    /// Whether this answer says the watch was created.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Whether the watch was cancelled (by the server: compaction, a member losing its leader).
    pub fn canceled(&self) -> bool {
        self.canceled
    }

    /// The events this answer carries.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

impl Event {
    /// A put or a delete.
    pub fn event_type(&self) -> EventType {
        self.r#type()
    }

    /// The key as it is after the event (a delete's has only the key and the revision).
    pub fn kv(&self) -> Option<&super::KeyValue> {
        self.kv.as_ref()
    }
}

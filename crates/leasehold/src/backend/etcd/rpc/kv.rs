//! The KV service: reads, puts and deletes with their options, transactions, and accessors on their answers.

use std::str::Utf8Error;

use super::pb::etcdserverpb::{
    compare, kv_client::KvClient, request_op, response_op, DeleteRangeRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest,
};
use super::{Client, Error};

pub use super::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
pub use super::pb::etcdserverpb::{
    DeleteRangeResponse as DeleteResponse, PutResponse, RangeResponse as GetResponse,
    ResponseHeader, TxnResponse,
};
pub use super::pb::mvccpb::KeyValue;

/// The end of the range of every key that starts with `prefix`: `prefix` with its last byte below `0xff` raised by
/// one (and what follows dropped); `\0`, every key, for an empty prefix or one of `0xff`s only.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

/// Options of a read ([`Client::get`], [`TxnOp::get`]).
#[derive(Debug, Default, Clone)]
pub struct GetOptions {
    request: RangeRequest,
    prefix: bool,
}

impl GetOptions {
    /// The one key asked for, all of it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key that starts with the key asked for.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Keys and metadata without values.
    pub fn with_keys_only(mut self) -> Self {
        self.request.keys_only = true;
        self
    }

    /// Only how many keys there are ([`GetResponse::count`]).
    pub fn with_count_only(mut self) -> Self {
        self.request.count_only = true;
        self
    }

    /// At most `limit` keys.
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.request.limit = limit;
        self
    }

    /// Sorted by `target` in `order`.
    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.request.sort_target = target.into();
        self.request.sort_order = order.into();
        self
    }

    /// Only keys created at `revision` or before.
    pub fn with_max_create_revision(mut self, revision: i64) -> Self {
        self.request.max_create_revision = revision;
        self
    }

    fn request(self, key: Vec<u8>) -> RangeRequest {
        let key = if self.prefix && key.is_empty() {
            vec![0]
        } else {
            key
        };
        RangeRequest {
            range_end: if self.prefix {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            ..self.request
        }
    }
}

/// Options of a put.
#[derive(Debug, Default, Clone)]
pub struct PutOptions {
    lease: i64,
}

impl PutOptions {
    /// No lease: the key lives until deleted.
    pub fn new() -> Self {
        Self::default()
    }

    /// The key lives as long as lease `lease`.
    pub fn with_lease(mut self, lease: i64) -> Self {
        self.lease = lease;
        self
    }
}

/// Options of a delete.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    prefix: bool,
}

impl DeleteOptions {
    /// The one key named.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key that starts with the key named.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    fn request(self, key: Vec<u8>) -> DeleteRangeRequest {
        DeleteRangeRequest {
            range_end: if self.prefix {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            prev_kv: false,
        }
    }
}

/// How a [`Compare`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompareOp {
    /// `==`.
    Equal,
    /// `>`.
    Greater,
    /// `<`.
    Less,
    /// `!=`.
    NotEqual,
}

/// One condition of a transaction, on one key.
#[derive(Debug, Clone)]
pub struct Compare(super::pb::etcdserverpb::Compare);

impl Compare {
    fn new(
        key: impl Into<Vec<u8>>,
        op: CompareOp,
        target: compare::CompareTarget,
        value: compare::TargetUnion,
    ) -> Self {
        let result = match op {
            CompareOp::Equal => compare::CompareResult::Equal,
            CompareOp::Greater => compare::CompareResult::Greater,
            CompareOp::Less => compare::CompareResult::Less,
            CompareOp::NotEqual => compare::CompareResult::NotEqual,
        };
        Compare(super::pb::etcdserverpb::Compare {
            result: result.into(),
            target: target.into(),
            key: key.into(),
            target_union: Some(value),
            range_end: Vec::new(),
        })
    }

    /// The key's create revision (0 when it does not exist) against `revision`.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        Self::new(
            key,
            op,
            compare::CompareTarget::Create,
            compare::TargetUnion::CreateRevision(revision),
        )
    }

    /// The key's last modification's revision (0 when it does not exist) against `revision`.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        Self::new(
            key,
            op,
            compare::CompareTarget::Mod,
            compare::TargetUnion::ModRevision(revision),
        )
    }

    /// The key's lease (0 for none, or when it does not exist) against `lease`.
    pub fn lease(key: impl Into<Vec<u8>>, op: CompareOp, lease: i64) -> Self {
        Self::new(
            key,
            op,
            compare::CompareTarget::Lease,
            compare::TargetUnion::Lease(lease),
        )
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub struct TxnOp(request_op::Request);

impl TxnOp {
    /// A read of `key`.
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Self {
        TxnOp(request_op::Request::RequestRange(
            options.unwrap_or_default().request(key.into()),
        ))
    }

    /// A put of `value` at `key`.
    pub fn put(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Self {
        TxnOp(request_op::Request::RequestPut(PutRequest {
            key: key.into(),
            value: value.into(),
            lease: options.unwrap_or_default().lease,
            ..PutRequest::default()
        }))
    }

    /// A delete of `key`.
    pub fn delete(key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> Self {
        TxnOp(request_op::Request::RequestDeleteRange(
            options.unwrap_or_default().request(key.into()),
        ))
    }
}

/// A transaction: if every compare holds, the `and_then` operations, else the `or_else` ones, atomically.
#[derive(Debug, Clone, Default)]
pub struct Txn(TxnRequest);

impl Txn {
    /// No compare (so it succeeds), no operation.
    pub fn new() -> Self {
        Self::default()
    }

    /// The conditions.
    pub fn when(mut self, compares: impl Into<Vec<Compare>>) -> Self {
        self.0.compare = compares.into().into_iter().map(|c| c.0).collect();
        self
    }

    /// What runs when every condition holds.
    pub fn and_then(mut self, operations: impl Into<Vec<TxnOp>>) -> Self {
        self.0.success = ops(operations.into());
        self
    }

    /// What runs otherwise.
    pub fn or_else(mut self, operations: impl Into<Vec<TxnOp>>) -> Self {
        self.0.failure = ops(operations.into());
        self
    }
}

fn ops(operations: Vec<TxnOp>) -> Vec<RequestOp> {
    operations
        .into_iter()
        .map(|op| RequestOp {
            request: Some(op.0),
        })
        .collect()
}

/// The answer of one operation of a transaction.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TxnOpResponse {
    /// A read's.
    Get(GetResponse),
    /// A put's.
    Put(PutResponse),
    /// A delete's.
    Delete(DeleteResponse),
    /// A nested transaction's.
    Txn(TxnResponse),
}

impl Client {
    /// Reads `key` (or the keys `options` name).
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, Error> {
        let request = options.unwrap_or_default().request(key.into());
        self.call(request, |channel, request| async move {
            KvClient::new(channel).range(request).await
        })
        .await
    }

    /// Puts `value` at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// The put may or may not have happened.
    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Result<PutResponse, Error> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            lease: options.unwrap_or_default().lease,
            ..PutRequest::default()
        };
        self.call(request, |channel, request| async move {
            KvClient::new(channel).put(request).await
        })
        .await
    }

    /// Deletes `key` (or the keys `options` name).
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// The delete may or may not have happened.
    pub async fn delete(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<DeleteOptions>,
    ) -> Result<DeleteResponse, Error> {
        let request = options.unwrap_or_default().request(key.into());
        self.call(request, |channel, request| async move {
            KvClient::new(channel).delete_range(request).await
        })
        .await
    }

    /// Runs a transaction.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// The transaction may or may not have run.
    pub async fn txn(&mut self, txn: Txn) -> Result<TxnResponse, Error> {
        self.call(txn.0, |channel, request| async move {
            KvClient::new(channel).txn(request).await
        })
        .await
    }
}

impl ResponseHeader {
    /// The store's revision when the request was served.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

impl KeyValue {
    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The key as UTF-8.
    ///
    /// # Errors
    ///
    /// When it is not UTF-8.
    pub fn key_str(&self) -> Result<&str, Utf8Error> {
        std::str::from_utf8(&self.key)
    }

    /// The value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The value as UTF-8.
    ///
    /// # Errors
    ///
    /// When it is not UTF-8.
    pub fn value_str(&self) -> Result<&str, Utf8Error> {
        std::str::from_utf8(&self.value)
    }

    /// The revision of the key's creation (since its last delete).
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }

    /// The revision of the key's last change.
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    /// The lease the key lives under; 0 for none.
    pub fn lease(&self) -> i64 {
        self.lease
    }
}

impl GetResponse {
    /// The answer's header.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// The keys read.
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }

    /// The keys read, taken out of the answer.
    pub fn take_kvs(&mut self) -> Vec<KeyValue> {
        std::mem::take(&mut self.kvs)
    }

    /// How many keys are in the range (all of them, whatever the limit).
    pub fn count(&self) -> i64 {
        self.count
    }
}

impl PutResponse {
    /// The answer's header.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
}

impl DeleteResponse {
    /// How many keys were deleted.
    pub fn deleted(&self) -> i64 {
        self.deleted
    }
}

impl TxnResponse {
    /// The answer's header.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// Whether every compare held (and so the `and_then` operations ran).
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }

    /// The answers of the operations that ran, in order.
    pub fn op_responses(&self) -> Vec<TxnOpResponse> {
        self.responses
            .iter()
            .filter_map(|op| {
                Some(match op.response.clone()? {
                    response_op::Response::ResponseRange(r) => TxnOpResponse::Get(r),
                    response_op::Response::ResponsePut(r) => TxnOpResponse::Put(r),
                    response_op::Response::ResponseDeleteRange(r) => TxnOpResponse::Delete(r),
                    response_op::Response::ResponseTxn(r) => TxnOpResponse::Txn(r),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"locks/a/"), b"locks/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }
}

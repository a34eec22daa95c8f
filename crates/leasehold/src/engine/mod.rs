//! The engine under every lock kind and every store: the lease (validity deadline, loss signal), the keeper that
//! renews leases in batches, the lease clock (monotonic, counting suspension), retry backoff, metrics and tracing.
//! It knows nothing of any store.

pub(crate) mod backoff;
pub(crate) mod clock;
pub(crate) mod ids;
pub(crate) mod info;
pub(crate) mod keeper;
pub(crate) mod keys;
pub(crate) mod lease;
pub(crate) mod metrics;
pub(crate) mod trace;
pub(crate) mod ttl;

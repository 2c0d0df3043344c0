//! The [`Fabric`] trait: one endpoint of a lossy multicast network.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::FabricError;
use crate::stats::FabricStats;

/// A message on the fabric: opaque bytes (a sealed record or a small protocol message; the
/// fabric never looks inside). Cloning is a reference-count increment.
pub type Message = Bytes;

/// An endpoint attached to a multicast network.
///
/// Contract, for every backend:
/// - `publish` delivers best-effort to every *other* endpoint of the same network, never back
///   to the sender. It does not block on the network: a message that cannot be queued (full
///   queue, no connection) is dropped and counted in [`FabricStats`], not reported as an error.
///   Errors are for messages no backend could carry: empty, or over `frame_bytes_max`.
/// - Messages from one sender arrive in the order sent, unless something adversarial is in
///   the way; nothing else is promised: no delivery, no exactly-once, no order across senders.
/// - Every queue is bounded; a receiver whose queue is full loses the message (counted in its
///   `dropped_full`). Upper layers detect gaps and repair.
/// - Methods take `&self`: an endpoint can be shared by threads (`Arc<dyn Fabric>`).
pub trait Fabric: Send + Sync + 'static {
    /// Sends `msg` to every other endpoint, best effort.
    fn publish(&self, msg: Message) -> Result<(), FabricError>;
    /// The next message, waiting at most `timeout`; `Ok(None)` if none came.
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError>;
    /// The next message if one is queued.
    fn try_recv(&self) -> Result<Option<Message>, FabricError>;
    /// Counters since the endpoint was made.
    fn stats(&self) -> FabricStats;
}

impl<F: Fabric + ?Sized> Fabric for Arc<F> {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        (**self).publish(msg)
    }
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        (**self).recv_timeout(timeout)
    }
    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        (**self).try_recv()
    }
    fn stats(&self) -> FabricStats {
        (**self).stats()
    }
}

impl<F: Fabric + ?Sized> Fabric for Box<F> {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        (**self).publish(msg)
    }
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        (**self).recv_timeout(timeout)
    }
    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        (**self).try_recv()
    }
    fn stats(&self) -> FabricStats {
        (**self).stats()
    }
}

/// The checks every backend applies to an outgoing message.
pub(crate) fn check_outgoing(endpoint: &str, msg: &[u8], frame_bytes_max: usize) -> Result<(), FabricError> {
    if msg.is_empty() {
        return Err(FabricError::Empty { endpoint: endpoint.to_string() });
    }
    if msg.len() > frame_bytes_max {
        return Err(FabricError::TooLarge { endpoint: endpoint.to_string(), len: msg.len(), max: frame_bytes_max });
    }
    Ok(())
}

//! Typed errors. Every variant names what failed and where (the endpoint or router, the address,
//! the config field).

use std::io;
use std::net::SocketAddr;

use crate::frame::FrameError;

/// A configuration value that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid config: {field}: {reason}")]
pub struct ConfigError {
    /// The field (or command-line flag) at fault.
    pub field: &'static str,
    /// Why it is refused.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        ConfigError { field, reason: reason.into() }
    }
}

/// What an endpoint of the fabric reports. Transient network conditions (a full queue, a
/// message published while disconnected) are not errors: the fabric is lossy and counts them in
/// [`crate::FabricStats`] instead.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// The message does not fit in one frame.
    #[error("endpoint {endpoint}: message of {len} bytes exceeds frame_bytes_max {max}")]
    TooLarge { endpoint: String, len: usize, max: usize },
    /// Empty messages are refused on every backend (on TCP a zero-length frame is the heartbeat).
    #[error("endpoint {endpoint}: empty messages are not carried (a zero-length frame is the link heartbeat)")]
    Empty { endpoint: String },
    /// The endpoint can no longer send or receive (its I/O thread ended).
    #[error("endpoint {endpoint}: closed: {reason}")]
    Closed { endpoint: String, reason: String },
    /// The first connection to the router could not be made.
    #[error("endpoint {endpoint}: connecting to router {addr} failed: {source}")]
    Connect {
        endpoint: String,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// Setting up the endpoint's I/O failed (runtime, thread).
    #[error("endpoint {endpoint}: {what}: {source}")]
    Io {
        endpoint: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The NATS client could not connect, subscribe or read its credentials.
    #[error("endpoint {endpoint}: NATS: {what}: {reason}")]
    Nats { endpoint: String, what: &'static str, reason: String },
    /// A fabric URL that cannot be used.
    #[error("fabric URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// What the router reports when it cannot start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("router: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("router on {addr}: {what}: {source}")]
    Io {
        addr: SocketAddr,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("router on {addr}: the router thread panicked")]
    Panicked { addr: SocketAddr },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Why one link (a TCP connection of a router or an endpoint) ended. Logged, counted, never
/// returned to a caller: the link is re-established (parent, endpoint) or simply gone (child).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkEnd {
    #[error("peer closed the connection")]
    PeerClosed,
    #[error("nothing received for {0:?} (idle timeout)")]
    Idle(std::time::Duration),
    #[error("write made no progress for {0:?} (write timeout)")]
    WriteTimeout(std::time::Duration),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("outbound queue closed")]
    QueueClosed,
}

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
    TooLarge {
        /// Name of the endpoint that refused it.
        endpoint: String,
        /// The message's length, in bytes.
        len: usize,
        /// The endpoint's `frame_bytes_max`, in bytes.
        max: usize,
    },
    /// Empty messages are refused on every backend (on TCP a zero-length frame is the heartbeat).
    #[error("endpoint {endpoint}: empty messages are not carried (a zero-length frame is the link heartbeat)")]
    Empty {
        /// Name of the endpoint that refused it.
        endpoint: String,
    },
    /// The endpoint can no longer send or receive (its I/O thread ended).
    #[error("endpoint {endpoint}: closed: {reason}")]
    Closed {
        /// Name of the closed endpoint.
        endpoint: String,
        /// Why it is closed.
        reason: String,
    },
    /// The first connection to the router could not be made.
    #[error("endpoint {endpoint}: connecting to router {addr} failed: {source}")]
    Connect {
        /// Name of the endpoint that was connecting.
        endpoint: String,
        /// The router's address.
        addr: SocketAddr,
        /// The connect error (or a timeout after `connect_timeout`).
        #[source]
        source: io::Error,
    },
    /// Setting up the endpoint's I/O failed (runtime, thread).
    #[error("endpoint {endpoint}: {what}: {source}")]
    Io {
        /// Name of the endpoint being set up.
        endpoint: String,
        /// The step that failed, e.g. `"building the runtime"`.
        what: &'static str,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The NATS client could not connect, subscribe or read its credentials.
    #[error("endpoint {endpoint}: NATS: {what}: {reason}")]
    Nats {
        /// Name of the endpoint.
        endpoint: String,
        /// The step that failed (connecting, subscribing, reading the credentials).
        what: &'static str,
        /// The NATS client's error message.
        reason: String,
    },
    /// A fabric URL that cannot be used.
    #[error("fabric URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The endpoint's configuration was refused by its `validate` before anything was set up.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// What the router reports when it cannot start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// Binding the listening socket failed (address in use, not local, no permission).
    #[error("router: cannot listen on {addr}: {source}")]
    Bind {
        /// The `listen` address of the configuration.
        addr: SocketAddr,
        /// The bind error.
        #[source]
        source: io::Error,
    },
    /// Setting up the router failed after binding (listener options, tokio runtime, thread,
    /// registering the listener).
    #[error("router on {addr}: {what}: {source}")]
    Io {
        /// The address the router listens (or was to listen) on.
        addr: SocketAddr,
        /// The step that failed, e.g. `"building the tokio runtime"`.
        what: &'static str,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The router thread panicked, during start-up or before [`crate::RouterHandle::wait`]
    /// returned.
    #[error("router on {addr}: the router thread panicked")]
    Panicked {
        /// The address the router listened on.
        addr: SocketAddr,
    },
    /// The [`crate::RouterConfig`] was refused by its `validate` before anything was bound.
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

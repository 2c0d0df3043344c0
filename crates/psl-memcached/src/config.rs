//! What both server runtimes (`evloop` for plain TCP, `server` for TLS) share: their settings
//! and their errors.

use std::time::Duration;

/// Server settings.
#[derive(Clone)]
pub struct ServerConfig {
    /// Open connections allowed at once; past it a new connection gets
    /// `SERVER_ERROR too many open connections` and is closed (counted in `rejected_connections`).
    pub max_connections: usize,
    /// Close a connection that sent nothing for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Worker threads: event loops (plain TCP) or the tokio runtime's workers (TLS).
    pub threads: usize,
    /// Serve TLS with this acceptor (see [`crate::tls_acceptor`]) on a tokio runtime;
    /// `None`: plain TCP on the `evloop` event loops.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig { max_connections: 4096, idle_timeout: Some(Duration::from_secs(300)), threads: 2, tls: None }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("max_connections", &self.max_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field("threads", &self.threads)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A system call failed (binding, reading the local address, spawning a thread or the runtime).
    #[error("{what}: {source}")]
    Io {
        /// What the server was doing, e.g. `binding 127.0.0.1:11211`.
        what: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The TLS certificate or key could not be read or used (the message names the file).
    #[error("TLS: {0}")]
    Tls(String),
}

//! What both server runtimes (`evloop` for plain TCP, `server` for TLS) share: their settings
//! and their errors.

use std::time::Duration;

/// Server settings.
#[derive(Clone)]
pub struct ServerConfig {
    pub max_connections: usize,
    /// Close a connection that sent nothing for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Worker threads: event loops (plain TCP) or the tokio runtime's workers (TLS).
    pub threads: usize,
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

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("TLS: {0}")]
    Tls(String),
}

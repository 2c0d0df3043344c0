//! The server: [`Server::start`] binds the address and serves it with one of two runtimes.
//!
//! - Plain TCP: the event loops of `evloop` (memcached's shape: `threads` workers,
//!   each an `epoll` loop driving its connections' sessions).
//! - TLS: a tokio runtime (one task per connection, `tokio-rustls`), [`serve`] and
//!   [`connection`] here.
//!
//! Both only move bytes: the protocol (parsing, pipelining in order, bounded buffers) is the
//! I/O-free [`Session`]. A connection that sends nothing for `idle_timeout` (up to a quarter
//! more) is closed; past `max_connections` a new one gets
//! `SERVER_ERROR too many open connections` and is closed.

use crate::evloop::{self, Loops};
use crate::session::{idle_tick, Session, Step, IDLE_TICKS};
use crate::stats::Stats;
use crate::store::FrontEnd;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use crate::config::{ServerConfig, ServerError};
pub use crate::session::OUT_FLUSH;

/// A TLS acceptor from PEM files: a certificate chain and its private key.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServerError::Tls(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ServerError::Tls(format!("{}: no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| ServerError::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// A running server. Dropping it (or [`Server::stop`]) stops it.
pub struct Server {
    addr: SocketAddr,
    runtime: Runtime,
}

enum Runtime {
    Loops(Loops),
    Tokio { stop: watch::Sender<bool>, thread: Option<std::thread::JoinHandle<()>> },
}

impl Server {
    /// Binds `addr` and serves `fe`: on `cfg.threads` event loops, or with TLS on a tokio
    /// runtime of that many threads.
    pub fn start(fe: Arc<FrontEnd>, addr: SocketAddr, cfg: ServerConfig) -> Result<Server, ServerError> {
        if cfg.tls.is_none() {
            let listener = mio::net::TcpListener::bind(addr)
                .map_err(|source| ServerError::Io { what: format!("binding {addr}"), source })?;
            let addr =
                listener.local_addr().map_err(|source| ServerError::Io { what: "local address".into(), source })?;
            return Ok(Server { addr, runtime: Runtime::Loops(evloop::start(fe, listener, cfg)?) });
        }
        // One thread: a current-thread runtime on the server's own thread. More: a
        // multi-thread runtime of that many workers.
        let mut builder = if cfg.threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(cfg.threads).thread_name("memcached");
            b
        };
        let rt = builder
            .enable_all()
            .build()
            .map_err(|source| ServerError::Io { what: "building the runtime".into(), source })?;
        let listener = rt
            .block_on(TcpListener::bind(addr))
            .map_err(|source| ServerError::Io { what: format!("binding {addr}"), source })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Io { what: "local address".into(), source })?;
        let (stop, rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(if cfg.threads <= 1 { "memcached" } else { "memcached-main" }.into())
            .spawn(move || {
                rt.block_on(serve(fe, listener, cfg, rx));
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|source| ServerError::Io { what: "spawning the server thread".into(), source })?;
        Ok(Server { addr, runtime: Runtime::Tokio { stop, thread: Some(thread) } })
    }

    /// The address the server listens on (with the actual port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (it stops only through [`Server::stop`]).
    pub fn wait(mut self) {
        match &mut self.runtime {
            Runtime::Loops(l) => l.join(),
            Runtime::Tokio { thread, .. } => {
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
        }
    }

    /// Stops accepting, closes every connection and joins the server's threads.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        match &mut self.runtime {
            Runtime::Loops(l) => l.stop(),
            Runtime::Tokio { stop, thread } => {
                let _ = stop.send(true);
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Accepts and serves connections until `stop` turns true.
pub async fn serve(fe: Arc<FrontEnd>, listener: TcpListener, cfg: ServerConfig, mut stop: watch::Receiver<bool>) {
    loop {
        let (sock, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = sock.set_nodelay(true);
        let st = &fe.stats;
        if Stats::get(&st.curr_connections) as usize >= cfg.max_connections {
            Stats::inc(&st.rejected_connections);
            tokio::spawn(async move {
                let mut sock = sock;
                let _ = sock.write_all(b"SERVER_ERROR too many open connections\r\n").await;
            });
            continue;
        }
        Stats::inc(&st.curr_connections);
        Stats::inc(&st.total_connections);
        let fe = fe.clone();
        let cfg = cfg.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let run = async {
                match &cfg.tls {
                    Some(acc) => match tokio::time::timeout(Duration::from_secs(10), acc.accept(sock)).await {
                        Ok(Ok(tls)) => connection(&fe, tls, &cfg).await,
                        Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    },
                    None => connection(&fe, sock, &cfg).await,
                }
            };
            tokio::select! {
                _ = run => {}
                _ = stop.changed() => {}
            }
            fe.stats.curr_connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Serves one connection until it closes, idles out, quits or fails.
pub async fn connection<S: AsyncRead + AsyncWrite + Unpin>(fe: &FrontEnd, mut s: S, cfg: &ServerConfig) {
    let mut sess = Session::new();
    // The idle timer ticks every quarter of `idle_timeout`; four ticks with no read in between
    // close the connection, so it closes after between 1 and 1.25 times the timeout of silence.
    // Reads only count (no clock read per request); the timer is one pinned sleep per
    // connection, re-armed when it fires.
    let tick = idle_tick(cfg.idle_timeout);
    let (mut reads, mut reads_at_tick, mut quiet_ticks) = (0u64, 0u64, 0u32);
    let idle = tokio::time::sleep(tick.unwrap_or(Duration::from_secs(86_400)));
    tokio::pin!(idle);
    loop {
        match sess.process(fe) {
            Step::Flush => {
                if write_out(fe, &mut s, &mut sess).await.is_err() {
                    return;
                }
                continue;
            }
            Step::Close => {
                let _ = write_out(fe, &mut s, &mut sess).await;
                return;
            }
            Step::NeedInput => {}
        }
        if !sess.output().is_empty() && write_out(fe, &mut s, &mut sess).await.is_err() {
            return;
        }
        let n = match tick {
            Some(tick) => loop {
                tokio::select! {
                    biased;
                    r = s.read_buf(sess.input()) => break r,
                    _ = &mut idle => {
                        if reads == reads_at_tick {
                            quiet_ticks += 1;
                            if quiet_ticks >= IDLE_TICKS {
                                Stats::inc(&fe.stats.idle_kicks);
                                return;
                            }
                        } else {
                            (reads_at_tick, quiet_ticks) = (reads, 0);
                        }
                        idle.as_mut().reset(tokio::time::Instant::now() + tick);
                    }
                }
            },
            None => s.read_buf(sess.input()).await,
        };
        reads += 1;
        match n {
            Ok(0) | Err(_) => return,
            Ok(n) => Stats::add(&fe.stats.bytes_read, n as u64),
        }
    }
}

async fn write_out<S: AsyncWrite + Unpin>(fe: &FrontEnd, s: &mut S, sess: &mut Session) -> std::io::Result<()> {
    let r = s.write_all(sess.output()).await;
    if r.is_ok() {
        s.flush().await?;
    }
    Stats::add(&fe.stats.bytes_written, sess.output().len() as u64);
    let n = sess.output().len();
    sess.consume_output(n);
    r
}

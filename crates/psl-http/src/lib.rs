//! PSL's HTTP stack: hyper's HTTP/1.1 server behind PSL's limits, on a thread of its own.
//!
//! It serves the roles' Prometheus metrics ([`MetricsServer`], `--metrics ADDR`: every
//! long-running role renders its counters as Prometheus text, a scraper reads them with
//! `GET /metrics`), and the attested HTTPS endpoint of the trusted roles ([`HttpServer::serve`]
//! with TLS and [`Routes::attestation`]: `GET /v1/attestation?nonce=HEX` answers evidence that
//! binds the server's TLS key and the client's nonce, which `psl verify` checks). The
//! roles' API will sit on the same server, so its limits are the API's:
//!
//! - at most [`Limits::connections_max`] connections at once; one beyond it is closed at
//!   accept and counted (`psl_http_connections_refused_total`);
//! - a request's head must arrive within [`Limits::header_read_ms`], and is at most
//!   [`HEAD_BYTES_MAX`]; a connection lives at most [`Limits::connection_ms`];
//! - request bodies are never read on these routes;
//! - every error answer is JSON that says what was wrong (`{"error": "..."}`).
//!
//! Metrics carry no secrets and need no credential; a deployment that must not publish them
//! binds the address to loopback or a private network (docs/security/threat-model.md).
//!
//! Modules: this file (the server, its routes, its own counters, the process's figures) and
//! [`client`] (one GET over TLS that keeps the server's certificate, for `psl verify`).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(missing_docs)]

pub mod client;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most bytes of a request's head (request line and headers): hyper's smallest read buffer.
pub const HEAD_BYTES_MAX: usize = 8 * 1024;

/// What renders a role's metrics as Prometheus text (called once per scrape).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// What answers `GET /v1/attestation?nonce=HEX`: evidence (as JSON) binding this server's TLS
/// key and the client's 32-byte nonce, or why there is none. Runs on a blocking thread (a
/// hardware quote takes milliseconds); at most [`ATTESTATIONS_MAX`] at once.
pub type Attest = Arc<dyn Fn([u8; 32]) -> Result<serde_json::Value, String> + Send + Sync>;

/// Most attestation requests served at once; more are answered 503 (evidence costs the
/// hardware time, so a client cannot queue unbounded work).
pub const ATTESTATIONS_MAX: usize = 4;

/// What a server answers besides errors.
#[derive(Clone, Default)]
pub struct Routes {
    /// `GET /metrics` (and `/healthz`).
    pub metrics: Option<Render>,
    /// `GET /v1/attestation?nonce=HEX`.
    pub attestation: Option<Attest>,
}

/// The server's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub connections_max: usize,
    /// How long a request's head may take to arrive (ms).
    pub header_read_ms: u64,
    /// How long one connection may stay open, keep-alive included (ms).
    pub connection_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { connections_max: 64, header_read_ms: 5_000, connection_ms: 30_000 }
    }
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Binding the listening address failed.
    #[error("binding the HTTP address {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The server's runtime or thread could not be made.
    #[error("starting the HTTP server on {addr}: {source}")]
    Start {
        /// The address bound.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
}

/// The server's own counters, served beside the role's.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Requests answered 200.
    pub ok: AtomicU64,
    /// Requests refused: no such path (404) or method (405).
    pub refused: AtomicU64,
    /// Connections closed at accept because `connections_max` were open.
    pub connections_refused: AtomicU64,
}

impl HttpStats {
    /// The counters as Prometheus text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, v) in [
            ("psl_http_requests_ok_total", "HTTP requests answered 200", &self.ok),
            ("psl_http_requests_refused_total", "HTTP requests refused (no such path or method)", &self.refused),
            (
                "psl_http_connections_refused_total",
                "HTTP connections closed at accept: the connection bound was reached",
                &self.connections_refused,
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// This process's standard figures (the names Prometheus's process collector uses), read from
/// `/proc/self` at each call: CPU seconds (user and system), resident bytes, threads and open
/// file descriptors. Figures the system does not give are left out.
pub fn process_metrics() -> String {
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, v: String| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    };
    if let Some(st) = std::fs::read_to_string("/proc/self/stat").ok().and_then(|s| parse_stat(&s)) {
        // SAFETY: sysconf(3) reads a constant of the system and touches no memory of ours.
        let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if tick > 0 {
            let cpu = (st.utime + st.stime) as f64 / tick as f64;
            put("process_cpu_seconds_total", "counter", "user and system CPU time of this process", format!("{cpu}"));
        }
        if page > 0 {
            let rss = st.rss_pages.saturating_mul(page as u64);
            put("process_resident_memory_bytes", "gauge", "resident memory of this process", rss.to_string());
        }
        put("process_threads", "gauge", "threads of this process", st.threads.to_string());
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        put("process_open_fds", "gauge", "open file descriptors of this process", fds.count().to_string());
    }
    out
}

/// The fields of `/proc/self/stat` [`process_metrics`] uses.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    threads: u64,
    rss_pages: u64,
}

/// Parses `/proc/PID/stat`: the command name (field 2) is in parentheses and may hold spaces
/// and parentheses, so fields are counted from the last `)`.
fn parse_stat(s: &str) -> Option<Stat> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is f[n - 3].
    let at = |n: usize| f.get(n - 3).and_then(|x| x.parse::<u64>().ok());
    Some(Stat { utime: at(14)?, stime: at(15)?, threads: at(20)?, rss_pages: at(24)? })
}

/// A running server; dropping it stops the server and joins its thread.
pub struct HttpServer {
    addr: SocketAddr,
    tls: bool,
    stats: Arc<HttpStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The `--metrics` server: an [`HttpServer`] with the metrics route only, in plain HTTP.
pub type MetricsServer = HttpServer;

impl HttpServer {
    /// Serves `GET /metrics` (`render`'s text, then the server's own counters) on `addr`
    /// (port 0: any free port, see [`HttpServer::local_addr`]) under the default [`Limits`].
    pub fn start(addr: SocketAddr, render: Render) -> Result<HttpServer, HttpError> {
        HttpServer::start_with(addr, render, Limits::default())
    }

    /// [`HttpServer::start`] under `limits`.
    pub fn start_with(addr: SocketAddr, render: Render, limits: Limits) -> Result<HttpServer, HttpError> {
        HttpServer::serve(addr, Routes { metrics: Some(render), attestation: None }, None, limits)
    }

    /// Serves `routes` on `addr`, over TLS with `tls` (HTTPS), else plain HTTP.
    pub fn serve(
        addr: SocketAddr,
        routes: Routes,
        tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
        limits: Limits,
    ) -> Result<HttpServer, HttpError> {
        let listener = std::net::TcpListener::bind(addr).map_err(|source| HttpError::Bind { addr, source })?;
        let bound = listener.local_addr().map_err(|source| HttpError::Start { addr, source })?;
        listener.set_nonblocking(true).map_err(|source| HttpError::Start { addr: bound, source })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| HttpError::Start { addr: bound, source })?;
        let stats = Arc::new(HttpStats::default());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let st = stats.clone();
        let https = tls.is_some();
        let thread = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || rt.block_on(serve(listener, Arc::new(routes), tls, st, limits, stopped)))
            .map_err(|source| HttpError::Start { addr: bound, source })?;
        let server = HttpServer { addr: bound, tls: https, stats, stop: Some(stop), thread: Some(thread) };
        tracing::info!(addr = %bound, "serving {}", server.base_url());
        Ok(server)
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` or `https://ADDR`.
    pub fn base_url(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.addr)
    }

    /// The scrape URL: `http://ADDR/metrics`.
    pub fn url(&self) -> String {
        format!("{}/metrics", self.base_url())
    }

    /// The server's own counters.
    pub fn stats(&self) -> &HttpStats {
        &self.stats
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    routes: Arc<Routes>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    stats: Arc<HttpStats>,
    limits: Limits,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("http server: cannot take the listener into the runtime: {e}");
            return;
        }
    };
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections_max.max(1)));
    let attesting = Arc::new(tokio::sync::Semaphore::new(ATTESTATIONS_MAX));
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors or a reset before accept: wait a little, never spin.
                tracing::debug!("http server: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            continue; // dropped: closed at once
        };
        let _ = stream.set_nodelay(true);
        let (routes, stats, attesting, acceptor) = (routes.clone(), stats.clone(), attesting.clone(), acceptor.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let (routes, stats, attesting) = (routes.clone(), stats.clone(), attesting.clone());
                async move { Ok::<_, Infallible>(respond(req, &routes, &stats, &attesting).await) }
            });
            let http = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(limits.header_read_ms))
                .max_buf_size(HEAD_BYTES_MAX)
                .clone();
            let whole = Duration::from_millis(limits.connection_ms);
            match acceptor {
                None => {
                    let _ = tokio::time::timeout(whole, http.serve_connection(TokioIo::new(stream), svc)).await;
                }
                Some(acc) => {
                    // The handshake counts against the head deadline.
                    let hs = Duration::from_millis(limits.header_read_ms);
                    if let Ok(Ok(tls)) = tokio::time::timeout(hs, acc.accept(stream)).await {
                        let _ = tokio::time::timeout(whole, http.serve_connection(TokioIo::new(tls), svc)).await;
                    }
                }
            }
            drop(slot);
        });
    }
}

/// The answer to one request (no body is read).
async fn respond(
    req: Request<Incoming>,
    routes: &Routes,
    stats: &HttpStats,
    attesting: &Arc<tokio::sync::Semaphore>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let served = |p: &str| match p {
        "/metrics" | "/healthz" => routes.metrics.is_some(),
        "/v1/attestation" => routes.attestation.is_some(),
        _ => false,
    };
    if !served(&path) {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        let mut list: Vec<&str> = Vec::new();
        if routes.metrics.is_some() {
            list.extend(["GET /metrics", "GET /healthz"]);
        }
        if routes.attestation.is_some() {
            list.push("GET /v1/attestation?nonce=HEX");
        }
        let msg = format!("no such path {path:?}: this server answers {}", list.join(", "));
        return json_error(StatusCode::NOT_FOUND, &msg);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        let msg = format!("method {} is not allowed on {path}: use GET", req.method());
        let mut r = json_error(StatusCode::METHOD_NOT_ALLOWED, &msg);
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if path == "/v1/attestation" {
        let Some(attest) = routes.attestation.clone() else {
            return json_error(StatusCode::NOT_FOUND, "no attestation here");
        };
        return attestation(req.uri().query(), attest, stats, attesting).await;
    }
    let Some(render) = &routes.metrics else {
        return json_error(StatusCode::NOT_FOUND, "no metrics here");
    };
    stats.ok.fetch_add(1, Ordering::Relaxed);
    let (body, kind) = if path == "/metrics" {
        let mut text = render();
        text.push_str(&stats.render());
        (text, "text/plain; version=0.0.4; charset=utf-8")
    } else {
        ("ok\n".to_string(), "text/plain; charset=utf-8")
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

/// `GET /v1/attestation?nonce=HEX`: the nonce must be exactly 64 hex digits.
async fn attestation(
    query: Option<&str>,
    attest: Attest,
    stats: &HttpStats,
    attesting: &Arc<tokio::sync::Semaphore>,
) -> Response<Full<Bytes>> {
    let nonce = query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("nonce="))).and_then(|h| {
        let mut n = [0u8; 32];
        hex::decode_to_slice(h, &mut n).ok().map(|()| n)
    });
    let Some(nonce) = nonce else {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        return json_error(StatusCode::BAD_REQUEST, "give a fresh nonce: GET /v1/attestation?nonce=<64 hex digits>");
    };
    let Ok(permit) = attesting.clone().try_acquire_owned() else {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "too many attestation requests at once: retry");
    };
    let answer = tokio::task::spawn_blocking(move || {
        let r = attest(nonce);
        drop(permit);
        r
    })
    .await;
    match answer {
        Ok(Ok(v)) => {
            stats.ok.fetch_add(1, Ordering::Relaxed);
            let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Ok(Err(e)) => json_error(StatusCode::SERVICE_UNAVAILABLE, &format!("no evidence: {e}")),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("the attestation task failed: {e}")),
    }
}

fn json_error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": msg }).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_parses_even_with_a_command_name_full_of_parentheses() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 7 18 19 20 321 22";
        // Fields from 3: S=3, ... utime=14 -> 11, stime=15 -> 12, threads=20 -> 7, rss=24 -> 321.
        assert_eq!(parse_stat(line), Some(Stat { utime: 11, stime: 12, threads: 7, rss_pages: 321 }));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn this_process_has_cpu_time_memory_and_threads() {
        let m = process_metrics();
        for name in
            ["process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_threads ", "process_open_fds "]
        {
            assert!(m.contains(name), "{name} missing:\n{m}");
        }
    }
}

//! PSL's HTTP stack: hyper's HTTP/1.1 server behind PSL's limits, on a thread of its own.
//!
//! It serves the roles' Prometheus metrics ([`MetricsServer`], `--metrics ADDR`: every
//! long-running role renders its counters as Prometheus text, a scraper reads them with
//! `GET /metrics`), and the attested HTTPS endpoint of the trusted roles ([`HttpServer::serve`]
//! with TLS and [`Routes::attestation`]: `GET /v1/attestation?nonce=HEX` answers evidence that
//! binds the server's TLS key and the client's nonce, which `psl verify` checks), and the
//! roles' API ([`Routes::api`]: `psl::api`'s KV and jobs routes) under the same limits:
//!
//! - at most [`Limits::connections_max`] connections at once; one beyond it is closed at
//!   accept and counted (`psl_http_connections_refused_total`);
//! - a request's head must arrive within [`Limits::header_read_ms`], and is at most
//!   [`HEAD_BYTES_MAX`]; a connection lives at most [`Limits::connection_ms`];
//! - request bodies are read only on the API's routes, at most [`Limits::body_bytes_max`];
//!   at most [`API_CALLS_MAX`] API calls at once; an API call runs inline on the server's
//!   worker, and a part that may wait goes through [`may_block`];
//! - an API answer is whole JSON, or a stream of server-sent events ([`event_stream`]);
//! - every error answer is JSON that says what was wrong (`{"error": "..."}`).
//!
//! Metrics carry no secrets and need no credential; a deployment that must not publish them
//! binds the address to loopback or a private network (docs/security/threat-model.md).
//!
//! Modules: this file (the server, its routes, its own counters, the process's figures, event
//! streams) and [`client`] (a keep-alive HTTPS session that keeps the server's certificate,
//! for `psl verify`, the benchmark and tests).

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

/// One API request, read whole: its body is at most [`Limits::body_bytes_max`].
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// The method, upper case (`GET`, `PUT`, ...).
    pub method: String,
    /// The path and query exactly as on the request line (what request signatures cover).
    pub path_and_query: String,
    /// The headers whose names start with `psl-` (lower case), in order.
    pub psl_headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
    /// The connection it came on (its state lives as long as the connection).
    pub connection: Arc<Connection>,
}

/// What the API keeps about one connection: the principal an earlier request on it proved
/// (over TLS, only the party that made the handshake can send on a connection, so a
/// credential proved once holds for the connection's later requests).
#[derive(Debug, Default)]
pub struct Connection {
    /// The principal proved on this connection, as the API names it (`None`: none yet).
    pub principal: parking_lot::Mutex<Option<[u8; 32]>>,
}

impl ApiRequest {
    /// The path (before any `?`).
    pub fn path(&self) -> &str {
        self.path_and_query.split('?').next().unwrap_or("")
    }

    /// The query (after the first `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.path_and_query.split_once('?').map(|(_, q)| q)
    }

    /// The first `psl-` header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.psl_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// An API answer: a status, a JSON body, and `psl-` headers (the answer's signature); or, with
/// [`ApiAnswer::events`], a stream of server-sent events after the head.
#[derive(Debug, Default)]
pub struct ApiAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The body's exact bytes (JSON), which an answer signature covers.
    pub body: Vec<u8>,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// How the API counts it: [`Outcome::Ok`] for a 2xx, else why it was refused.
    pub outcome: Outcome,
    /// A stream instead of `body`: the answer is `text/event-stream`, each frame sent as the
    /// API's [`EventSink`] gives it, until the sink is dropped (or the connection's deadline).
    pub events: Option<Events>,
}

/// Most event frames queued for a slow reader before the sender waits.
pub const EVENT_FRAMES_QUEUED_MAX: usize = 64;

/// The sending side of an answer's server-sent events ([`event_stream`]), used from any
/// thread but the server's own.
#[derive(Debug)]
pub struct EventSink(tokio::sync::mpsc::Sender<Bytes>);

/// The receiving side, carried in [`ApiAnswer::events`].
#[derive(Debug)]
pub struct Events(tokio::sync::mpsc::Receiver<Bytes>);

/// A stream of server-sent events: the API keeps the sink, the answer carries the rest.
pub fn event_stream() -> (EventSink, Events) {
    let (tx, rx) = tokio::sync::mpsc::channel(EVENT_FRAMES_QUEUED_MAX);
    (EventSink(tx), Events(rx))
}

impl Events {
    /// The next frame as the server would send it (`id: N\ndata: ...\n\n`), waiting for it;
    /// `None` once the sink is dropped. For callers outside the server (tests); never call it
    /// inside an async runtime.
    pub fn next_blocking(&mut self) -> Option<Bytes> {
        self.0.blocking_recv()
    }
}

impl EventSink {
    /// Sends one event: `id: {id}` and `data: {data}` (one line: `data` must hold no newline,
    /// which is refused), waiting while [`EVENT_FRAMES_QUEUED_MAX`] frames are queued. False
    /// once the client has gone (stop producing). Call it from a thread of your own, never
    /// from inside the server's runtime.
    pub fn send(&self, id: u64, data: &str) -> bool {
        if data.contains(['\n', '\r']) {
            return false;
        }
        self.0.blocking_send(Bytes::from(format!("id: {id}\ndata: {data}\n\n"))).is_ok()
    }

    /// Whether the client has gone.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// An answer's body: whole, or a stream of events.
enum AnswerBody {
    Whole(Full<Bytes>),
    Events(tokio::sync::mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            AnswerBody::Whole(b) => std::pin::Pin::new(b).poll_frame(cx),
            AnswerBody::Events(rx) => rx.poll_recv(cx).map(|f| f.map(|b| Ok(hyper::body::Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::Whole(b) => b.is_end_stream(),
            AnswerBody::Events(_) => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            AnswerBody::Whole(b) => b.size_hint(),
            AnswerBody::Events(_) => hyper::body::SizeHint::default(),
        }
    }
}

fn whole(r: Response<Full<Bytes>>) -> Response<AnswerBody> {
    r.map(AnswerBody::Whole)
}

/// How an API answer is counted in the server's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// Served (2xx, or a signed 404/409 that is an answer, not a refusal).
    #[default]
    Ok,
    /// Refused: no valid credential (401).
    Unauthenticated,
    /// Refused: the credential does not allow it (403).
    Forbidden,
    /// Refused: the request was malformed or too large (4xx).
    Bad,
    /// Failed on the server's side (5xx).
    Failed,
}

/// What answers the API paths (`/v1/...` besides `/v1/attestation`). Runs inline on one of the
/// server's two worker threads, so it must not wait: any part that may (a write that waits
/// for its writer queue, a sync for the coordinator, a read from CapsuleDB) goes inside
/// [`may_block`]. At most [`API_CALLS_MAX`] at once, more are answered 503.
pub type Api = Arc<dyn Fn(ApiRequest) -> ApiAnswer + Send + Sync>;

/// Runs `f`, which may wait, from an [`Api`]: on the server's worker it first hands the
/// worker's other connections to another thread (`tokio::task::block_in_place`, which costs
/// a thread hand-off: about 18 µs of CPU a call here, so only calls that may wait pay it);
/// anywhere else it just runs `f`.
pub fn may_block<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Most API calls served at once.
pub const API_CALLS_MAX: usize = 64;

/// What a server answers besides errors.
#[derive(Clone, Default)]
pub struct Routes {
    /// `GET /metrics` (and `/healthz`).
    pub metrics: Option<Render>,
    /// `GET /v1/attestation?nonce=HEX`.
    pub attestation: Option<Attest>,
    /// Every other `/v1/` path, with the prefix it serves (such as `/v1/kv`).
    pub api: Option<(Vec<&'static str>, Api)>,
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
    /// Most bytes of an API request's body; a longer one is answered 413 unread.
    pub body_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { connections_max: 64, header_read_ms: 5_000, connection_ms: 30_000, body_bytes_max: 1024 * 1024 + 4096 }
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
    /// API answers by [`Outcome`]: ok, 401, 403, other 4xx, 5xx.
    pub api: [AtomicU64; 5],
    /// API latency histogram: answers that took at most [`API_LATENCY_BUCKETS_US`]`[i]` µs
    /// (cumulative, as Prometheus's `le` buckets), then the sum of all latencies in µs.
    pub api_latency: [AtomicU64; API_LATENCY_BUCKETS_US.len()],
    /// Sum of API latencies (µs).
    pub api_latency_sum_us: AtomicU64,
}

/// The API latency histogram's upper bounds (µs).
pub const API_LATENCY_BUCKETS_US: [u64; 8] = [250, 1_000, 2_500, 10_000, 25_000, 100_000, 1_000_000, u64::MAX];

impl Outcome {
    fn index(self) -> usize {
        match self {
            Outcome::Ok => 0,
            Outcome::Unauthenticated => 1,
            Outcome::Forbidden => 2,
            Outcome::Bad => 3,
            Outcome::Failed => 4,
        }
    }
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
        let name = "psl_http_api_requests_total";
        out.push_str(&format!(
            "# HELP {name} API answers by outcome (401/403: refused credentials)\n# TYPE {name} counter\n"
        ));
        for (label, i) in [("ok", 0), ("unauthenticated", 1), ("forbidden", 2), ("bad_request", 3), ("failed", 4)] {
            out.push_str(&format!("{name}{{outcome=\"{label}\"}} {}\n", self.api[i].load(Ordering::Relaxed)));
        }
        let name = "psl_http_api_seconds";
        out.push_str(&format!("# HELP {name} API latency, request read to answer made\n# TYPE {name} histogram\n"));
        for (i, le) in API_LATENCY_BUCKETS_US.iter().enumerate() {
            let le = if *le == u64::MAX { "+Inf".to_string() } else { format!("{}", *le as f64 / 1e6) };
            out.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {}\n", self.api_latency[i].load(Ordering::Relaxed)));
        }
        let count = self.api_latency[API_LATENCY_BUCKETS_US.len() - 1].load(Ordering::Relaxed);
        let sum = self.api_latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        out.push_str(&format!("{name}_sum {sum}\n{name}_count {count}\n"));
        out
    }

    fn count_api(&self, outcome: Outcome, took_us: u64) {
        self.api[outcome.index()].fetch_add(1, Ordering::Relaxed);
        for (i, le) in API_LATENCY_BUCKETS_US.iter().enumerate() {
            if took_us <= *le {
                self.api_latency[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.api_latency_sum_us.fetch_add(took_us, Ordering::Relaxed);
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
        HttpServer::serve(addr, Routes { metrics: Some(render), attestation: None, api: None }, None, limits)
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
        // Two workers: an API call runs inline on its worker; a part that may wait hands the
        // worker's other connections to another thread meanwhile (`may_block`).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("http")
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
    let calls = Arc::new(tokio::sync::Semaphore::new(API_CALLS_MAX));
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
        let gates = Gates { attesting: attesting.clone(), calls: calls.clone(), body_bytes_max: limits.body_bytes_max };
        let (routes, stats, acceptor) = (routes.clone(), stats.clone(), acceptor.clone());
        let connection = Arc::new(Connection::default());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let (routes, stats, gates, conn) = (routes.clone(), stats.clone(), gates.clone(), connection.clone());
                async move { Ok::<_, Infallible>(respond(req, &routes, &stats, &gates, conn).await) }
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

/// What bounds a connection's requests (shared by all connections).
#[derive(Clone)]
struct Gates {
    attesting: Arc<tokio::sync::Semaphore>,
    calls: Arc<tokio::sync::Semaphore>,
    body_bytes_max: usize,
}

/// Whether `path` is `prefix` or below it.
fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The answer to one request (only API requests have their body read).
async fn respond(
    req: Request<Incoming>,
    routes: &Routes,
    stats: &HttpStats,
    gates: &Gates,
    connection: Arc<Connection>,
) -> Response<AnswerBody> {
    let path = req.uri().path().to_string();
    if let Some((prefixes, api)) = &routes.api {
        if prefixes.iter().any(|p| under(&path, p)) {
            return api_call(req, api.clone(), stats, gates, connection).await;
        }
    }
    whole(respond_fixed(req, routes, stats, gates, &path).await)
}

/// The answer to a request outside the API: metrics, health, attestation, or an error.
async fn respond_fixed(
    req: Request<Incoming>,
    routes: &Routes,
    stats: &HttpStats,
    gates: &Gates,
    path: &str,
) -> Response<Full<Bytes>> {
    let path = path.to_string();
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
        if let Some((prefixes, _)) = &routes.api {
            list.extend(prefixes.iter().copied());
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
        return attestation(req.uri().query(), attest, stats, &gates.attesting).await;
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

/// An API request: its body read under the bound, then `api` on a blocking thread.
async fn api_call(
    req: Request<Incoming>,
    api: Api,
    stats: &HttpStats,
    gates: &Gates,
    connection: Arc<Connection>,
) -> Response<AnswerBody> {
    let started = std::time::Instant::now();
    let refuse = |status: StatusCode, outcome: Outcome, msg: &str| {
        stats.count_api(outcome, started.elapsed().as_micros() as u64);
        whole(json_error(status, msg))
    };
    let (parts, body) = req.into_parts();
    let announced = parts.headers.get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > gates.body_bytes_max as u64) {
        let msg = format!("the body is {} bytes; at most {} are taken", announced.unwrap_or(0), gates.body_bytes_max);
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, Outcome::Bad, &msg);
    }
    let body = match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, gates.body_bytes_max)).await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = format!("reading the body (at most {} bytes): {e}", gates.body_bytes_max);
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, Outcome::Bad, &msg);
        }
    };
    let Ok(permit) = gates.calls.clone().try_acquire_owned() else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, Outcome::Failed, "too many API calls at once: retry");
    };
    let psl_headers = parts
        .headers
        .iter()
        .filter(|(n, _)| n.as_str().starts_with("psl-"))
        .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let path_and_query =
        parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let request =
        ApiRequest { method: parts.method.as_str().to_string(), path_and_query, psl_headers, body, connection };
    // On this worker, inline: the common, short call (a memtable read) costs no hand-off. A
    // call that may wait (a sync, a full writer queue, CapsuleDB) wraps that part in
    // `may_block`, which gives up only this worker meanwhile.
    let a = api(request);
    drop(permit);
    stats.count_api(a.outcome, started.elapsed().as_micros() as u64);
    let (body, kind) = match a.events {
        Some(Events(rx)) => (AnswerBody::Events(rx), "text/event-stream"),
        None => (AnswerBody::Whole(Full::new(Bytes::from(a.body))), "application/json"),
    };
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    if kind == "text/event-stream" {
        r.headers_mut().insert(hyper::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    for (name, value) in a.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().insert(name, v);
        }
    }
    r
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

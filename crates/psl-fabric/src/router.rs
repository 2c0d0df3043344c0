//! The TCP router: one node of a tree of routers that together form a broadcast network.
//!
//! A router listens for child connections (endpoints or child routers) and optionally keeps one
//! connection to a parent router, reconnecting with backoff when it breaks. Every frame that
//! arrives on any link is forwarded to every *other* link, children and parent alike, so any
//! tree of routers delivers every frame to every endpoint once (the topology must be a tree: a
//! cycle would circulate frames forever, since frames carry nothing but their payload).
//!
//! An endpoint may say what it wants: its first frame on a connection is then an *interest
//! frame* ([`crate::Interest::encode_frame`], first byte `0xFF`, which no wire message starts
//! with). The router keeps it for that link, forwards it no further, and from then on offers
//! the link only the frames its interest wants ([`crate::Interest::wants_message`]: by the
//! capsule and leaf of the message's public prefix; anything unclassified goes to everyone).
//! Links that sent none (routers, older endpoints, monitors) get everything, so the filter
//! applies at the last hop.
//!
//! Each link has a bounded outbound queue (messages and bytes). Forwarding never waits: a frame
//! for a link whose queue is full is dropped for that link and counted, so one slow or stalled
//! peer cannot stall the router or the other links. A link whose writes make no progress for
//! `write_timeout`, or which sends nothing (not even a heartbeat) for `idle_timeout`, or which
//! sends a frame over `frame_bytes_max`, is closed.
//!
//! With `faults` set, each link's send path has its own [`FaultInjector`] (seeded from
//! `faults.seed` and the link's id), so each receiver sees independent loss, duplication,
//! reordering, delay, corruption and replay, as on a real lossy multicast network.
//!
//! # Runtime
//!
//! The router runs on a tokio runtime (the project's async runtime) on its own thread: one task
//! per link multiplexes reading and writing, so a router with many children costs no thread
//! each, and connect, read, write and idle deadlines are plain `tokio::time` timeouts. The
//! default is a current-thread runtime (`worker_threads: 1`): forwarding is a memcpy-free
//! fan-out of reference-counted frames plus socket syscalls, and on the 2-core machines of this
//! project the cores are better left to the nodes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout, Instant};

use crate::config::{check_frame, check_queue, LinkTiming, FRAME_BYTES_MAX_DEFAULT};
use crate::config::{QUEUE_BYTES_MAX_DEFAULT, QUEUE_MSGS_MAX_DEFAULT};
use crate::error::{ConfigError, LinkEnd, RouterError};
use crate::fault::{FaultConfig, FaultInjector};
use crate::link::{jittered, outbox, read_loop, write_loop, LinkCounters, LinkFaults, Outbox, Refused};
use crate::stats::{Counter, FaultStats};
use crate::subject::{Interest, Route, INTEREST_FRAME_TAG};

/// Configuration of one router.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// Where to listen for children (default `127.0.0.1:0`: loopback, any free port).
    pub listen: SocketAddr,
    /// The parent router to connect to, if any (default none: this is a root).
    pub parent: Option<SocketAddr>,
    /// Longest outbound queue of one link, in messages (default 4096).
    pub link_queue_msgs_max: usize,
    /// Largest outbound queue of one link, in payload bytes (default 64 MiB).
    pub link_queue_bytes_max: usize,
    /// Largest frame payload accepted (default 16 MiB); a bigger one closes its link.
    pub frame_bytes_max: usize,
    /// Most links at once, parent included (default 1024); further connections are refused.
    pub links_max: usize,
    /// Connect, parent reconnect backoff, heartbeat, idle and write timings of every link.
    pub timing: LinkTiming,
    /// Faults injected on every link's send path (default none).
    pub faults: Option<FaultConfig>,
    /// Runtime threads (default 1: a current-thread runtime).
    pub worker_threads: usize,
    /// Log a line of counters at `info` this often (default never).
    pub stats_log_interval: Option<Duration>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            parent: None,
            link_queue_msgs_max: QUEUE_MSGS_MAX_DEFAULT,
            link_queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            links_max: 1024,
            timing: LinkTiming::default(),
            faults: None,
            worker_threads: 1,
            stats_log_interval: None,
        }
    }
}

impl RouterConfig {
    /// Checks that every limit, timing and the fault configuration can work and that the
    /// router is not its own parent; the error names the first field that cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_queue(
            "link_queue_msgs_max",
            "link_queue_bytes_max",
            self.link_queue_msgs_max,
            self.link_queue_bytes_max,
        )?;
        check_frame(self.frame_bytes_max)?;
        self.timing.validate()?;
        if self.links_max == 0 {
            return Err(ConfigError::new("links_max", "must be at least 1"));
        }
        if self.worker_threads == 0 {
            return Err(ConfigError::new("worker_threads", "must be at least 1"));
        }
        if let Some(f) = &self.faults {
            f.validate()?;
        }
        if self.parent == Some(self.listen) {
            return Err(ConfigError::new("parent", "a router cannot be its own parent"));
        }
        Ok(())
    }
}

/// Which side of the router a link is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRole {
    /// Accepted: an endpoint or a child router.
    Child,
    /// Connected out to the parent router.
    Parent,
}

/// Counters of one link (or a sum of links).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkTotals {
    /// Frames received on the link (heartbeats not counted).
    pub frames_in: u64,
    /// Payload bytes of the frames counted in `frames_in`.
    pub bytes_in: u64,
    /// Frames written to the link (heartbeats not counted).
    pub frames_out: u64,
    /// Payload bytes of the frames counted in `frames_out`.
    pub bytes_out: u64,
    /// Frames not queued for this link because its outbound queue was full.
    pub dropped_full: u64,
    /// Inbound frames over `frame_bytes_max` (the link was then closed), and interest frames
    /// that did not decode.
    pub frames_refused: u64,
    /// Frames not forwarded on this link because its endpoint's interest does not want them.
    pub frames_filtered: u64,
    /// Faults injected on this link's send path.
    pub faults: FaultStats,
}

impl LinkTotals {
    /// Adds `o` to `self`, field by field.
    pub fn add(&mut self, o: &LinkTotals) {
        self.frames_in += o.frames_in;
        self.bytes_in += o.bytes_in;
        self.frames_out += o.frames_out;
        self.bytes_out += o.bytes_out;
        self.dropped_full += o.dropped_full;
        self.frames_refused += o.frames_refused;
        self.frames_filtered += o.frames_filtered;
        self.faults.add(&o.faults);
    }
}

/// One live link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStats {
    /// Unique within this router, in connection order.
    pub id: u64,
    /// Whether the link is a child's or the parent's.
    pub role: LinkRole,
    /// The address at the other end of the link.
    pub peer: SocketAddr,
    /// The link's counters so far.
    pub totals: LinkTotals,
}

/// A snapshot of a router's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterStats {
    /// The address the router listens on.
    pub local_addr: SocketAddr,
    /// Live links, by id.
    pub links: Vec<LinkStats>,
    /// Sum over links that have closed.
    pub closed: LinkTotals,
    /// Child connections accepted.
    pub accepted: u64,
    /// Connections refused because `links_max` links were up.
    pub refused_links_max: u64,
    /// Connections made to the parent router, the first included.
    pub parent_connects: u64,
    /// Attempts to connect to the parent router that failed (each followed by a backoff).
    pub parent_connect_failures: u64,
    /// Links that ended in an error (reset, idle, oversize frame, write timeout).
    pub link_errors: u64,
}

impl RouterStats {
    /// Sum over all links, live and closed.
    pub fn totals(&self) -> LinkTotals {
        let mut t = self.closed;
        for l in &self.links {
            t.add(&l.totals);
        }
        t
    }

    /// Live child links (endpoints and child routers).
    pub fn children(&self) -> usize {
        self.links.iter().filter(|l| l.role == LinkRole::Child).count()
    }

    /// Whether a link to the parent router is up.
    pub fn parent_connected(&self) -> bool {
        self.links.iter().any(|l| l.role == LinkRole::Parent)
    }
}

struct Link {
    id: u64,
    role: LinkRole,
    peer: SocketAddr,
    out: Outbox,
    ctr: LinkCounters,
    faults: Mutex<FaultStats>,
    /// What the endpoint at the other end wants, from its interest frame (`None`: it sent
    /// none, and gets everything: a router, an older endpoint, a monitor).
    interest: RwLock<Option<Interest>>,
}

impl Link {
    fn totals(&self) -> LinkTotals {
        LinkTotals {
            frames_in: self.ctr.frames_in.get(),
            bytes_in: self.ctr.bytes_in.get(),
            frames_out: self.ctr.frames_out.get(),
            bytes_out: self.ctr.bytes_out.get(),
            dropped_full: self.ctr.dropped_full.get(),
            frames_refused: self.ctr.frames_refused.get(),
            frames_filtered: self.ctr.filtered.get(),
            faults: *self.faults.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

struct Shared {
    cfg: RouterConfig,
    local_addr: SocketAddr,
    links: RwLock<BTreeMap<u64, Arc<Link>>>,
    closed: Mutex<LinkTotals>,
    next_link: AtomicU64,
    accepted: Counter,
    refused_links_max: Counter,
    parent_connects: Counter,
    parent_connect_failures: Counter,
    link_errors: Counter,
}

impl Shared {
    fn stats(&self) -> RouterStats {
        let links = self
            .links
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|l| LinkStats { id: l.id, role: l.role, peer: l.peer, totals: l.totals() })
            .collect();
        RouterStats {
            local_addr: self.local_addr,
            links,
            closed: *self.closed.lock().unwrap_or_else(|e| e.into_inner()),
            accepted: self.accepted.get(),
            refused_links_max: self.refused_links_max.get(),
            parent_connects: self.parent_connects.get(),
            parent_connect_failures: self.parent_connect_failures.get(),
            link_errors: self.link_errors.get(),
        }
    }

    fn link_count(&self) -> usize {
        self.links.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Offers `frame` to every link but `from` whose endpoint wants it; never waits.
    fn fanout(&self, from: u64, frame: &Bytes) {
        let links = self.links.read().unwrap_or_else(|e| e.into_inner());
        // Classified once, when the first filtering link needs it.
        let mut route: Option<Route> = None;
        for link in links.values() {
            if link.id == from {
                continue;
            }
            if let Some(i) = link.interest.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                if !i.wants_route(route.get_or_insert_with(|| crate::subject::classify(frame))) {
                    link.ctr.filtered.inc();
                    continue;
                }
            }
            match link.out.offer(frame.clone()) {
                Ok(()) => {}
                Err(Refused::Full) => {
                    link.ctr.dropped_full.inc();
                    tracing::trace!(link = link.id, peer = %link.peer, "router: link queue full, frame dropped");
                }
                Err(Refused::Closed) => {}
            }
        }
    }
}

/// Removes a link from the table when its task ends, however it ends (even when the runtime is
/// dropped mid-await at shutdown), and keeps its counters in the closed totals.
struct LinkGuard<'a> {
    shared: &'a Shared,
    link: Arc<Link>,
}

impl Drop for LinkGuard<'_> {
    fn drop(&mut self) {
        self.shared.links.write().unwrap_or_else(|e| e.into_inner()).remove(&self.link.id);
        self.shared.closed.lock().unwrap_or_else(|e| e.into_inner()).add(&self.link.totals());
    }
}

/// Serves one connected link until it ends.
async fn serve_link(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr, role: LinkRole) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(%peer, error = %e, "router: cannot set TCP_NODELAY");
    }
    let cfg = &shared.cfg;
    let id = shared.next_link.fetch_add(1, Ordering::Relaxed);
    let (out, mut out_rx) = outbox(cfg.link_queue_msgs_max, cfg.link_queue_bytes_max);
    let link = Arc::new(Link {
        id,
        role,
        peer,
        out,
        ctr: LinkCounters::default(),
        faults: Mutex::new(FaultStats::default()),
        interest: RwLock::new(None),
    });
    shared.links.write().unwrap_or_else(|e| e.into_inner()).insert(id, link.clone());
    let _guard = LinkGuard { shared: &shared, link: link.clone() };
    tracing::info!(link = id, %peer, ?role, "router: link up");

    let faults = cfg.faults.as_ref().filter(|f| !f.is_transparent()).map(|f| LinkFaults {
        inj: FaultInjector::new(f.for_stream(id)).expect("validated with the router config"),
        published: &link.faults,
    });
    let (rd, wr) = stream.into_split();
    let end = tokio::select! {
        e = read_loop(rd, cfg.frame_bytes_max, cfg.timing.idle_timeout, &link.ctr, |f| {
            // An endpoint's interest frame sets its filter and goes no further (a router below
            // keeps its endpoints' frames to itself, so none arrives from a router link).
            if f.first() == Some(&INTEREST_FRAME_TAG) {
                match Interest::decode_frame(&f) {
                    Some(i) => {
                        tracing::debug!(link = id, %peer, capsules = i.capsules.len(), "router: link interest");
                        *link.interest.write().unwrap_or_else(|e| e.into_inner()) = Some(i);
                    }
                    None => link.ctr.frames_refused.inc(),
                }
                return;
            }
            shared.fanout(id, &f)
        }) => e,
        e = write_loop(wr, &mut out_rx, faults, &cfg.timing, cfg.frame_bytes_max, &link.ctr) => e,
    };
    match end {
        LinkEnd::PeerClosed => tracing::info!(link = id, %peer, ?role, "router: link closed by peer"),
        e => {
            shared.link_errors.inc();
            tracing::warn!(link = id, %peer, ?role, error = %e, "router: link closed");
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if shared.link_count() >= shared.cfg.links_max {
                    shared.refused_links_max.inc();
                    tracing::warn!(%peer, links_max = shared.cfg.links_max, "router: too many links, connection refused");
                    continue;
                }
                shared.accepted.inc();
                tokio::spawn(serve_link(shared.clone(), stream, peer, LinkRole::Child));
            }
            Err(e) => {
                // Out of descriptors and the like: wait, do not spin.
                tracing::warn!(error = %e, "router: accept failed");
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn parent_loop(shared: Arc<Shared>, parent: SocketAddr) {
    let t = shared.cfg.timing.clone();
    let mut backoff = t.backoff_min;
    loop {
        match timeout(t.connect_timeout, TcpStream::connect(parent)).await {
            Ok(Ok(stream)) => {
                shared.parent_connects.inc();
                let started = Instant::now();
                serve_link(shared.clone(), stream, parent, LinkRole::Parent).await;
                if started.elapsed() >= t.backoff_max {
                    backoff = t.backoff_min;
                }
            }
            Ok(Err(e)) => {
                shared.parent_connect_failures.inc();
                tracing::debug!(%parent, error = %e, ?backoff, "router: connecting to parent failed");
            }
            Err(_) => {
                shared.parent_connect_failures.inc();
                tracing::debug!(%parent, timeout = ?t.connect_timeout, "router: connecting to parent timed out");
            }
        }
        sleep(jittered(backoff)).await;
        backoff = (backoff * 2).min(t.backoff_max);
    }
}

async fn stats_logger(shared: Arc<Shared>, every: Duration) {
    loop {
        sleep(every).await;
        let s = shared.stats();
        let t = s.totals();
        tracing::info!(
            links = s.links.len(),
            parent = s.parent_connected(),
            frames_in = t.frames_in,
            frames_out = t.frames_out,
            dropped_full = t.dropped_full,
            faults = t.faults.total(),
            link_errors = s.link_errors,
            "router: stats"
        );
    }
}

/// The router, as a namespace for [`Router::spawn`] and [`Router::run`].
pub struct Router;

impl Router {
    /// Binds `config.listen` (so the address is known and bind errors are returned here) and
    /// runs the router on a new thread.
    pub fn spawn(config: RouterConfig) -> Result<RouterHandle, RouterError> {
        config.validate()?;
        let listen = config.listen;
        let std_listener =
            std::net::TcpListener::bind(listen).map_err(|source| RouterError::Bind { addr: listen, source })?;
        let io = |what| move |source| RouterError::Io { addr: listen, what, source };
        std_listener.set_nonblocking(true).map_err(io("set_nonblocking"))?;
        let local_addr = std_listener.local_addr().map_err(io("local_addr"))?;
        let rt = if config.worker_threads == 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(config.worker_threads)
                .thread_name("psl-router-worker")
                .enable_all()
                .build()
        }
        .map_err(io("building the tokio runtime"))?;
        let shared = Arc::new(Shared {
            cfg: config,
            local_addr,
            links: RwLock::new(BTreeMap::new()),
            closed: Mutex::new(LinkTotals::default()),
            next_link: AtomicU64::new(0),
            accepted: Counter::default(),
            refused_links_max: Counter::default(),
            parent_connects: Counter::default(),
            parent_connect_failures: Counter::default(),
            link_errors: Counter::default(),
        });
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), std::io::Error>>(1);
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("psl-router-{}", local_addr.port()))
            .spawn(move || {
                rt.block_on(async {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => {
                            let _ = ready_tx.send(Ok(()));
                            l
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    tracing::info!(addr = %local_addr, parent = ?sh.cfg.parent, faults = sh.cfg.faults.is_some(), "router: listening");
                    if let Some(parent) = sh.cfg.parent {
                        tokio::spawn(parent_loop(sh.clone(), parent));
                    }
                    if let Some(every) = sh.cfg.stats_log_interval {
                        tokio::spawn(stats_logger(sh.clone(), every));
                    }
                    tokio::select! {
                        _ = stop_rx => {}
                        () = accept_loop(sh.clone(), listener) => {}
                    }
                });
                // Drops every task, so every socket closes and every link leaves the table.
                rt.shutdown_timeout(Duration::from_secs(1));
                tracing::info!(addr = %local_addr, "router: stopped");
            })
            .map_err(io("spawning the router thread"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(RouterHandle { shared, stop: Some(stop_tx), thread: Some(thread) }),
            Ok(Err(source)) => {
                let _ = thread.join();
                Err(RouterError::Io { addr: local_addr, what: "registering the listener", source })
            }
            Err(_) => {
                let _ = thread.join();
                Err(RouterError::Panicked { addr: local_addr })
            }
        }
    }

    /// Runs a router on the calling thread's behalf until it stops (it stops only if its
    /// thread dies: this is the entry point of a router process).
    pub fn run(config: RouterConfig) -> Result<(), RouterError> {
        Router::spawn(config)?.wait()
    }
}

/// Runs a router until it stops; see [`Router::run`].
pub fn run(config: RouterConfig) -> Result<(), RouterError> {
    Router::run(config)
}

/// A running router. Dropping it shuts the router down.
pub struct RouterHandle {
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RouterHandle {
    /// The address the router listens on (with the real port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// A snapshot of the router's counters.
    pub fn stats(&self) -> RouterStats {
        self.shared.stats()
    }

    /// Stops accepting, closes every link, and waits (bounded) for the router thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    /// Blocks until the router thread ends.
    pub fn wait(mut self) -> Result<(), RouterError> {
        let addr = self.shared.local_addr;
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => Err(RouterError::Panicked { addr }),
            _ => Ok(()),
        }
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RouterHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

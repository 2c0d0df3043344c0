//! [`TcpEndpoint`]: an endpoint attached to a router of the TCP fabric.
//!
//! The endpoint owns one thread running a current-thread tokio runtime (the project's async
//! runtime; the router uses the same link code) that keeps one connection to the router:
//! frames read go to the bounded receive queue (crossbeam, so `recv_timeout` is a cheap
//! blocking wait on the caller's thread), and a bounded outbound queue feeds the writer. When
//! the connection breaks, messages still queued are dropped and counted, and the endpoint
//! reconnects with exponential backoff (`backoff_min` doubling to `backoff_max`, with jitter);
//! messages published meanwhile are dropped and counted in `dropped_disconnected`.
//!
//! `connect` returns only once the first connection is up (bounded by `connect_timeout`), so a
//! wrong address fails at once; later breaks are repaired in the background.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout};

use crate::config::{check_frame, check_queue, LinkTiming, FRAME_BYTES_MAX_DEFAULT};
use crate::config::{QUEUE_BYTES_MAX_DEFAULT, QUEUE_MSGS_MAX_DEFAULT};
use crate::error::{ConfigError, FabricError, LinkEnd};
use crate::fabric::{check_outgoing, Fabric, Message};
use crate::link::{jittered, outbox, read_loop, write_loop, Flag, LinkCounters, Outbox, OutboxRx, Refused};
use crate::queue::Inbox;
use crate::stats::{Counter, FabricStats};

/// Configuration of a [`TcpEndpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Names the endpoint in errors and logs (default `"tcp"`).
    pub name: String,
    /// Longest receive queue, in messages (default 4096).
    pub queue_msgs_max: usize,
    /// Largest receive queue, in payload bytes (default 64 MiB).
    pub queue_bytes_max: usize,
    /// Longest outbound queue, in messages (default 4096).
    pub send_queue_msgs_max: usize,
    /// Largest outbound queue, in payload bytes (default 64 MiB).
    pub send_queue_bytes_max: usize,
    /// Largest message, sent or received (default 16 MiB).
    pub frame_bytes_max: usize,
    /// Connect, reconnect backoff, heartbeat, idle and write timings of the link to the router.
    pub timing: LinkTiming,
    /// What this endpoint wants (`None`: everything). Sent as the first frame of every
    /// connection ([`crate::Interest::encode_frame`]), so the router forwards it only the
    /// messages it takes.
    pub interest: Option<crate::Interest>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            name: "tcp".into(),
            queue_msgs_max: QUEUE_MSGS_MAX_DEFAULT,
            queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            send_queue_msgs_max: QUEUE_MSGS_MAX_DEFAULT,
            send_queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            timing: LinkTiming::default(),
            interest: None,
        }
    }
}

impl TcpConfig {
    /// Checks that every limit and timing can work; the error names the first field that
    /// cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_queue("queue_msgs_max", "queue_bytes_max", self.queue_msgs_max, self.queue_bytes_max)?;
        check_queue(
            "send_queue_msgs_max",
            "send_queue_bytes_max",
            self.send_queue_msgs_max,
            self.send_queue_bytes_max,
        )?;
        check_frame(self.frame_bytes_max)?;
        self.timing.validate()
    }
}

struct Shared {
    endpoint: String,
    router: SocketAddr,
    cfg: TcpConfig,
    inbox: Arc<Inbox>,
    connected: Flag,
    /// False once the I/O thread has ended.
    alive: Flag,
    link: LinkCounters,
    sent: Counter,
    sent_bytes: Counter,
    dropped_send_full: Counter,
    dropped_disconnected: Counter,
    connects: Counter,
    link_errors: Counter,
}

/// An endpoint of the TCP fabric. Dropping it closes the connection and stops its thread.
pub struct TcpEndpoint {
    shared: Arc<Shared>,
    out: Outbox,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TcpEndpoint {
    /// Connects to the router at `router` (waiting at most `connect_timeout`) and keeps the
    /// connection up from then on.
    pub fn connect(router: SocketAddr, config: TcpConfig) -> Result<TcpEndpoint, FabricError> {
        config.validate()?;
        let endpoint = format!("{}->{}", config.name, router);
        let io = |what: &'static str| {
            let endpoint = endpoint.clone();
            move |source| FabricError::Io { endpoint, what, source }
        };
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("building the runtime"))?;
        let connect_timeout = config.timing.connect_timeout;
        let first = match rt.block_on(async { timeout(connect_timeout, TcpStream::connect(router)).await }) {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => return Err(FabricError::Connect { endpoint, addr: router, source }),
            Err(_) => {
                let source = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {:?}", config.timing.connect_timeout),
                );
                return Err(FabricError::Connect { endpoint, addr: router, source });
            }
        };
        let (out, out_rx) = outbox(config.send_queue_msgs_max, config.send_queue_bytes_max);
        let shared = Arc::new(Shared {
            endpoint: endpoint.clone(),
            router,
            inbox: Inbox::new(config.queue_msgs_max, config.queue_bytes_max),
            cfg: config,
            connected: Flag::default(),
            alive: Flag::default(),
            link: LinkCounters::default(),
            sent: Counter::default(),
            sent_bytes: Counter::default(),
            dropped_send_full: Counter::default(),
            dropped_disconnected: Counter::default(),
            connects: Counter::default(),
            link_errors: Counter::default(),
        });
        shared.connected.set(true);
        shared.alive.set(true);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("psl-fabric-{}", sh.cfg.name))
            .spawn(move || {
                rt.block_on(async {
                    tokio::select! {
                        _ = stop_rx => {}
                        () = connection_loop(&sh, first, out_rx) => {}
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
                sh.connected.set(false);
                sh.alive.set(false);
            })
            .map_err(io("spawning the I/O thread"))?;
        Ok(TcpEndpoint { shared, out, stop: Some(stop_tx), thread: Some(thread) })
    }

    /// True while a connection to the router is up.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.get()
    }

    /// Waits (at most `timeout`) until connected; true if connected.
    pub fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.is_connected() {
            if Instant::now() >= deadline || !self.shared.alive.get() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// The router this endpoint connects to.
    pub fn router_addr(&self) -> SocketAddr {
        self.shared.router
    }

    fn closed(&self) -> FabricError {
        FabricError::Closed { endpoint: self.shared.endpoint.clone(), reason: "the I/O thread has ended".into() }
    }
}

async fn connection_loop(sh: &Shared, first: TcpStream, mut out_rx: OutboxRx) {
    let t = &sh.cfg.timing;
    let mut stream = Some(first);
    let mut backoff = t.backoff_min;
    loop {
        if let Some(s) = stream.take() {
            sh.connects.inc();
            sh.connected.set(true);
            tracing::info!(endpoint = %sh.endpoint, "fabric: connected to router");
            let started = tokio::time::Instant::now();
            let end = serve(sh, s, &mut out_rx).await;
            sh.connected.set(false);
            let lost = out_rx.discard_all();
            sh.dropped_disconnected.add(lost);
            match end {
                LinkEnd::PeerClosed => {
                    tracing::info!(endpoint = %sh.endpoint, lost, "fabric: router closed the connection")
                }
                e => {
                    sh.link_errors.inc();
                    tracing::warn!(endpoint = %sh.endpoint, lost, error = %e, "fabric: connection to router lost");
                }
            }
            if started.elapsed() >= t.backoff_max {
                backoff = t.backoff_min;
            }
        }
        sleep(jittered(backoff)).await;
        backoff = (backoff * 2).min(t.backoff_max);
        match timeout(t.connect_timeout, TcpStream::connect(sh.router)).await {
            Ok(Ok(s)) => stream = Some(s),
            Ok(Err(e)) => tracing::debug!(endpoint = %sh.endpoint, error = %e, "fabric: reconnect failed"),
            Err(_) => tracing::debug!(endpoint = %sh.endpoint, "fabric: reconnect timed out"),
        }
    }
}

async fn serve(sh: &Shared, stream: TcpStream, out_rx: &mut OutboxRx) -> LinkEnd {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(endpoint = %sh.endpoint, error = %e, "fabric: cannot set TCP_NODELAY");
    }
    let (rd, mut wr) = stream.into_split();
    let t = &sh.cfg.timing;
    let max = sh.cfg.frame_bytes_max;
    if let Some(interest) = &sh.cfg.interest {
        // First, before anything queued: the router filters from the next frame on.
        let frame = match crate::frame::encode(&interest.encode_frame(), max) {
            Ok(f) => f,
            Err(e) => return LinkEnd::Frame(e),
        };
        match timeout(t.write_timeout, tokio::io::AsyncWriteExt::write_all(&mut wr, &frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return LinkEnd::Io { what: "sending the interest frame", source },
            Err(_) => return LinkEnd::WriteTimeout(t.write_timeout),
        }
    }
    tokio::select! {
        e = read_loop(rd, max, t.idle_timeout, &sh.link, |f| { sh.inbox.offer(f); }) => e,
        e = write_loop(wr, out_rx, None, t, max, &sh.link) => e,
    }
}

impl Fabric for TcpEndpoint {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        check_outgoing(&self.shared.endpoint, &msg, self.shared.cfg.frame_bytes_max)?;
        if !self.shared.alive.get() {
            return Err(self.closed());
        }
        if !self.shared.connected.get() {
            self.shared.dropped_disconnected.inc();
            return Ok(());
        }
        let n = msg.len();
        match self.out.offer(msg) {
            Ok(()) => {
                self.shared.sent.inc();
                self.shared.sent_bytes.add(n as u64);
                Ok(())
            }
            Err(Refused::Full) => {
                self.shared.dropped_send_full.inc();
                Ok(())
            }
            Err(Refused::Closed) => Err(self.closed()),
        }
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        match self.shared.inbox.recv_timeout(timeout) {
            Some(m) => Ok(Some(m)),
            None if !self.shared.alive.get() => Err(self.closed()),
            None => Ok(None),
        }
    }

    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        match self.shared.inbox.try_recv() {
            Some(m) => Ok(Some(m)),
            None if !self.shared.alive.get() => Err(self.closed()),
            None => Ok(None),
        }
    }

    fn stats(&self) -> FabricStats {
        let s = &self.shared;
        FabricStats {
            sent: s.sent.get(),
            sent_bytes: s.sent_bytes.get(),
            received: s.inbox.received.get(),
            received_bytes: s.inbox.received_bytes.get(),
            dropped_full: s.inbox.dropped_full.get(),
            dropped_send_full: s.dropped_send_full.get(),
            dropped_disconnected: s.dropped_disconnected.get(),
            connects: s.connects.get(),
            link_errors: s.link_errors.get(),
            frames_refused: s.link.frames_refused.get(),
            ..FabricStats::default()
        }
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

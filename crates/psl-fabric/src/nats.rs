//! [`NatsEndpoint`]: an endpoint on a NATS deployment (core NATS: no JetStream; durability is
//! the capsule servers' job).
//!
//! The endpoint owns one thread running a current-thread tokio runtime with an `async-nats`
//! client. `publish` never waits on the network: it checks the message, then offers it to a
//! bounded outbound queue (messages and bytes) or drops and counts it; a task on the I/O
//! thread takes messages from that queue, picks each one's subject from its public header
//! ([`crate::subject`]) and hands it to the client. Subscriptions (one per subject the
//! endpoint's [`Interest`] names, plus the catch-all) are drained by a task into the bounded
//! receive queue that `recv_timeout`/`try_recv` read, exactly as the TCP endpoint does.
//!
//! Faults and how they are counted (see [`FabricStats`]):
//! - a connection lost (server killed, link cut, server closing a slow consumer): the client
//!   reconnects to any server it knows (the URLs given, and those the cluster advertises),
//!   with backoff `backoff_min` doubling to `backoff_max`, and re-subscribes; `disconnects`
//!   and `connects` count it, and messages published while disconnected are dropped and
//!   counted in `dropped_disconnected`;
//! - a dead link without a FIN is found by the client's pings (`ping_interval`, default 1 s;
//!   the connection is dropped after two unanswered pings);
//! - a subscription whose client-side buffer is full (`subscription_capacity`) loses messages:
//!   each such event is counted in `slow_consumer_events`; a full receive queue drops as on
//!   every backend (`dropped_full`);
//! - the server's errors (authorization, permissions, max payload) are counted in
//!   `server_errors` and logged.
//!
//! `connect` returns once connected and subscribed (every subscription confirmed by a flush),
//! or fails within `connect_timeout` per server: a wrong URL fails at once, as for TCP.
//! Messages are published with `no_echo`, so an endpoint never receives its own (the trait's
//! "every other endpoint").

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::oneshot;

use crate::config::{check_frame, check_queue, FRAME_BYTES_MAX_DEFAULT};
use crate::config::{QUEUE_BYTES_MAX_DEFAULT, QUEUE_MSGS_MAX_DEFAULT};
use crate::error::{ConfigError, FabricError};
use crate::fabric::{check_outgoing, Fabric, Message};
use crate::link::{jittered, outbox, Flag, Outbox, OutboxRx, Refused};
use crate::queue::Inbox;
use crate::stats::{Counter, FabricStats};
use crate::subject::{self, Interest, Leaf, Route};

/// Configuration of a [`NatsEndpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Names the endpoint in errors, logs and the NATS connection name (default `"nats"`).
    pub name: String,
    /// First token(s) of every subject (default `psl`): several deployments can share one NATS
    /// account under different prefixes.
    pub prefix: String,
    /// A NATS credentials file (JWT and NKey seed), as issued by the NATS operator.
    pub creds: Option<PathBuf>,
    /// A CA certificate (PEM) to verify the servers' TLS certificates with; TLS is then required.
    pub tls_ca: Option<PathBuf>,
    /// Longest receive queue, in messages (default 4096).
    pub queue_msgs_max: usize,
    /// Largest receive queue, in payload bytes (default 64 MiB).
    pub queue_bytes_max: usize,
    /// Longest outbound queue, in messages (default 4096).
    pub send_queue_msgs_max: usize,
    /// Largest outbound queue, in payload bytes (default 64 MiB).
    pub send_queue_bytes_max: usize,
    /// Largest message (default 16 MiB). The server's `max_payload` lowers it further: a
    /// bigger message is refused by `publish` (nothing could carry it).
    pub frame_bytes_max: usize,
    /// Longest wait for one connection attempt, handshake included (default 2 s).
    pub connect_timeout: Duration,
    /// Client pings; two unanswered ones drop the connection (default 1 s).
    pub ping_interval: Duration,
    /// First wait before reconnecting (default 50 ms), doubled after each failure...
    pub backoff_min: Duration,
    /// ...up to this (default 2 s).
    pub backoff_max: Duration,
    /// Messages the client buffers per subscription before it reports a slow consumer and
    /// drops (default 8192).
    pub subscription_capacity: usize,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            name: "nats".into(),
            prefix: subject::SUBJECT_PREFIX_DEFAULT.into(),
            creds: None,
            tls_ca: None,
            queue_msgs_max: QUEUE_MSGS_MAX_DEFAULT,
            queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            send_queue_msgs_max: QUEUE_MSGS_MAX_DEFAULT,
            send_queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            connect_timeout: Duration::from_secs(2),
            ping_interval: Duration::from_secs(1),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            subscription_capacity: 8192,
        }
    }
}

impl NatsConfig {
    /// Checks that every limit, timing and the subject prefix can work; the error names the
    /// first field that cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_queue("queue_msgs_max", "queue_bytes_max", self.queue_msgs_max, self.queue_bytes_max)?;
        check_queue(
            "send_queue_msgs_max",
            "send_queue_bytes_max",
            self.send_queue_msgs_max,
            self.send_queue_bytes_max,
        )?;
        check_frame(self.frame_bytes_max)?;
        if !subject::valid_prefix(&self.prefix) {
            return Err(ConfigError::new(
                "prefix",
                format!("{:?} is not dot-separated [A-Za-z0-9_-] tokens", self.prefix),
            ));
        }
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("ping_interval", self.ping_interval),
            ("backoff_min", self.backoff_min),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(field, "must be greater than zero"));
            }
        }
        if self.backoff_max < self.backoff_min {
            return Err(ConfigError::new("backoff_max", "must be at least backoff_min"));
        }
        if self.subscription_capacity == 0 {
            return Err(ConfigError::new("subscription_capacity", "must be at least 1"));
        }
        Ok(())
    }
}

struct Shared {
    endpoint: String,
    cfg: NatsConfig,
    inbox: Arc<Inbox>,
    connected: Flag,
    alive: Flag,
    /// min(frame_bytes_max, the server's max_payload).
    payload_max: AtomicUsize,
    sent: Counter,
    sent_bytes: Counter,
    dropped_send_full: Counter,
    dropped_disconnected: Counter,
    connects: Counter,
    disconnects: Counter,
    slow_consumer_events: Counter,
    server_errors: Counter,
    publish_failures: Counter,
    subjects_published: Counter,
}

/// An endpoint on NATS. Dropping it closes the connection and stops its thread.
pub struct NatsEndpoint {
    shared: Arc<Shared>,
    out: Outbox,
    servers: Vec<String>,
    subjects: Vec<String>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl NatsEndpoint {
    /// Connects to one of `servers` (`nats://host:port` or `tls://host:port`), subscribes to
    /// what `interest` names, and keeps the connection up from then on.
    pub fn connect(servers: &[String], interest: &Interest, config: NatsConfig) -> Result<NatsEndpoint, FabricError> {
        config.validate()?;
        if servers.is_empty() {
            return Err(ConfigError::new("servers", "at least one NATS server URL is needed").into());
        }
        let endpoint = format!("{}->{}", config.name, servers.join(","));
        let io = |what: &'static str| {
            let endpoint = endpoint.clone();
            move |source| FabricError::Io { endpoint, what, source }
        };
        let subjects = interest.subjects(&config.prefix);
        let (out, out_rx) = outbox(config.send_queue_msgs_max, config.send_queue_bytes_max);
        let shared = Arc::new(Shared {
            endpoint: endpoint.clone(),
            inbox: Inbox::new(config.queue_msgs_max, config.queue_bytes_max),
            payload_max: AtomicUsize::new(config.frame_bytes_max),
            cfg: config,
            connected: Flag::default(),
            alive: Flag::default(),
            sent: Counter::default(),
            sent_bytes: Counter::default(),
            dropped_send_full: Counter::default(),
            dropped_disconnected: Counter::default(),
            connects: Counter::default(),
            disconnects: Counter::default(),
            slow_consumer_events: Counter::default(),
            server_errors: Counter::default(),
            publish_failures: Counter::default(),
            subjects_published: Counter::default(),
        });
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("building the runtime"))?;
        let client = rt.block_on(first_connect(&shared, servers))?;
        let subs = rt.block_on(async {
            let mut subs = Vec::with_capacity(subjects.len());
            for s in &subjects {
                subs.push(client.subscribe(s.clone()).await.map_err(|e| FabricError::Nats {
                    endpoint: endpoint.clone(),
                    what: "subscribing",
                    reason: format!("{s}: {e}"),
                })?);
            }
            client.flush().await.map_err(|e| FabricError::Nats {
                endpoint: endpoint.clone(),
                what: "confirming the subscriptions",
                reason: e.to_string(),
            })?;
            Ok::<_, FabricError>(subs)
        })?;
        shared.alive.set(true);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("psl-nats-{}", sh.cfg.name))
            .spawn(move || {
                rt.block_on(async {
                    tokio::select! {
                        _ = stop_rx => {}
                        () = receive_loop(&sh, subs) => {}
                        () = publish_loop(&sh, &client, out_rx) => {}
                    }
                });
                drop(client);
                rt.shutdown_timeout(Duration::from_secs(1));
                sh.connected.set(false);
                sh.alive.set(false);
            })
            .map_err(io("spawning the I/O thread"))?;
        Ok(NatsEndpoint { shared, out, servers: servers.to_vec(), subjects, stop: Some(stop_tx), thread: Some(thread) })
    }

    /// True while connected to a NATS server.
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

    /// The server URLs this endpoint was given.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The subjects this endpoint subscribed to.
    pub fn subjects(&self) -> &[String] {
        &self.subjects
    }

    fn closed(&self) -> FabricError {
        FabricError::Closed { endpoint: self.shared.endpoint.clone(), reason: "the I/O thread has ended".into() }
    }
}

/// The first connection: every option set, events counted, at most `connect_timeout` per server.
async fn first_connect(sh: &Arc<Shared>, servers: &[String]) -> Result<async_nats::Client, FabricError> {
    let cfg = &sh.cfg;
    let err = |what: &'static str, reason: String| FabricError::Nats { endpoint: sh.endpoint.clone(), what, reason };
    let mut opts = match &cfg.creds {
        Some(p) => async_nats::ConnectOptions::with_credentials_file(p.clone())
            .await
            .map_err(|e| err("reading the credentials file", format!("{}: {e}", p.display())))?,
        None => async_nats::ConnectOptions::new(),
    };
    if let Some(ca) = &cfg.tls_ca {
        if !ca.is_file() {
            return Err(err("reading the TLS CA", format!("{} is not a file", ca.display())));
        }
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    let (bmin, bmax) = (cfg.backoff_min, cfg.backoff_max);
    let ev = sh.clone();
    opts = opts
        .name(&cfg.name)
        .no_echo()
        .connection_timeout(cfg.connect_timeout)
        .ping_interval(cfg.ping_interval)
        .subscription_capacity(cfg.subscription_capacity)
        .client_capacity(cfg.send_queue_msgs_max.clamp(256, 65_536))
        .skip_subject_validation(true)
        .request_timeout(Some(cfg.connect_timeout))
        .reconnect_delay_callback(move |attempts| {
            let exp = bmin.saturating_mul(1u32 << attempts.min(16) as u32);
            jittered(exp.min(bmax))
        })
        .event_callback(move |event| {
            let sh = ev.clone();
            async move { on_event(&sh, event) }
        });
    let urls: Vec<async_nats::ServerAddr> = servers
        .iter()
        .map(|s| s.parse::<async_nats::ServerAddr>().map_err(|e| err("parsing the server URL", format!("{s}: {e}"))))
        .collect::<Result<_, _>>()?;
    // Each server gets `connect_timeout`; the client itself tries them in turn.
    let budget = cfg.connect_timeout.saturating_mul(urls.len() as u32 + 1);
    let client = match tokio::time::timeout(budget, opts.connect(urls)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(err("connecting", e.to_string())),
        Err(_) => return Err(err("connecting", format!("no server answered within {budget:?}"))),
    };
    // (The client's `Connected` event counts the connection.)
    sh.connected.set(true);
    let info = client.server_info();
    if info.max_payload > 0 {
        sh.payload_max.store(cfg.frame_bytes_max.min(info.max_payload), Ordering::Relaxed);
        if info.max_payload < cfg.frame_bytes_max {
            tracing::warn!(
                endpoint = %sh.endpoint,
                server_max_payload = info.max_payload,
                frame_bytes_max = cfg.frame_bytes_max,
                "NATS server's max_payload is below the fabric's frame limit: larger records will be refused"
            );
        }
    }
    tracing::info!(endpoint = %sh.endpoint, server = %info.server_name, "fabric: connected to NATS");
    Ok(client)
}

fn on_event(sh: &Shared, event: async_nats::Event) {
    use async_nats::Event;
    match event {
        Event::Connected => {
            sh.connects.inc();
            sh.connected.set(true);
            tracing::info!(endpoint = %sh.endpoint, "fabric: NATS connection up");
        }
        Event::Disconnected => {
            sh.disconnects.inc();
            sh.connected.set(false);
            tracing::warn!(endpoint = %sh.endpoint, "fabric: NATS connection lost; reconnecting");
        }
        Event::SlowConsumer(sid) => {
            sh.slow_consumer_events.inc();
            tracing::debug!(endpoint = %sh.endpoint, sid, "fabric: NATS subscription overflowed (slow consumer)");
        }
        Event::ServerError(e) => {
            sh.server_errors.inc();
            tracing::warn!(endpoint = %sh.endpoint, error = %e, "fabric: NATS server error");
        }
        Event::ClientError(e) => {
            sh.server_errors.inc();
            tracing::warn!(endpoint = %sh.endpoint, error = %e, "fabric: NATS client error");
        }
        Event::LameDuckMode => {
            tracing::info!(endpoint = %sh.endpoint, "fabric: NATS server entering lame duck mode")
        }
        Event::Draining | Event::Closed => {
            sh.connected.set(false);
        }
    }
}

/// Subscriptions → the bounded receive queue.
async fn receive_loop(sh: &Shared, subs: Vec<async_nats::Subscriber>) {
    let mut all = futures_util::stream::select_all(subs);
    while let Some(m) = all.next().await {
        if !m.payload.is_empty() {
            sh.inbox.offer(m.payload);
        }
    }
    // Every subscription ended: the client is closed for good.
    tracing::warn!(endpoint = %sh.endpoint, "fabric: NATS subscriptions ended");
}

/// The outbound queue → the client, each message on its subject(s).
async fn publish_loop(sh: &Shared, client: &async_nats::Client, mut rx: OutboxRx) {
    let prefix = sh.cfg.prefix.as_str();
    let any = subject::any_subject(prefix);
    // Subjects of the capsules seen lately (a node publishes for one or a few).
    let mut cache: Vec<([u8; 32], Leaf, async_nats::Subject)> = Vec::new();
    while let Some(m) = rx.recv().await {
        match subject::classify(&m) {
            Route::Any => publish_one(sh, client, async_nats::Subject::from(any.as_str()), m).await,
            Route::Capsule { capsule, leaves } => {
                for leaf in leaves {
                    let subj = match cache.iter().find(|(c, l, _)| *c == capsule && *l == leaf) {
                        Some((_, _, s)) => s.clone(),
                        None => {
                            let s = async_nats::Subject::from(subject::subject(prefix, &capsule, leaf));
                            if cache.len() >= 64 {
                                cache.remove(0);
                            }
                            cache.push((capsule, leaf, s.clone()));
                            s
                        }
                    };
                    publish_one(sh, client, subj, m.clone()).await;
                }
            }
        }
    }
}

async fn publish_one(sh: &Shared, client: &async_nats::Client, subject: async_nats::Subject, m: Bytes) {
    sh.subjects_published.inc();
    if let Err(e) = client.publish(subject, m).await {
        sh.publish_failures.inc();
        tracing::debug!(endpoint = %sh.endpoint, error = %e, "fabric: NATS publish failed");
    }
}

impl Fabric for NatsEndpoint {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        let max = self.shared.payload_max.load(Ordering::Relaxed);
        check_outgoing(&self.shared.endpoint, &msg, max)?;
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
            connects: s.connects.get().max(1),
            link_errors: s.disconnects.get(),
            disconnects: s.disconnects.get(),
            slow_consumer_events: s.slow_consumer_events.get(),
            server_errors: s.server_errors.get(),
            publish_failures: s.publish_failures.get(),
            subjects_published: s.subjects_published.get(),
            ..FabricStats::default()
        }
    }
}

impl Drop for NatsEndpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

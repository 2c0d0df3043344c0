//! One TCP link, shared by the router and the TCP endpoint: the bounded outbound queue, the
//! read loop (frames in, idle timeout) and the write loop (frames out, batching, heartbeats,
//! write timeout, optional fault injection).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant};

use crate::config::LinkTiming;
use crate::error::LinkEnd;
use crate::fault::FaultInjector;
use crate::frame::{encode_header, FrameDecoder};
use crate::queue::ByteBudget;
use crate::stats::{Counter, FaultStats};

/// Read buffer of a link.
const READ_CHUNK: usize = 64 << 10;
/// Write buffer of a link: small frames are coalesced into one write.
const WRITE_BUFFER: usize = 64 << 10;
/// Most messages taken from the queue before the buffer is flushed.
const WRITE_BATCH: usize = 256;
const HEARTBEAT: [u8; 4] = [0; 4];

/// Counters of one link.
#[derive(Debug, Default)]
pub(crate) struct LinkCounters {
    pub(crate) frames_in: Counter,
    pub(crate) bytes_in: Counter,
    pub(crate) frames_out: Counter,
    pub(crate) bytes_out: Counter,
    pub(crate) dropped_full: Counter,
    pub(crate) frames_refused: Counter,
    /// Frames the router did not forward on this link: its endpoint's interest does not want
    /// them.
    pub(crate) filtered: Counter,
}

/// The producer side of a link's bounded outbound queue (messages and bytes).
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Bytes>,
    budget: Arc<ByteBudget>,
}

pub(crate) enum Refused {
    Full,
    Closed,
}

/// The consumer side.
#[derive(Debug)]
pub(crate) struct OutboxRx {
    rx: mpsc::Receiver<Bytes>,
    budget: Arc<ByteBudget>,
}

pub(crate) fn outbox(msgs_max: usize, bytes_max: usize) -> (Outbox, OutboxRx) {
    let (tx, rx) = mpsc::channel(msgs_max);
    let budget = Arc::new(ByteBudget::new(bytes_max));
    (Outbox { tx, budget: budget.clone() }, OutboxRx { rx, budget })
}

impl Outbox {
    /// Queues `msg` without waiting.
    pub(crate) fn offer(&self, msg: Bytes) -> Result<(), Refused> {
        let n = msg.len();
        if !self.budget.take(n) {
            return Err(Refused::Full);
        }
        self.tx.try_send(msg).map_err(|e| {
            self.budget.give_back(n);
            match e {
                mpsc::error::TrySendError::Full(_) => Refused::Full,
                mpsc::error::TrySendError::Closed(_) => Refused::Closed,
            }
        })
    }
}

impl OutboxRx {
    pub(crate) async fn recv(&mut self) -> Option<Bytes> {
        let m = self.rx.recv().await?;
        self.budget.give_back(m.len());
        Some(m)
    }

    fn try_recv(&mut self) -> Option<Bytes> {
        let m = self.rx.try_recv().ok()?;
        self.budget.give_back(m.len());
        Some(m)
    }

    /// Empties the queue; returns how many messages were discarded.
    pub(crate) fn discard_all(&mut self) -> u64 {
        let mut n = 0;
        while self.try_recv().is_some() {
            n += 1;
        }
        n
    }
}

/// Reads frames until the link ends; hands every non-empty payload to `on_frame`.
pub(crate) async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    frame_bytes_max: usize,
    idle_timeout: Duration,
    ctr: &LinkCounters,
    mut on_frame: impl FnMut(Bytes),
) -> LinkEnd {
    let mut dec = FrameDecoder::new(frame_bytes_max);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut frames = Vec::new();
    loop {
        let n = match timeout(idle_timeout, rd.read(&mut buf)).await {
            Err(_) => return LinkEnd::Idle(idle_timeout),
            Ok(Ok(0)) => return LinkEnd::PeerClosed,
            Ok(Ok(n)) => n,
            Ok(Err(source)) => return LinkEnd::Io { what: "read", source },
        };
        let fed = dec.feed_all(&buf[..n], &mut frames);
        for f in frames.drain(..) {
            if f.is_empty() {
                continue; // heartbeat
            }
            ctr.frames_in.inc();
            ctr.bytes_in.add(f.len() as u64);
            on_frame(f);
        }
        if let Err(e) = fed {
            ctr.frames_refused.inc();
            return LinkEnd::Frame(e);
        }
    }
}

/// Fault injection on a link's send path, with a snapshot of its counters for `stats()`.
pub(crate) struct LinkFaults<'a> {
    pub(crate) inj: FaultInjector,
    pub(crate) published: &'a Mutex<FaultStats>,
}

/// Writes queued messages as frames until the link ends. Sends a heartbeat when nothing was
/// written for `heartbeat_interval`; gives up when a write makes no progress for `write_timeout`.
pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    wr: W,
    rx: &mut OutboxRx,
    mut faults: Option<LinkFaults<'_>>,
    timing: &LinkTiming,
    frame_bytes_max: usize,
    ctr: &LinkCounters,
) -> LinkEnd {
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, wr);
    let mut batch: Vec<Bytes> = Vec::new();
    let mut last_write = Instant::now();
    loop {
        let heartbeat_due = last_write + timing.heartbeat_interval;
        let fault_due = faults.as_ref().and_then(|f| f.inj.next_deadline()).map(Instant::from_std);
        let wake = fault_due.map_or(heartbeat_due, |d| d.min(heartbeat_due));
        let first = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => Some(m),
                None => return LinkEnd::QueueClosed,
            },
            () = sleep_until(wake) => None,
        };
        let now = std::time::Instant::now();
        let mut take = |m: Bytes, batch: &mut Vec<Bytes>| match &mut faults {
            Some(f) => f.inj.push(m, now, batch),
            None => batch.push(m),
        };
        if let Some(m) = first {
            take(m, &mut batch);
            for _ in 1..WRITE_BATCH {
                match rx.try_recv() {
                    Some(m) => take(m, &mut batch),
                    None => break,
                }
            }
        }
        if let Some(f) = &mut faults {
            f.inj.poll(now, &mut batch);
            *f.published.lock().unwrap_or_else(|e| e.into_inner()) = f.inj.stats();
        }
        if batch.is_empty() {
            if Instant::now() >= heartbeat_due {
                if let Err(e) = write_all(&mut w, &HEARTBEAT, timing.write_timeout).await {
                    return e;
                }
                if let Err(e) = flush(&mut w, timing.write_timeout).await {
                    return e;
                }
                last_write = Instant::now();
            }
            continue;
        }
        for m in batch.drain(..) {
            let header = match encode_header(m.len(), frame_bytes_max) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e, "link: message over this link's frame limit not sent");
                    continue;
                }
            };
            if let Err(e) = write_all(&mut w, &header, timing.write_timeout).await {
                return e;
            }
            if let Err(e) = write_all(&mut w, &m, timing.write_timeout).await {
                return e;
            }
            ctr.frames_out.inc();
            ctr.bytes_out.add(m.len() as u64);
        }
        if let Err(e) = flush(&mut w, timing.write_timeout).await {
            return e;
        }
        last_write = Instant::now();
    }
}

/// `write_all` where each `write` call (not the whole buffer) must finish within `t`: a slow
/// peer that keeps reading is fine, a stalled one ends the link.
async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, mut buf: &[u8], t: Duration) -> Result<(), LinkEnd> {
    while !buf.is_empty() {
        match timeout(t, w.write(buf)).await {
            Err(_) => return Err(LinkEnd::WriteTimeout(t)),
            Ok(Ok(0)) => return Err(LinkEnd::PeerClosed),
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(source)) => return Err(LinkEnd::Io { what: "write", source }),
        }
    }
    Ok(())
}

async fn flush<W: AsyncWrite + Unpin>(w: &mut W, t: Duration) -> Result<(), LinkEnd> {
    match timeout(t, w.flush()).await {
        Err(_) => Err(LinkEnd::WriteTimeout(t)),
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(LinkEnd::Io { what: "write", source }),
    }
}

/// Backoff with up to 25% random jitter added, so a restarted router is not hit by every
/// reconnecting peer at the same instant.
pub(crate) fn jittered(d: Duration) -> Duration {
    let ms = d.as_millis() as u64;
    d + Duration::from_millis(rand::random::<u64>() % (ms / 4 + 1))
}

/// A flag readable from any thread.
#[derive(Debug, Default)]
pub(crate) struct Flag(std::sync::atomic::AtomicBool);

impl Flag {
    pub(crate) fn set(&self, v: bool) {
        self.0.store(v, Ordering::Release);
    }
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

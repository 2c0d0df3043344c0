//! Bounded queues: in messages *and* bytes. A full queue refuses (the caller drops and counts);
//! nothing grows without bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::stats::Counter;

/// The byte budget of one queue, shared by its producers and its consumer.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: AtomicUsize,
    max: usize,
}

impl ByteBudget {
    pub(crate) fn new(max: usize) -> Self {
        ByteBudget { used: AtomicUsize::new(0), max }
    }

    /// Reserves `n` bytes, or refuses if the budget would be exceeded.
    pub(crate) fn take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&v| v <= self.max) else {
                return false;
            };
            match self.used.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }

    pub(crate) fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The receive queue of one endpoint (crossbeam, bounded) with its counters.
#[derive(Debug)]
pub(crate) struct Inbox {
    tx: Sender<Bytes>,
    rx: Receiver<Bytes>,
    budget: ByteBudget,
    pub(crate) received: Counter,
    pub(crate) received_bytes: Counter,
    pub(crate) dropped_full: Counter,
}

impl Inbox {
    pub(crate) fn new(msgs_max: usize, bytes_max: usize) -> Arc<Inbox> {
        let (tx, rx) = crossbeam_channel::bounded(msgs_max);
        Arc::new(Inbox {
            tx,
            rx,
            budget: ByteBudget::new(bytes_max),
            received: Counter::default(),
            received_bytes: Counter::default(),
            dropped_full: Counter::default(),
        })
    }

    /// Queues `msg`, or drops and counts it if the queue is full. True if queued.
    pub(crate) fn offer(&self, msg: Bytes) -> bool {
        let n = msg.len();
        if !self.budget.take(n) {
            self.dropped_full.inc();
            return false;
        }
        match self.tx.try_send(msg) {
            Ok(()) => {
                self.received.inc();
                self.received_bytes.add(n as u64);
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.budget.give_back(n);
                self.dropped_full.inc();
                false
            }
        }
    }

    pub(crate) fn try_recv(&self) -> Option<Bytes> {
        let m = self.rx.try_recv().ok()?;
        self.budget.give_back(m.len());
        Some(m)
    }

    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Option<Bytes> {
        match self.rx.recv_timeout(timeout) {
            Ok(m) => {
                self.budget.give_back(m.len());
                Some(m)
            }
            // The inbox holds its own sender, so it is never disconnected.
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }
}

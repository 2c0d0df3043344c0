//! Counters. Snapshots are plain structs; the live counters are relaxed atomics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Faults injected by a [`crate::FaultInjector`], by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Messages that went into the injector.
    pub messages: u64,
    /// Messages lost (not emitted at all).
    pub dropped: u64,
    /// Messages emitted twice.
    pub duplicated: u64,
    /// Held back until up to `reorder_window` later messages have passed.
    pub reordered: u64,
    /// Held back for up to `delay_ms_max`.
    pub delayed: u64,
    /// Messages emitted with 1 to 4 bytes altered.
    pub corrupted: u64,
    /// Earlier messages sent again.
    pub replayed: u64,
}

impl FaultStats {
    /// Every fault of every kind.
    pub fn total(&self) -> u64 {
        self.dropped + self.duplicated + self.reordered + self.delayed + self.corrupted + self.replayed
    }

    /// Adds `other` to `self`, field by field.
    pub fn add(&mut self, other: &FaultStats) {
        self.messages += other.messages;
        self.dropped += other.dropped;
        self.duplicated += other.duplicated;
        self.reordered += other.reordered;
        self.delayed += other.delayed;
        self.corrupted += other.corrupted;
        self.replayed += other.replayed;
    }
}

/// What one endpoint has done. Fields a backend has no use for stay 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Messages accepted by `publish` (handed to the network).
    pub sent: u64,
    /// Payload bytes of the messages counted in `sent`.
    pub sent_bytes: u64,
    /// Messages that arrived and were queued for `recv`.
    pub received: u64,
    /// Payload bytes of the messages counted in `received`.
    pub received_bytes: u64,
    /// Arriving messages dropped because this endpoint's receive queue was full.
    pub dropped_full: u64,
    /// Published messages dropped because the outbound queue was full (TCP).
    pub dropped_send_full: u64,
    /// Published messages dropped because the endpoint was not connected (TCP), including those
    /// still queued when the connection broke.
    pub dropped_disconnected: u64,
    /// Connections made to the router, the first included (TCP).
    pub connects: u64,
    /// Links that ended in an error (reset, idle, oversize frame, write timeout) (TCP).
    pub link_errors: u64,
    /// Inbound frames refused for exceeding `frame_bytes_max` (the link is then closed) (TCP).
    pub frames_refused: u64,
    /// Connections to a NATS server lost (server gone, link cut, slow consumer closed by the
    /// server); each is followed by reconnect attempts (NATS).
    pub disconnects: u64,
    /// Times a subscription's client-side buffer overflowed and lost messages (NATS).
    pub slow_consumer_events: u64,
    /// Errors the NATS server or client reported (authorization, permissions, payload) (NATS).
    pub server_errors: u64,
    /// Messages taken from the outbound queue that the client refused (NATS).
    pub publish_failures: u64,
    /// Subject publishes made: one per message, more for an ack naming several nodes (NATS).
    pub subjects_published: u64,
    /// Faults injected (by [`crate::Adversarial`]; publish and receive sides added up).
    pub faults: FaultStats,
}

#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

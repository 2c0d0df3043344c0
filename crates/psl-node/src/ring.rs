//! The node's four ends of the two boundary rings: the core thread pushes outbound, the
//! dispatcher pops inbound, the host's outbound thread pops outbound and its inbound thread
//! pushes inbound. Items are whole wire messages (sealed records, repair requests and heads
//! hints), never keys or plaintext.

use bytes::Bytes;
use psl_boundary::{Consumer, Producer, SealedRecord};
use psl_scl::Metrics;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The core's outbound end.
pub(crate) struct CoreRing(Producer<SealedRecord>);

impl CoreRing {
    /// Pushes a message for the host, waiting (backpressure) while the ring is full. A host
    /// that stops draining for a whole second costs the message (counted), which repair
    /// recovers.
    pub fn push(&mut self, msg: Vec<u8>, metrics: &Metrics) {
        if self.0.push_blocking(msg.into(), Duration::from_secs(1)).is_err() {
            metrics.outbound_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("outbound ring full for 1 s: host side stalled; message dropped");
        }
    }
}

/// The dispatcher's inbound end.
pub(crate) struct InboundRing(Consumer<SealedRecord>);

impl InboundRing {
    pub fn wait_pop(&mut self, timeout: Duration) -> Option<SealedRecord> {
        self.0.wait_pop(timeout)
    }
}

/// The host's outbound end.
pub(crate) struct HostOut(Consumer<SealedRecord>);

impl HostOut {
    /// Waits up to `timeout` for one message, then takes up to `max` in all.
    pub fn pop_batch_wait(&mut self, out: &mut Vec<Bytes>, max: usize, timeout: Duration) -> usize {
        let Some(first) = self.0.wait_pop(timeout) else { return 0 };
        out.push(Bytes::from_owner(first));
        let mut more = Vec::new();
        self.0.pop_batch(&mut more, max.saturating_sub(1));
        out.extend(more.into_iter().map(Bytes::from_owner));
        out.len()
    }
}

/// The host's inbound end.
pub(crate) struct HostIn(Producer<SealedRecord>);

impl HostIn {
    /// Pushes a received message, waiting up to `timeout` for room. `false` if it was dropped.
    pub fn push_wait(&mut self, msg: Bytes, timeout: Duration) -> bool {
        self.0.push_blocking(SealedRecord::from(&msg[..]), timeout).is_ok()
    }
}

pub(crate) fn split(items: usize, backoff: psl_boundary::BackoffPolicy) -> (CoreRing, InboundRing, HostOut, HostIn) {
    let (core, host) = psl_boundary::Boundary::with_backoff(items.max(2), backoff, backoff);
    (CoreRing(core.outbound), InboundRing(core.inbound), HostOut(host.outbound), HostIn(host.inbound))
}

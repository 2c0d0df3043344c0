//! [`Boundary`]: the two rings of one node, split into the [`CoreSide`] and the [`HostSide`].

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backoff::BackoffPolicy;
use crate::ring::{duplex_with_backoff, Consumer, Full, Producer, RingMonitor, RingStats};
use crate::SealedRecord;

/// Makes the two rings between a node's trusted core and its untrusted host.
pub struct Boundary;

impl Boundary {
    /// Two rings of `capacity_items` records each (the bound on records in flight per
    /// direction), with the default [`BackoffPolicy`].
    ///
    /// # Panics
    /// If `capacity_items` is 0.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(capacity_items: usize) -> (CoreSide, HostSide) {
        Self::with_backoff(capacity_items, BackoffPolicy::default(), BackoffPolicy::default())
    }

    /// [`Boundary::new`] with a policy for each side's blocking operations (the core side may
    /// want to spin longer: in a real enclave, its sleep is an enclave exit).
    pub fn with_backoff(capacity_items: usize, core: BackoffPolicy, host: BackoffPolicy) -> (CoreSide, HostSide) {
        // One duplex pair: a record and the answer to it share a cache line (see `ring`).
        // Either side asking for a doorbell gives both rings one (each end still parks only if
        // its own policy says so).
        let doorbell = core.doorbell || host.doorbell;
        let ((mut out_tx, mut out_rx), (mut in_tx, mut in_rx)) = duplex_with_backoff(
            capacity_items,
            [BackoffPolicy { doorbell, ..core }, BackoffPolicy { doorbell, ..host }],
        );
        out_tx.set_backoff(core);
        out_rx.set_backoff(host);
        in_tx.set_backoff(host);
        in_rx.set_backoff(core);
        (CoreSide { outbound: out_tx, inbound: in_rx }, HostSide { outbound: out_rx, inbound: in_tx })
    }
}

/// The trusted core's ends: it pushes sealed records out and pops records that came in.
///
/// The two fields can be split and moved to different threads (say, the last crypto actor
/// pushes, the first verify actor pops); the methods are shorthands for the fields' methods.
#[derive(Debug)]
pub struct CoreSide {
    /// Core → host: sealed, signed records for the network and the capsule servers.
    pub outbound: Producer<SealedRecord>,
    /// Host → core: records received from other nodes, still to be verified.
    pub inbound: Consumer<SealedRecord>,
}

/// The untrusted host's ends: it pops records to send and pushes records it received.
#[derive(Debug)]
pub struct HostSide {
    /// Core → host.
    pub outbound: Consumer<SealedRecord>,
    /// Host → core.
    pub inbound: Producer<SealedRecord>,
}

/// Counters of both rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BoundaryStats {
    /// Core → host.
    pub outbound: RingStats,
    /// Host → core.
    pub inbound: RingStats,
}

/// A read-only, shareable view of both rings' counters (for a metrics endpoint).
#[derive(Debug, Clone)]
pub struct BoundaryMonitor {
    outbound: RingMonitor,
    inbound: RingMonitor,
}

impl BoundaryMonitor {
    /// Both rings' counters now.
    pub fn stats(&self) -> BoundaryStats {
        BoundaryStats { outbound: self.outbound.stats(), inbound: self.inbound.stats() }
    }
}

macro_rules! side_methods {
    ($side:ident, $tx:ident, $rx:ident, $to:literal, $from:literal) => {
        impl $side {
            #[doc = concat!("Pushes a record towards the ", $to, " if there is room, else hands it back.")]
            #[inline]
            pub fn push(&mut self, record: SealedRecord) -> Result<(), Full<SealedRecord>> {
                self.$tx.push(record)
            }

            #[doc = concat!("Pushes a record towards the ", $to, ", waiting up to `timeout` for room ")]
            /// (backpressure: see [`BackoffPolicy`]).
            pub fn push_blocking(&mut self, record: SealedRecord, timeout: Duration) -> Result<(), Full<SealedRecord>> {
                self.$tx.push_blocking(record, timeout)
            }

            /// [`Self::push_blocking`] with an absolute deadline.
            pub fn push_until(&mut self, record: SealedRecord, deadline: Instant) -> Result<(), Full<SealedRecord>> {
                self.$tx.push_until(record, deadline)
            }

            #[doc = concat!("Takes the oldest record from the ", $from, ", if any.")]
            #[inline]
            pub fn pop(&mut self) -> Option<SealedRecord> {
                self.$rx.pop()
            }

            #[doc = concat!("Moves up to `max` records from the ", $from, " to `out`; returns how many.")]
            pub fn pop_batch(&mut self, out: &mut Vec<SealedRecord>, max: usize) -> usize {
                self.$rx.pop_batch(out, max)
            }

            #[doc = concat!("Takes the oldest record from the ", $from, ", waiting up to `timeout`.")]
            pub fn wait_pop(&mut self, timeout: Duration) -> Option<SealedRecord> {
                self.$rx.wait_pop(timeout)
            }

            /// Counters of both rings.
            pub fn stats(&self) -> BoundaryStats {
                BoundaryStats { outbound: self.outbound.stats(), inbound: self.inbound.stats() }
            }

            /// A shareable read-only view of both rings' counters.
            pub fn monitor(&self) -> BoundaryMonitor {
                BoundaryMonitor { outbound: self.outbound.monitor(), inbound: self.inbound.monitor() }
            }
        }
    };
}

side_methods!(CoreSide, outbound, inbound, "host", "host");
side_methods!(HostSide, inbound, outbound, "core", "core");

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec(i: u8) -> SealedRecord {
        Arc::from(vec![i; 4])
    }

    #[test]
    fn directions_are_wired() {
        let (mut core, mut host) = Boundary::new(2);
        core.push(rec(1)).unwrap();
        host.push(rec(2)).unwrap();
        assert_eq!(host.pop().as_deref(), Some(&[1u8; 4][..]));
        assert_eq!(core.pop().as_deref(), Some(&[2u8; 4][..]));
        assert!(core.pop().is_none() && host.pop().is_none());
        let s = core.monitor().stats();
        assert_eq!(s, host.stats());
        assert_eq!((s.outbound.pushed, s.outbound.popped, s.inbound.pushed, s.inbound.popped), (1, 1, 1, 1));
    }

    #[test]
    fn policies_go_to_the_right_ends() {
        let core_policy = BackoffPolicy { spin_polls: 1, ..Default::default() };
        let (core, host) = Boundary::with_backoff(1, core_policy, BackoffPolicy::default());
        // Only observable through timing; this checks the construction does not panic and the
        // ends can be split and sent.
        let CoreSide { outbound, inbound } = core;
        let t = std::thread::spawn(move || (outbound.capacity(), inbound.capacity()));
        assert_eq!(t.join().unwrap(), (1, 1));
        drop(host);
    }
}

//! The untrusted host side: two threads that move opaque messages between the boundary rings
//! and the fabric. The outbound thread never waits on the inbound ring and vice versa, so a
//! stalled direction cannot stall the other.

use crate::ring::{HostIn, HostOut};
use psl_fabric::Fabric;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the inbound thread waits for a message before it checks the stop flag again: the
/// longest a node's shutdown waits for it. (The outbound thread and the dispatcher wait
/// longer: the end of the thread that feeds each one's ring wakes it at once.)
pub(crate) const RECV_WAIT: Duration = Duration::from_millis(250);
/// The outbound thread's and the dispatcher's wait on their rings (see [`RECV_WAIT`]).
pub(crate) const RING_WAIT: Duration = Duration::from_millis(1_000);

#[derive(Debug, Default)]
pub struct HostStats {
    pub published: AtomicU64,
    pub publish_errors: AtomicU64,
    pub received: AtomicU64,
    /// Messages dropped because the inbound ring stayed full (the core is overloaded).
    pub inbound_dropped: AtomicU64,
}

pub(crate) fn spawn(
    fabric: Arc<dyn Fabric>,
    mut out: HostOut,
    mut inb: HostIn,
    stop: Arc<AtomicBool>,
    stats: Arc<HostStats>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let f = fabric.clone();
    let s = stop.clone();
    let st = stats.clone();
    let tx = std::thread::Builder::new().name("host-out".into()).spawn(move || {
        let mut batch = Vec::with_capacity(256);
        while !s.load(Ordering::Acquire) {
            batch.clear();
            if out.pop_batch_wait(&mut batch, 256, RING_WAIT) == 0 {
                continue;
            }
            for m in batch.drain(..) {
                match f.publish(m) {
                    Ok(()) => st.published.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        tracing::debug!("publish failed: {e}");
                        st.publish_errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }
    })?;
    let rx = std::thread::Builder::new().name("host-in".into()).spawn(move || {
        while !stop.load(Ordering::Acquire) {
            match fabric.recv_timeout(RECV_WAIT) {
                Ok(Some(m)) => {
                    stats.received.fetch_add(1, Ordering::Relaxed);
                    if !inb.push_wait(m, Duration::from_millis(500)) {
                        stats.inbound_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("fabric receive failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    })?;
    Ok(vec![tx, rx])
}

//! The untrusted host side: two threads that move opaque messages between the boundary rings
//! and the fabric. The outbound thread never waits on the inbound ring and vice versa, so a
//! stalled direction cannot stall the other.

use crate::ring::{HostIn, HostOut};
use psl_fabric::Fabric;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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
            if out.pop_batch_wait(&mut batch, 256, Duration::from_millis(50)) == 0 {
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
            match fabric.recv_timeout(Duration::from_millis(50)) {
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

//! Test helpers shared by psl-node's integration tests.
#![allow(dead_code)] // each test binary uses part of it

use parking_lot::Mutex;
use psl_capsule::{Limits, Record};
use psl_fabric::{Fabric, InProcHub};
use psl_scl::Msg;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An untrusted observer on the in-process fabric: keeps every record that goes by (decoded
/// under `limits`) until [`Observer::stop`].
pub struct Observer {
    /// Every record seen so far, in arrival order.
    pub seen: Arc<Mutex<Vec<Record>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Observer {
    /// Starts observing `hub` as endpoint "observer".
    pub fn start(hub: &InProcHub, limits: Limits) -> Observer {
        let seen: Arc<Mutex<Vec<Record>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let ep = hub.endpoint("observer");
        let (kept, stopped) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Acquire) {
                if let Ok(Some(m)) = ep.recv_timeout(Duration::from_millis(20)) {
                    if let Ok(Msg::Record { bytes, .. }) = Msg::decode(&m) {
                        if let Ok(r) = Record::decode(&bytes, &limits) {
                            kept.lock().push(r);
                        }
                    }
                }
            }
        });
        Observer { seen, stop, thread }
    }

    /// Stops observing and waits for the observer's thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("the observer thread ends");
    }
}

/// Starts the coordinator-only node (id `0x7000`, no data writers) of `meta`'s capsule on
/// `hub`, with `epoch_ms` epochs and a 200 ms EOE timeout.
pub fn start_coordinator(
    hub: &InProcHub,
    meta: &psl_capsule::SignedMetadata,
    app: &psl_crypto::AppKey,
    epoch_ms: u64,
) -> psl_node::Node {
    let opts = psl_node::NodeOptions {
        node_id: 0x7000,
        writers: 0,
        coordinator: Some(psl_scl::CoordinatorConfig { epoch_ms, eoe_timeout_ms: 200, ..Default::default() }),
        ..psl_node::NodeOptions::default()
    };
    let keys = psl_node::NodeKeys::derive(meta, app, &opts).unwrap();
    psl_node::Node::start(keys, Arc::new(hub.endpoint("coordinator")), opts).unwrap()
}

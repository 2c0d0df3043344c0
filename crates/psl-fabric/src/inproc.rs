//! The in-process fabric: a hub that every endpoint of one process attaches to. Used by tests
//! and by the embedded single-process deployment.
//!
//! `publish` offers the message (a reference-counted [`Bytes`], never copied) to the bounded
//! receive queue (crossbeam) of every other endpoint attached at that moment, on the caller's
//! thread; a full queue drops it for that endpoint only. Per-sender order is kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;

use crate::config::FabricConfig;
use crate::error::{ConfigError, FabricError};
use crate::fabric::{check_outgoing, Fabric, Message};
use crate::queue::Inbox;
use crate::stats::{Counter, FabricStats};

/// A multicast network inside one process. Cloning gives another handle to the same network.
#[derive(Debug, Clone)]
pub struct InProcHub {
    inner: Arc<HubInner>,
}

#[derive(Debug)]
struct HubInner {
    config: FabricConfig,
    members: RwLock<Vec<(u64, Arc<Inbox>)>>,
    next_id: AtomicU64,
}

impl InProcHub {
    /// A hub whose endpoints all use `config`'s limits.
    pub fn new(config: FabricConfig) -> Result<InProcHub, ConfigError> {
        config.validate()?;
        Ok(InProcHub {
            inner: Arc::new(HubInner { config, members: RwLock::new(Vec::new()), next_id: AtomicU64::new(0) }),
        })
    }

    /// Attaches a new endpoint. It receives what others publish from now on, until dropped.
    pub fn endpoint(&self, name: impl Into<String>) -> InProcEndpoint {
        let c = &self.inner.config;
        let inbox = Inbox::new(c.queue_msgs_max, c.queue_bytes_max);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.members.write().unwrap_or_else(|e| e.into_inner()).push((id, inbox.clone()));
        InProcEndpoint {
            hub: self.inner.clone(),
            id,
            name: name.into(),
            inbox,
            sent: Counter::default(),
            sent_bytes: Counter::default(),
        }
    }

    /// Endpoints attached now.
    pub fn endpoints(&self) -> usize {
        self.inner.members.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The limits every endpoint of this hub has.
    pub fn config(&self) -> &FabricConfig {
        &self.inner.config
    }
}

/// One endpoint of an [`InProcHub`]. Detaches when dropped.
#[derive(Debug)]
pub struct InProcEndpoint {
    hub: Arc<HubInner>,
    id: u64,
    name: String,
    inbox: Arc<Inbox>,
    sent: Counter,
    sent_bytes: Counter,
}

impl InProcEndpoint {
    /// The name the endpoint was attached with (used in errors and logs).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Fabric for InProcEndpoint {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        check_outgoing(&self.name, &msg, self.hub.config.frame_bytes_max)?;
        let members = self.hub.members.read().unwrap_or_else(|e| e.into_inner());
        for (id, inbox) in members.iter() {
            if *id != self.id && !inbox.offer(Bytes::clone(&msg)) {
                tracing::trace!(from = %self.name, "in-process receive queue full; message dropped for one endpoint");
            }
        }
        self.sent.inc();
        self.sent_bytes.add(msg.len() as u64);
        Ok(())
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        Ok(self.inbox.recv_timeout(timeout))
    }

    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        Ok(self.inbox.try_recv())
    }

    fn stats(&self) -> FabricStats {
        FabricStats {
            sent: self.sent.get(),
            sent_bytes: self.sent_bytes.get(),
            received: self.inbox.received.get(),
            received_bytes: self.inbox.received_bytes.get(),
            dropped_full: self.inbox.dropped_full.get(),
            ..FabricStats::default()
        }
    }
}

impl Drop for InProcEndpoint {
    fn drop(&mut self) {
        self.hub.members.write().unwrap_or_else(|e| e.into_inner()).retain(|(id, _)| *id != self.id);
    }
}

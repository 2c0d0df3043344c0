//! [`Switch`]: an endpoint whose link can be cut and restored (a network partition of one
//! node). While the switch is off, what the endpoint publishes is dropped, and what arrives is
//! taken from the inner endpoint and dropped, so nothing queues up to be delivered after the cut
//! heals: as with a real partition, the layers above repair what was missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::FabricError;
use crate::fabric::{Fabric, Message};
use crate::stats::FabricStats;

/// Wraps `F`; the link is up while the shared flag is `true`.
pub struct Switch<F> {
    inner: F,
    up: Arc<AtomicBool>,
}

impl<F: Fabric> Switch<F> {
    /// `inner` behind the switch `up` (shared, so a test can flip it from outside).
    pub fn new(inner: F, up: Arc<AtomicBool>) -> Switch<F> {
        Switch { inner, up }
    }

    fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }
}

impl<F: Fabric> Fabric for Switch<F> {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        if self.is_up() {
            self.inner.publish(msg)
        } else {
            Ok(())
        }
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        let m = self.inner.recv_timeout(timeout)?;
        Ok(m.filter(|_| self.is_up()))
    }

    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        let m = self.inner.try_recv()?;
        Ok(m.filter(|_| self.is_up()))
    }

    fn stats(&self) -> FabricStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FabricConfig, InProcHub};

    #[test]
    fn a_cut_link_drops_both_ways_and_heals() {
        let hub = InProcHub::new(FabricConfig::default()).unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let a = Switch::new(hub.endpoint("a"), up.clone());
        let b = hub.endpoint("b");
        let t = Duration::from_millis(200);
        a.publish(Message::from(&b"1"[..])).unwrap();
        assert!(b.recv_timeout(t).unwrap().is_some());
        up.store(false, Ordering::Release);
        a.publish(Message::from(&b"2"[..])).unwrap();
        assert!(b.recv_timeout(Duration::from_millis(50)).unwrap().is_none());
        b.publish(Message::from(&b"3"[..])).unwrap();
        assert!(a.recv_timeout(Duration::from_millis(50)).unwrap().is_none());
        up.store(true, Ordering::Release);
        b.publish(Message::from(&b"4"[..])).unwrap();
        assert_eq!(a.recv_timeout(t).unwrap().as_deref(), Some(&b"4"[..]));
    }
}

//! [`Adversarial`]: a [`Fabric`] wrapper that puts a seeded [`FaultInjector`] on the publish
//! side, the receive side, or both, of any endpoint.
//!
//! - Publish side: each published message goes through the injector; what it lets through is
//!   published on the inner endpoint at once, in the injector's order (under one lock, so
//!   concurrent publishers cannot interleave a decision with its output). Messages the injector
//!   holds (delay, reorder) are released by a small timer thread, started only when the config
//!   can hold anything, and stopped on drop (messages still held then are lost, as in a crash).
//! - Receive side: each message taken from the inner endpoint goes through the injector; no
//!   thread is needed, `recv_timeout` waits for the earlier of the next inner message and the
//!   next held message's due time.
//!
//! The wrapper cannot know the inner endpoint's `frame_bytes_max`; an oversize message is refused
//! when the injector forwards it (and not at all if the injector drops it).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender};

use crate::error::{ConfigError, FabricError};
use crate::fabric::{Fabric, Message};
use crate::fault::{FaultConfig, FaultInjector};
use crate::stats::{FabricStats, FaultStats};

/// Faults injected by an [`Adversarial`] wrapper, per side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdversaryStats {
    /// Faults injected into messages this endpoint published (all zero without a publish side).
    pub publish: FaultStats,
    /// Faults injected into messages this endpoint received (all zero without a receive side).
    pub receive: FaultStats,
}

/// An endpoint whose traffic passes through a seeded adversary.
pub struct Adversarial<F: Fabric> {
    shared: Arc<Shared<F>>,
    wake: Option<Sender<()>>,
    timer: Option<JoinHandle<()>>,
}

struct Shared<F> {
    inner: F,
    publish_side: Option<Mutex<FaultInjector>>,
    receive_side: Option<Mutex<RecvSide>>,
}

struct RecvSide {
    inj: FaultInjector,
    ready: VecDeque<Message>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<F: Fabric> Adversarial<F> {
    /// Wraps `inner` with an injector on each side given.
    pub fn new(inner: F, publish: Option<FaultConfig>, receive: Option<FaultConfig>) -> Result<Self, ConfigError> {
        let needs_timer = publish.as_ref().is_some_and(FaultConfig::may_hold);
        let shared = Arc::new(Shared {
            inner,
            publish_side: publish.map(FaultInjector::new).transpose()?.map(Mutex::new),
            receive_side: receive
                .map(FaultInjector::new)
                .transpose()?
                .map(|inj| Mutex::new(RecvSide { inj, ready: VecDeque::new() })),
        });
        let (wake, timer) = if needs_timer {
            let (tx, rx) = crossbeam_channel::bounded::<()>(1);
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name("psl-adversary".into())
                .spawn(move || publish_timer(&shared, &rx))
                .map_err(|e| ConfigError::new("publish", format!("cannot start the adversary timer thread: {e}")))?;
            (Some(tx), Some(handle))
        } else {
            (None, None)
        };
        Ok(Adversarial { shared, wake, timer })
    }

    /// Faults on what this endpoint publishes.
    pub fn on_publish(inner: F, cfg: FaultConfig) -> Result<Self, ConfigError> {
        Self::new(inner, Some(cfg), None)
    }

    /// Faults on what this endpoint receives.
    pub fn on_receive(inner: F, cfg: FaultConfig) -> Result<Self, ConfigError> {
        Self::new(inner, None, Some(cfg))
    }

    /// The wrapped endpoint.
    pub fn inner(&self) -> &F {
        &self.shared.inner
    }

    /// Faults injected so far, per side.
    pub fn fault_stats(&self) -> AdversaryStats {
        AdversaryStats {
            publish: self.shared.publish_side.as_ref().map(|s| lock(s).stats()).unwrap_or_default(),
            receive: self.shared.receive_side.as_ref().map(|s| lock(s).inj.stats()).unwrap_or_default(),
        }
    }
}

fn publish_timer<F: Fabric>(shared: &Shared<F>, wake: &crossbeam_channel::Receiver<()>) {
    let side = shared.publish_side.as_ref().expect("timer runs only with a publish side");
    let mut out = Vec::new();
    loop {
        let deadline = lock(side).next_deadline();
        let woke = match deadline {
            Some(d) => wake.recv_deadline(d),
            None => wake.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        if let Err(RecvTimeoutError::Disconnected) = woke {
            return;
        }
        let mut inj = lock(side);
        inj.poll(Instant::now(), &mut out);
        for m in out.drain(..) {
            if let Err(e) = shared.inner.publish(m) {
                tracing::warn!(error = %e, "adversary: releasing a held message failed");
            }
        }
    }
}

impl<F: Fabric> Fabric for Adversarial<F> {
    fn publish(&self, msg: Message) -> Result<(), FabricError> {
        if msg.is_empty() {
            return Err(FabricError::Empty { endpoint: "adversarial".into() });
        }
        let Some(side) = &self.shared.publish_side else {
            return self.shared.inner.publish(msg);
        };
        let mut inj = lock(side);
        let held_before = inj.held();
        let mut out = Vec::with_capacity(2);
        inj.push(msg, Instant::now(), &mut out);
        if inj.held() > held_before {
            if let Some(w) = &self.wake {
                let _ = w.try_send(());
            }
        }
        let mut first_err = None;
        for m in out {
            if let Err(e) = self.shared.inner.publish(m) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, FabricError> {
        let Some(side) = &self.shared.receive_side else {
            return self.shared.inner.recv_timeout(timeout);
        };
        // `None` deadline: the timeout is too large to represent, so wait as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        let mut first = true;
        loop {
            let now = Instant::now();
            let next_held = {
                let mut s = lock(side);
                let RecvSide { inj, ready } = &mut *s;
                inj.poll(now, ready);
                if let Some(m) = ready.pop_front() {
                    return Ok(Some(m));
                }
                inj.next_deadline()
            };
            let remaining = deadline.map(|d| d.saturating_duration_since(now));
            if remaining == Some(Duration::ZERO) && !first {
                return Ok(None);
            }
            first = false;
            let to_held = next_held.map(|h| h.saturating_duration_since(now));
            let wait = match (remaining, to_held) {
                (Some(r), Some(h)) => r.min(h),
                (r, h) => r.or(h).unwrap_or(Duration::from_secs(3600)),
            };
            if let Some(m) = self.shared.inner.recv_timeout(wait)? {
                let mut s = lock(side);
                let RecvSide { inj, ready } = &mut *s;
                inj.push(m, Instant::now(), ready);
            }
        }
    }

    fn try_recv(&self) -> Result<Option<Message>, FabricError> {
        let Some(side) = &self.shared.receive_side else {
            return self.shared.inner.try_recv();
        };
        loop {
            let mut s = lock(side);
            let RecvSide { inj, ready } = &mut *s;
            inj.poll(Instant::now(), ready);
            if let Some(m) = ready.pop_front() {
                return Ok(Some(m));
            }
            drop(s);
            match self.shared.inner.try_recv()? {
                Some(m) => {
                    let mut s = lock(side);
                    let RecvSide { inj, ready } = &mut *s;
                    inj.push(m, Instant::now(), ready);
                }
                None => return Ok(None),
            }
        }
    }

    fn stats(&self) -> FabricStats {
        let mut st = self.shared.inner.stats();
        let f = self.fault_stats();
        st.faults.add(&f.publish);
        st.faults.add(&f.receive);
        st
    }
}

impl<F: Fabric> Drop for Adversarial<F> {
    fn drop(&mut self) {
        self.wake.take();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

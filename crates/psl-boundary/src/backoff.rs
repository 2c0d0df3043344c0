//! The backpressure and waiting policy: [`BackoffPolicy`], and the wait loop that applies it.
//!
//! A blocked ring operation (a push into a full ring, a pop from an empty one) waits in three
//! phases, re-trying the operation before every pause:
//!
//! 1. **spin**: up to [`BackoffPolicy::spin_polls`] polls, each followed by one
//!    [`std::hint::spin_loop`] (x86 `PAUSE`, ~9 ns on the 2-core development VM, so the default
//!    2048 polls last ~20–40 µs). A peer that answers within that window is seen within one
//!    cache-line transfer plus at most one `PAUSE`: this is the path the crossing benchmark
//!    measures.
//! 2. **yield**: up to [`BackoffPolicy::yield_polls`] polls, each followed by
//!    [`std::thread::yield_now`], which lets a peer that shares this core run.
//! 3. **sleep** (or **park**): polls separated by pauses that start at
//!    [`BackoffPolicy::min_sleep`] and double up to [`BackoffPolicy::max_sleep`]; a pause never
//!    runs past the deadline. Without a doorbell a pause is a sleep. With one
//!    ([`BackoffPolicy::doorbell`], on a ring built with it) it is a park that the peer ends
//!    early: see below.
//!
//! So a waiter never burns a core for more than the spin and yield phases. A sleeping waiter
//! notices the peer's progress within `max_sleep` (plus the OS timer slack, ~50–75 µs on Linux);
//! a parked one as soon as the peer's next push or pop rings it awake.
//! The clock is first read at the first deadline check, after 256 spin polls (a few µs): a
//! wait that ends sooner never reads it, and a timeout counts from that check. The deadline
//! is then checked every 256 spin polls and on every yield or sleep poll, so a timeout is
//! overshot by at most ~256 `PAUSE`s, one yield, or the timer slack.
//!
//! **Sleeping or parking.** Sleep-polling costs the waiter a wake-up per pause while nothing
//! happens: with the node's rings on two shared cores that was thousands of context switches a
//! second, most of the node threads' CPU under a memcached load (docs/protocol/memcached.md §8).
//! Parking costs nothing while idle, but someone must wake the parked thread, and that is a
//! system call (a futex wake) by the *peer*. At the TEE boundary the peer may be the trusted
//! core, where a system call is an enclave exit (thousands of cycles). The doorbell keeps that
//! off the busy path, as virtio's event suppression and io_uring's `SQ_NEED_WAKEUP` do:
//!
//! - a waiter that has run out of spins and yields raises its *parked* flag, issues a
//!   sequentially consistent fence, polls once more, and only then parks;
//! - the peer, after every push (or pop), issues the same fence and reads that flag. Only if it
//!   is raised does it lower it and wake the waiter (one futex wake).
//!
//! The two fences order the flag and the ring position (Dekker's pattern): either the waiter's
//! last poll sees the item, or the peer sees the flag, so no wake-up is lost. A busy ring never
//! parks, so it never rings: its extra cost is one fence and one load of a line no one writes,
//! per push or pop of a whole sealed record. An idle-to-busy transition costs one wake. A park
//! still ends after its pause, so a waiter never depends on the doorbell to meet its deadline.
//! The default policy has no doorbell (pure polling: the crossing benchmark's case); the node's
//! rings use [`BackoffPolicy::parking`].

use std::time::{Duration, Instant};

/// How long a blocked ring operation spins, yields and sleeps; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Polls in the spin phase, one [`std::hint::spin_loop`] after each.
    pub spin_polls: u32,
    /// Polls in the yield phase, one [`std::thread::yield_now`] after each.
    pub yield_polls: u32,
    /// The first sleep of the sleep phase.
    pub min_sleep: Duration,
    /// The longest sleep: the bound on how late an idle waiter notices progress (without a
    /// doorbell), or on one park (with it).
    pub max_sleep: Duration,
    /// Park instead of sleeping, and let the peer ring this waiter awake (see the
    /// [module docs](self)). Takes effect on a ring built with a doorbell policy; elsewhere the
    /// waiter sleeps as without one.
    pub doorbell: bool,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            spin_polls: 2048,
            yield_polls: 64,
            min_sleep: Duration::from_micros(50),
            max_sleep: Duration::from_millis(1),
            doorbell: false,
        }
    }
}

impl BackoffPolicy {
    /// The default spin and yield phases, then parking with the doorbell: an idle waiter costs
    /// nothing until its peer pushes (or pops). A park lasts 50 ms at first and twice as long
    /// each time after, up to 500 ms, so even a peer that never rang would be noticed within
    /// that, while an idle waiter wakes twice a second rather than twenty times.
    pub fn parking() -> BackoffPolicy {
        BackoffPolicy {
            min_sleep: Duration::from_millis(50),
            max_sleep: Duration::from_millis(500),
            doorbell: true,
            ..BackoffPolicy::default()
        }
    }
}

/// What one poll of a blocked operation found.
pub(crate) enum Poll<R> {
    /// The operation completed.
    Ready(R),
    /// Not yet; keep waiting.
    Pending,
    /// It can never complete (the peer is gone): stop waiting.
    Abandoned,
}

/// How many spin polls pass between two deadline checks.
const DEADLINE_CHECK_EVERY: u32 = 256;

/// When a wait gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit {
    /// Never (only readiness or abandonment end the wait).
    Never,
    /// At this instant.
    At(Instant),
    /// This long after the wait's first deadline check. The clock is not read before that
    /// check (after [`DEADLINE_CHECK_EVERY`] spin polls, a few µs), so a wait that ends sooner,
    /// the common case, never reads the clock at all; the price is a timeout that starts those
    /// few µs late.
    After(Duration),
}

/// Polls `poll` under `policy` until it is ready, abandoned, or `limit` passes. Returns `None`
/// unless it became ready. `poll` is always called at least once, and once more after the
/// deadline has passed, so an operation ready at the last moment still succeeds.
#[cfg(test)]
pub(crate) fn wait<R>(policy: &BackoffPolicy, limit: Limit, mut poll: impl FnMut() -> Poll<R>) -> Option<R> {
    wait_with(policy, limit, &mut (), |_| poll(), |_, nap| std::thread::sleep(nap))
}

/// [`wait`] over a waiter's state `s`, which both `poll` and `pause` get: `pause(s, d)` waits
/// at most `d` between polls of the last phase (a sleep, or a park the peer may end early).
pub(crate) fn wait_with<S: ?Sized, R>(
    policy: &BackoffPolicy,
    limit: Limit,
    s: &mut S,
    mut poll: impl FnMut(&mut S) -> Poll<R>,
    mut pause: impl FnMut(&mut S, Duration),
) -> Option<R> {
    let mut limit = limit;
    if matches!(limit, Limit::After(t) if t.is_zero()) {
        // A zero timeout: one poll, no spinning.
        return last_try(s, &mut poll);
    }

    // Phase 1: spin.
    for i in 0..policy.spin_polls {
        match poll(s) {
            Poll::Ready(r) => return Some(r),
            Poll::Abandoned => return None,
            Poll::Pending => {}
        }
        if i % DEADLINE_CHECK_EVERY == DEADLINE_CHECK_EVERY - 1 && expired(&mut limit) {
            return last_try(s, &mut poll);
        }
        std::hint::spin_loop();
    }

    // Phase 2: yield.
    for _ in 0..policy.yield_polls {
        match poll(s) {
            Poll::Ready(r) => return Some(r),
            Poll::Abandoned => return None,
            Poll::Pending => {}
        }
        if expired(&mut limit) {
            return last_try(s, &mut poll);
        }
        std::thread::yield_now();
    }

    // Phase 3: sleep (or park) in doubling steps, never past the deadline.
    let max_sleep = policy.max_sleep.max(Duration::from_nanos(1));
    let mut step = policy.min_sleep.clamp(Duration::from_nanos(1), max_sleep);
    loop {
        match poll(s) {
            Poll::Ready(r) => return Some(r),
            Poll::Abandoned => return None,
            Poll::Pending => {}
        }
        if expired(&mut limit) {
            return last_try(s, &mut poll);
        }
        let nap = match limit {
            Limit::At(d) => step.min(d.saturating_duration_since(Instant::now())),
            Limit::Never | Limit::After(_) => step,
        };
        pause(s, nap);
        step = (step * 2).min(max_sleep);
    }
}

/// True once the deadline has passed; resolves a relative limit (to an absolute one) on its
/// first call.
fn expired(limit: &mut Limit) -> bool {
    let now = Instant::now();
    match *limit {
        Limit::Never => false,
        Limit::At(d) => now >= d,
        Limit::After(t) => {
            *limit = now.checked_add(t).map_or(Limit::Never, Limit::At);
            t.is_zero()
        }
    }
}

fn last_try<S: ?Sized, R>(s: &mut S, poll: &mut impl FnMut(&mut S) -> Poll<R>) -> Option<R> {
    match poll(s) {
        Poll::Ready(r) => Some(r),
        Poll::Pending | Poll::Abandoned => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_at_once_does_not_wait() {
        let r = wait(&BackoffPolicy::default(), Limit::At(Instant::now()), || Poll::Ready(7));
        assert_eq!(r, Some(7));
    }

    #[test]
    fn times_out_through_every_phase() {
        let policy = BackoffPolicy {
            spin_polls: 300,
            yield_polls: 3,
            min_sleep: Duration::from_micros(100),
            max_sleep: Duration::from_millis(2),
            doorbell: false,
        };
        let mut polls = 0u32;
        let start = Instant::now();
        let r: Option<()> = wait(&policy, Limit::After(Duration::from_millis(20)), || {
            polls += 1;
            Poll::Pending
        });
        assert!(r.is_none());
        assert!(start.elapsed() >= Duration::from_millis(20));
        // All spin and yield polls ran, then at least a few sleep polls and the last try.
        assert!(polls > 300 + 3 + 2, "polls = {polls}");
    }

    #[test]
    fn becomes_ready_in_the_sleep_phase() {
        let policy =
            BackoffPolicy { spin_polls: 4, yield_polls: 2, min_sleep: Duration::from_micros(10), ..Default::default() };
        let mut n = 0;
        let r = wait(&policy, Limit::Never, || {
            n += 1;
            if n == 12 {
                Poll::Ready(n)
            } else {
                Poll::Pending
            }
        });
        assert_eq!(r, Some(12));
    }

    #[test]
    fn abandoned_stops_waiting() {
        let r: Option<u8> = wait(&BackoffPolicy::default(), Limit::Never, || Poll::Abandoned);
        assert!(r.is_none());
    }

    #[test]
    fn zero_sleep_bounds_do_not_spin_forever() {
        let policy = BackoffPolicy {
            spin_polls: 0,
            yield_polls: 0,
            min_sleep: Duration::ZERO,
            max_sleep: Duration::ZERO,
            doorbell: false,
        };
        let r: Option<()> = wait(&policy, Limit::After(Duration::from_millis(2)), || Poll::Pending);
        assert!(r.is_none());
    }

    #[test]
    fn zero_timeout_polls_once_without_spinning() {
        let mut polls = 0;
        let r: Option<()> = wait(&BackoffPolicy::default(), Limit::After(Duration::ZERO), || {
            polls += 1;
            Poll::Pending
        });
        assert!(r.is_none());
        assert_eq!(polls, 1);
    }

    #[test]
    fn past_deadline_gives_up_at_the_first_check() {
        let policy = BackoffPolicy { spin_polls: 0, ..Default::default() };
        let mut polls = 0;
        let r: Option<()> = wait(&policy, Limit::At(Instant::now()), || {
            polls += 1;
            Poll::Pending
        });
        assert!(r.is_none());
        assert_eq!(polls, 2, "one poll, the check, one last try");
    }
}

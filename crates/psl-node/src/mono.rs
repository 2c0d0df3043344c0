//! This process's monotonic clock as plain numbers: the time base of the writers' flow windows
//! and seal policies (`psl_scl::window`, `psl_scl::engine::queue`), which take the caller's
//! time. Shared by `node` (client writes, CapsuleDB asks) and `actor` (the seal policy).

use std::time::{Duration, Instant};

/// The base instant: this process's first call.
pub(crate) fn mono_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// `at` in milliseconds since [`mono_base`].
pub(crate) fn mono_ms(at: Instant) -> u64 {
    at.saturating_duration_since(mono_base()).as_millis() as u64
}

/// The instant of a time [`mono_ms`] gave.
pub(crate) fn at_mono_ms(t: u64) -> Instant {
    mono_base() + Duration::from_millis(t)
}

//! The counters of `stats` (memcached's general-purpose statistics).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Relaxed atomic counters, named as memcached names them.
        #[derive(Debug, Default)]
        pub struct Stats {
            $(pub $name: AtomicU64,)*
        }

        impl Stats {
            /// `(name, value)` of every counter, in declaration order.
            pub fn all(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            /// `stats reset`: zeroes every counter except the connection gauges.
            pub fn reset(&self) {
                $(if stringify!($name) != "curr_connections" { self.$name.store(0, Ordering::Relaxed); })*
            }
        }
    };
}

counters!(
    curr_connections,
    total_connections,
    rejected_connections,
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    get_expired,
    get_flushed,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    bytes_read,
    bytes_written,
    total_items,
    evictions,
    idle_kicks,
    forwarded,
    forward_failures,
);

impl Stats {
    #[inline]
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

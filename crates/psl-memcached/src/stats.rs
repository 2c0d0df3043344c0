//! The counters of `stats` (memcached's general-purpose statistics).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Relaxed atomic counters, named as memcached names them.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl Stats {
            /// `(name, value)` of every counter, in declaration order.
            pub fn all(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            /// Every counter as Prometheus text (`psl_memcached_<name>`; `curr_connections` a
            /// gauge, the rest counters), what `--metrics` serves.
            pub fn render_prometheus(&self) -> String {
                let mut out = String::new();
                for (name, v) in self.all() {
                    let kind = if name == "curr_connections" { "gauge" } else { "counter" };
                    out.push_str(&format!("# TYPE psl_memcached_{name} {kind}\npsl_memcached_{name} {v}\n"));
                }
                out
            }

            /// `stats reset`: zeroes every counter except the `curr_connections` gauge.
            pub fn reset(&self) {
                $(if stringify!($name) != "curr_connections" { self.$name.store(0, Ordering::Relaxed); })*
            }
        }
    };
}

counters!(
    /// Connections open now (a gauge: `stats reset` keeps it).
    curr_connections,
    /// Connections accepted since start.
    total_connections,
    /// Connections refused because `max_connections` were open.
    rejected_connections,
    /// Keys read: each key of `get`/`gets`/`gat`/`gats` and each `mg`.
    cmd_get,
    /// Storage commands (`set`, `add`, `replace`, `append`, `prepend`, `cas`, `ms`).
    cmd_set,
    /// `flush_all` commands.
    cmd_flush,
    /// Touches: `touch`, each key of `gat`/`gats`, and `mg` with `T`.
    cmd_touch,
    /// Meta commands `mg`, `ms`, `md` and `ma`.
    cmd_meta,
    /// Reads that found a live item.
    get_hits,
    /// Reads that found none (also `mg` with `N` that created the item).
    get_misses,
    /// Reads that found the item expired.
    get_expired,
    /// Reads that found the item hidden by `flush_all`.
    get_flushed,
    /// Deletes of a key with no live item.
    delete_misses,
    /// Deletes that removed an item.
    delete_hits,
    /// `incr` of a missing key (including `ma` with `N`, which creates it).
    incr_misses,
    /// `incr` of an existing counter.
    incr_hits,
    /// `decr` of a missing key (including `ma` with `N`, which creates it).
    decr_misses,
    /// `decr` of an existing counter.
    decr_hits,
    /// CAS-conditional stores on a missing key.
    cas_misses,
    /// CAS-conditional stores whose unique matched.
    cas_hits,
    /// CAS-conditional stores whose unique differed (`EXISTS`).
    cas_badval,
    /// Touches of a live item.
    touch_hits,
    /// Touches of a missing key.
    touch_misses,
    /// Writes refused because the item exceeded the size limit.
    store_too_large,
    /// Writes the node failed, or refused because pinned copies filled the memory limit.
    store_no_memory,
    /// Bytes read from clients.
    bytes_read,
    /// Bytes written to clients.
    bytes_written,
    /// Successful writes by this front end since start (stores, touches, counter updates).
    total_items,
    /// Local copies dropped by the LRU to stay under the memory limit.
    evictions,
    /// Connections closed for idling past `idle_timeout`.
    idle_kicks,
    /// Read-modify-write commands sent to their key's home in another front end.
    forwarded,
    /// Forwarded commands whose home could not be reached (`Unavailable`).
    forward_failures,
    /// Commands (or keys of a `get`) sent whole to a front end of the key's shard.
    shard_forwarded,
    /// Of those, the ones no front end of the shard answered (`SERVER_ERROR`).
    shard_forward_failures,
    /// Commands other shards' front ends sent here, run here.
    shard_served,
    /// Commands other shards' front ends sent here for a key this front end's map puts in
    /// another shard: refused (the two maps disagree).
    shard_misrouted,
);

impl Stats {
    /// Adds one to counter `c`.
    #[inline]
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` to counter `c`.
    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Counter `c`'s current value.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

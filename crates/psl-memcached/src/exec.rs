//! Runs parsed commands against a [`FrontEnd`] and writes memcached's replies.

use crate::item::{self, ItemRef};
use crate::op::{Outcome, Rmw};
use crate::proto::{self, Command, MetaFlags, MetaSetMode, StoreMode};
use crate::stats::Stats;
use crate::store::{unix_now, FrontEnd, Lookup};
use std::io::Write;

/// The version this server reports (the memcached protocol level it implements).
pub const VERSION: &str = "1.6.21";

/// What the connection does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep reading commands.
    Continue,
    /// Close the connection once the replies so far are written (`quit`).
    Close,
}

/// Appends `n` in decimal (the hot path's replacement for `write!`).
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn line(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

impl FrontEnd {
    /// Executes `cmd`, appending its reply to `out`. `get`-family commands with many keys are
    /// better run key by key with [`FrontEnd::get_key`] so that the caller can flush between
    /// keys; this does all of them.
    pub fn execute(&self, cmd: &Command<'_>, out: &mut Vec<u8>) -> Flow {
        match cmd {
            Command::Get { keys, cas, touch } => {
                if keys.iter().all(|k| self.get_key(k, *cas, *touch, out)) {
                    out.extend_from_slice(b"END\r\n");
                }
            }
            Command::Store { mode, key, flags, exptime, cas, data, noreply } => {
                Stats::inc(&self.stats.cmd_set);
                let o = match mode {
                    StoreMode::Set => self.set(key, *flags, *exptime, data, false),
                    StoreMode::Cas => self.rmw(
                        key,
                        Rmw::Store { mode: StoreMode::Set, flags: *flags, exptime: *exptime, cas: Some(*cas), data },
                    ),
                    m => self.rmw(key, Rmw::Store { mode: *m, flags: *flags, exptime: *exptime, cas: None, data }),
                };
                if !noreply {
                    line(out, store_reply(&o));
                }
            }
            Command::Delete { key, noreply } => {
                let o = self.delete(key);
                if !noreply {
                    line(out, simple_reply(&o, "DELETED"));
                }
            }
            Command::Arith { incr, key, delta, noreply } => {
                let o = self.rmw(key, Rmw::Arith { incr: *incr, delta: *delta, create: None, ttl: None, cas: None });
                if !noreply {
                    match o {
                        Outcome::Number { value, .. } => {
                            let _ = write!(out, "{value}\r\n");
                        }
                        o => line(out, simple_reply(&o, "")),
                    }
                }
            }
            Command::Touch { key, exptime, noreply } => {
                Stats::inc(&self.stats.cmd_touch);
                let o = self.rmw(key, Rmw::Touch { exptime: Some(*exptime), vivify: None });
                if !noreply {
                    line(out, if matches!(o, Outcome::Item { .. }) { "TOUCHED" } else { simple_reply(&o, "") });
                }
            }
            Command::FlushAll { delay, noreply } => {
                let o = self.flush_all(*delay);
                if !noreply {
                    line(out, if matches!(o, Outcome::Stored { .. }) { "OK" } else { simple_reply(&o, "") });
                }
            }
            Command::Stats { arg } => self.stats_reply(arg, out),
            Command::Version => line(out, &format!("VERSION {VERSION}")),
            Command::Verbosity { noreply } => {
                if !noreply {
                    line(out, "OK");
                }
            }
            Command::Quit => return Flow::Close,
            Command::MetaNoop => line(out, "MN"),
            Command::MetaGet { key, flags } => self.meta_get(key, flags, out),
            Command::MetaSet { key, data, flags } => self.meta_set(key, data, flags, out),
            Command::MetaDelete { key, flags } => self.meta_delete(key, flags, out),
            Command::MetaArith { key, flags } => self.meta_arith(key, flags, out),
        }
        Flow::Continue
    }

    /// One key of get/gets/gat/gats: its `VALUE` block if it is live. Returns false after
    /// writing a `SERVER_ERROR` (a `gat` whose key's home front end is unavailable, or whose
    /// write failed): as in memcached, the command ends there, without `END`.
    pub fn get_key(&self, key: &[u8], cas: bool, touch: Option<i64>, out: &mut Vec<u8>) -> bool {
        let (value, unique) = match touch {
            None => match if cas { self.lookup_for_cas(key) } else { self.lookup(key) } {
                Lookup::Hit { value, cas } => (value, cas),
                Lookup::Miss => return true,
                Lookup::Unreadable(_) => {
                    line(out, UNREADABLE);
                    return false;
                }
            },
            Some(t) => {
                Stats::inc(&self.stats.cmd_touch);
                Stats::inc(&self.stats.cmd_get);
                match self.rmw(key, Rmw::Touch { exptime: Some(t), vivify: None }) {
                    Outcome::Item { value, cas, .. } => {
                        Stats::inc(&self.stats.get_hits);
                        (value, cas)
                    }
                    o @ (Outcome::Unavailable(_) | Outcome::Failed(_) | Outcome::Unreadable(_)) => {
                        line(out, simple_reply(&o, ""));
                        return false;
                    }
                    _ => {
                        Stats::inc(&self.stats.get_misses);
                        return true;
                    }
                }
            }
        };
        let Some(it) = item::decode(&value) else { return true };
        out.reserve(key.len() + it.data.len() + 64);
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(key);
        out.push(b' ');
        push_decimal(out, it.flags.into());
        out.push(b' ');
        push_decimal(out, it.data.len() as u64);
        if cas {
            out.push(b' ');
            push_decimal(out, unique);
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(it.data);
        out.extend_from_slice(b"\r\n");
        true
    }

    fn stats_reply(&self, arg: &[u8], out: &mut Vec<u8>) {
        match arg {
            b"" => {
                let now = unix_now();
                let (items, bytes) = self.totals();
                let mut w = |k: &str, v: &dyn std::fmt::Display| {
                    let _ = write!(out, "STAT {k} {v}\r\n");
                };
                w("pid", &std::process::id());
                w("uptime", &self.uptime());
                w("time", &now);
                w("version", &VERSION);
                w("libevent", &"tokio");
                w("pointer_size", &(usize::BITS));
                w("max_connections", &self.config().max_connections);
                for (k, v) in self.stats.all() {
                    w(k, &v);
                }
                w("limit_maxbytes", &self.config().memory_limit);
                w("threads", &self.config().threads);
                w("curr_items", &items);
                w("bytes", &bytes);
                w("accepting_conns", &1);
                w("item_size_max", &self.config().limits.item_size_max);
                w("psl_node_lamport", &self.node().lamport());
                // Which shard this front end serves, under which map (sharding.md §3): what a
                // client checks an answer's shard against.
                if let Some(sh) = self.shards() {
                    w("psl_shard", &sh.me());
                    w("psl_shards", &sh.map().shards.len());
                    w("psl_shard_map_version", &sh.map().map_version);
                }
                // Entries this front end's node holds (tombstones included): what the memory
                // limit bounds in the end, beyond its accounting.
                w("psl_memtable_entries", &self.node().memtable().held());
                // What crossing the fabric cost: repairs this node asked for and answered, and
                // messages it lost on full queues (each made up for by a repair).
                let m = self.node().metrics();
                w("psl_repair_requests_sent", &psl_scl::Metrics::get(&m.repair_requests_sent));
                w("psl_repair_records_sent", &psl_scl::Metrics::get(&m.repair_records_sent));
                w("psl_inbound_dropped", &self.node().inbound_dropped());
                w("psl_outbound_dropped", &self.node().fabric_stats().dropped_send_full);
                w("psl_fabric_received_bytes", &self.node().fabric_stats().received_bytes);
                // What the writers sealed (ops per record: how well sets are batched) and how
                // often the capsule servers' acks held them back (flow control).
                w("psl_records_written", &psl_scl::Metrics::get(&m.records_written));
                w("psl_ops_written", &psl_scl::Metrics::get(&m.ops_written));
                w("psl_flow_waits", &psl_scl::Metrics::get(&m.flow_waits));
                w("psl_flow_opened", &psl_scl::Metrics::get(&m.flow_opened));
                // What the writers run with (`--writers`, `--flow-window-ops/records`).
                w("psl_writers", &self.node().writers().len());
                if let Some(f) = self.node().flow_options() {
                    w("psl_flow_window_ops", &f.window_ops);
                    w("psl_flow_window_records", &f.window_records);
                }
                // Home failover (a group of three or more processes): slots served here now,
                // hand-overs, and commands bounced or failed on the way to a home.
                if let Some(f) = self.failover() {
                    let g = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                    w("psl_home_members", &f.members());
                    w("psl_home_slots_served", &f.serving());
                    w("psl_home_takeovers", &g(&f.stats.takeovers));
                    w("psl_home_takeovers_failed", &g(&f.stats.takeovers_failed));
                    w("psl_home_rewrites", &g(&f.stats.rewrites));
                    w("psl_home_redirects", &g(&f.stats.redirects));
                    w("psl_home_replicate_failures", &g(&f.stats.replicate_failures));
                    w("psl_home_lease_lost", &g(&f.stats.lease_lost));
                    w("psl_home_prunes", &g(&f.stats.prunes));
                }
                line(out, "END");
            }
            b"settings" => {
                let c = self.config();
                let _ = write!(
                    out,
                    "STAT maxbytes {}\r\nSTAT maxconns {}\r\nSTAT item_size_max {}\r\nSTAT num_threads {}\r\nSTAT evictions on\r\nSTAT cas_enabled yes\r\nEND\r\n",
                    c.memory_limit, c.max_connections, c.limits.item_size_max, c.threads
                );
            }
            b"reset" => {
                self.stats.reset();
                line(out, "RESET");
            }
            b"items" | b"slabs" | b"sizes" | b"conns" => line(out, "END"),
            _ => line(out, proto::ERROR),
        }
    }

    fn meta_get(&self, key: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
        Stats::inc(&self.stats.cmd_meta);
        let (value, cas, won) = if f.ttl.is_some() || f.vivify.is_some() {
            if f.ttl.is_some() {
                Stats::inc(&self.stats.cmd_touch);
            }
            Stats::inc(&self.stats.cmd_get);
            match self.rmw(key, Rmw::Touch { exptime: f.ttl, vivify: f.vivify }) {
                Outcome::Item { value, cas, won } => {
                    Stats::inc(if won { &self.stats.get_misses } else { &self.stats.get_hits });
                    (value, cas, won)
                }
                Outcome::NotFound => {
                    Stats::inc(&self.stats.get_misses);
                    return miss(key, f, out, "EN");
                }
                o => return line(out, store_reply(&o)),
            }
        } else {
            // A unique the client asked for (`c`) is read at the key's home, as for `gets`.
            let wants_cas = f.tokens().any(|(c, _)| c == b'c');
            match if wants_cas { self.lookup_for_cas(key) } else { self.lookup(key) } {
                Lookup::Hit { value, cas } => (value, cas, false),
                Lookup::Miss => return miss(key, f, out, "EN"),
                Lookup::Unreadable(_) => return line(out, UNREADABLE),
            }
        };
        let Some(it) = item::decode(&value) else { return miss(key, f, out, "EN") };
        if f.value {
            let _ = write!(out, "VA {}", it.data.len());
        } else {
            out.extend_from_slice(b"HD");
        }
        ret_flags(out, key, f, Some(&it), cas, b"fctskOhl");
        if won {
            out.extend_from_slice(b" W");
        }
        out.extend_from_slice(b"\r\n");
        if f.value {
            out.extend_from_slice(it.data);
            out.extend_from_slice(b"\r\n");
        }
    }

    fn meta_set(&self, key: &[u8], data: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
        Stats::inc(&self.stats.cmd_meta);
        Stats::inc(&self.stats.cmd_set);
        let mode = match f.set_mode.unwrap_or(MetaSetMode::Set) {
            MetaSetMode::Set => StoreMode::Set,
            MetaSetMode::Add => StoreMode::Add,
            MetaSetMode::Replace => StoreMode::Replace,
            MetaSetMode::Append => StoreMode::Append,
            MetaSetMode::Prepend => StoreMode::Prepend,
        };
        let flags = f.client_flags.unwrap_or(0);
        let exptime = f.ttl.unwrap_or(0);
        let want_cas = f.tokens().any(|(c, _)| c == b'c');
        let o = if mode == StoreMode::Set && f.compare_cas.is_none() {
            self.set(key, flags, exptime, data, want_cas)
        } else {
            self.rmw(key, Rmw::Store { mode, flags, exptime, cas: f.compare_cas, data })
        };
        let code = match &o {
            Outcome::Stored { .. } => "HD",
            Outcome::NotStored => "NS",
            Outcome::Exists => "EX",
            Outcome::NotFound => "NF",
            o => return line(out, store_reply(o)),
        };
        if code == "HD" && f.quiet {
            return;
        }
        out.extend_from_slice(code.as_bytes());
        let cas = if let Outcome::Stored { cas } = o { cas } else { 0 };
        ret_flags(out, key, f, None, cas, b"ckOb");
        out.extend_from_slice(b"\r\n");
    }

    fn meta_delete(&self, key: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
        Stats::inc(&self.stats.cmd_meta);
        let o =
            if f.compare_cas.is_some() { self.rmw(key, Rmw::Delete { cas: f.compare_cas }) } else { self.delete(key) };
        let code = match &o {
            Outcome::Deleted => "HD",
            Outcome::NotFound => "NF",
            Outcome::Exists => "EX",
            o => return line(out, store_reply(o)),
        };
        if code == "HD" && f.quiet {
            return;
        }
        out.extend_from_slice(code.as_bytes());
        ret_flags(out, key, f, None, 0, b"kOb");
        out.extend_from_slice(b"\r\n");
    }

    fn meta_arith(&self, key: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
        Stats::inc(&self.stats.cmd_meta);
        let create = f.vivify.map(|t| (f.initial.unwrap_or(0), t));
        let op = Rmw::Arith { incr: f.incr, delta: f.delta.unwrap_or(1), create, ttl: f.ttl, cas: f.compare_cas };
        match self.rmw(key, op) {
            Outcome::Number { value, cas, ttl } => {
                if f.quiet {
                    return;
                }
                let digits = value.to_string();
                if f.value {
                    let _ = write!(out, "VA {}", digits.len());
                } else {
                    out.extend_from_slice(b"HD");
                }
                for (c, tok) in f.tokens() {
                    match c {
                        b'c' => {
                            let _ = write!(out, " c{cas}");
                        }
                        b't' => {
                            let _ = write!(out, " t{ttl}");
                        }
                        b'k' => {
                            out.extend_from_slice(b" k");
                            out.extend_from_slice(key);
                        }
                        b'O' => {
                            out.extend_from_slice(b" O");
                            out.extend_from_slice(tok);
                        }
                        _ => {}
                    }
                }
                out.extend_from_slice(b"\r\n");
                if f.value {
                    out.extend_from_slice(digits.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
            }
            Outcome::NotFound => miss(key, f, out, "NF"),
            Outcome::Exists => miss(key, f, out, "EX"),
            Outcome::NotStored => miss(key, f, out, "NS"),
            o => line(out, simple_reply(&o, "")),
        }
    }
}

/// A meta miss-type reply: `EN` for mg is hidden by `q`; `NF`/`EX`/`NS` never are.
fn miss(key: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>, code: &str) {
    if code == "EN" && f.quiet {
        return;
    }
    out.extend_from_slice(code.as_bytes());
    for (c, tok) in f.tokens() {
        match c {
            b'k' => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(key);
            }
            b'O' => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(tok);
            }
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Echoes the requested return flags in request order (only those in `which`).
fn ret_flags(out: &mut Vec<u8>, key: &[u8], f: &MetaFlags<'_>, it: Option<&ItemRef<'_>>, cas: u64, which: &[u8]) {
    let now = unix_now();
    for (c, tok) in f.tokens() {
        if !which.contains(&c) {
            continue;
        }
        match (c, it) {
            (b'f', Some(it)) => {
                let _ = write!(out, " f{}", it.flags);
            }
            (b't', Some(it)) => {
                let _ = write!(out, " t{}", it.ttl_left(now));
            }
            (b's', Some(it)) => {
                let _ = write!(out, " s{}", it.data.len());
            }
            (b'h', Some(_)) => out.extend_from_slice(b" h0"),
            (b'l', Some(_)) => out.extend_from_slice(b" l0"),
            (b'c', _) => {
                let _ = write!(out, " c{cas}");
            }
            (b'k', _) => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(key);
            }
            (b'O', _) => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(tok);
            }
            _ => {}
        }
    }
}

fn store_reply(o: &Outcome) -> &'static str {
    match o {
        Outcome::Stored { .. } => "STORED",
        Outcome::NotStored => "NOT_STORED",
        Outcome::Exists => "EXISTS",
        Outcome::NotFound => "NOT_FOUND",
        o => simple_reply(o, "STORED"),
    }
}

/// The reply when a key evicted from this front end could not be read back from CapsuleDB.
const UNREADABLE: &str = "SERVER_ERROR CapsuleDB did not answer for this key";

/// Replies shared by every command; `ok` is the success word of the caller.
fn simple_reply(o: &Outcome, ok: &'static str) -> &'static str {
    match o {
        Outcome::Deleted | Outcome::Stored { .. } => ok,
        Outcome::NotFound => "NOT_FOUND",
        Outcome::NotStored => "NOT_STORED",
        Outcome::Exists => "EXISTS",
        Outcome::NonNumeric => proto::NON_NUMERIC,
        Outcome::TooLarge => proto::TOO_LARGE,
        Outcome::Failed(_) => "SERVER_ERROR out of memory storing object",
        Outcome::Unavailable(_) => "SERVER_ERROR home front end of this key unavailable",
        Outcome::Unreadable(_) => UNREADABLE,
        // Only a read for a CAS unique is answered so, and it never reaches a client.
        Outcome::Behind => "SERVER_ERROR home front end behind this one",
        Outcome::Number { .. } | Outcome::Item { .. } => ok,
    }
}

#[cfg(test)]
mod tests {
    use super::push_decimal;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decimal_matches_display(n in any::<u64>()) {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            prop_assert_eq!(out, format!("x{n}").into_bytes());
        }
    }

    #[test]
    fn decimal_edges() {
        for n in [0, 9, 10, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }
}

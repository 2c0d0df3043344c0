//! Shards of the key space (`docs/protocol/sharding.md` §4): which shard's front ends serve
//! each key, and forwarding a whole command to a front end of another shard.
//!
//! A front end serves the keys of one shard: the shard whose capsule its node joined. Under a
//! [`ShardMap`] of several shards, a [`crate::session::Session`] looks up each command's key
//! before running it. A key of another shard is sent, as the exact bytes of the command (its
//! line and data block), over the sealed peer channel ([`crate::peer`]) to one of that
//! shard's front ends (the map lists their peer addresses), which runs it as if a client had
//! sent it there and answers with the exact reply bytes. A `get` of many keys goes key by key,
//! each to its shard. Commands without a key (`stats`, `version`, `flush_all`, …) stay here
//! and speak for this shard only.
//!
//! The receiving front end runs a forwarded command only if the key is its shard's under its
//! own map, and refuses it otherwise (`SERVER_ERROR`) rather than forwarding again: two front
//! ends whose maps disagree cannot bounce a command between them. Which front end of a shard
//! is asked rotates per command; one that does not answer is skipped for the next one, and a
//! command fails with `SERVER_ERROR` naming the shard when none answers within the peer
//! timeout.

use crate::peer::{PeerClient, PeerConfig, PeerKey, ScanReply, ScanRequest};
use psl_scl::shard::ShardMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The shard map as one front end routes by it.
pub struct Shards {
    map: ShardMap,
    me: u16,
    /// Peer clients of each shard's front ends (empty for this front end's own shard).
    front_ends: Vec<Vec<Arc<PeerClient>>>,
    /// Round-robin position per shard.
    next: Vec<AtomicUsize>,
}

/// Why a map cannot be routed by.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    /// The map does not name this front end's capsule.
    #[error("the shard map (version {map_version}) names no shard with this front end's capsule")]
    NotInMap {
        /// The map's version.
        map_version: u64,
    },
    /// Another shard lists no front end, or one whose address does not resolve.
    #[error("shard {shard} of the map: {why}")]
    Shard {
        /// The shard's index.
        shard: u16,
        /// What is wrong.
        why: String,
    },
}

impl Shards {
    /// Routes by `map` as a front end of the shard whose capsule is `capsule`, reaching other
    /// shards' front ends over the peer channel sealed with `key`.
    pub fn new(map: ShardMap, capsule: &[u8; 32], key: PeerKey, cfg: PeerConfig) -> Result<Shards, ShardsError> {
        let me = map
            .shards
            .iter()
            .position(|s| &s.capsule == capsule)
            .ok_or(ShardsError::NotInMap { map_version: map.map_version })? as u16;
        let mut front_ends = Vec::with_capacity(map.shards.len());
        for (i, s) in map.shards.iter().enumerate() {
            if i == me as usize {
                front_ends.push(Vec::new());
                continue;
            }
            let shard = i as u16;
            if s.front_ends.is_empty() {
                return Err(ShardsError::Shard { shard, why: "no front end serves it".into() });
            }
            let mut clients = Vec::with_capacity(s.front_ends.len());
            for a in &s.front_ends {
                let addr: SocketAddr = a.to_socket_addrs().ok().and_then(|mut it| it.next()).ok_or_else(|| {
                    ShardsError::Shard { shard, why: format!("front end address {a:?} does not resolve") }
                })?;
                clients.push(Arc::new(PeerClient::new(addr, key.clone(), cfg)));
            }
            front_ends.push(clients);
        }
        let next = (0..map.shards.len()).map(|_| AtomicUsize::new(0)).collect();
        Ok(Shards { map, me, front_ends, next })
    }

    /// The map routed by.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// This front end's shard.
    pub fn me(&self) -> u16 {
        self.me
    }

    /// The shard of `key`, if it is not this front end's.
    pub fn elsewhere(&self, key: &[u8]) -> Option<u16> {
        let s = self.map.shard_of(key);
        (s != self.me).then_some(s)
    }

    /// Calls `call` on the front ends of `shard` in turn, starting at the next in the shard's
    /// rotation, until one answers; tries each at most once. Errs naming the shard when it
    /// has no front end or none answered.
    fn on_a_front_end<R>(
        &self,
        shard: u16,
        what: &str,
        call: impl Fn(&PeerClient) -> std::io::Result<R>,
    ) -> Result<R, String> {
        let clients = self.front_ends.get(shard as usize).filter(|c| !c.is_empty()).ok_or_else(|| {
            format!("no front end to {what} for shard {shard} (map version {})", self.map.map_version)
        })?;
        let start = self.next[shard as usize].fetch_add(1, Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..clients.len() {
            let c = &clients[(start + i) % clients.len()];
            match call(c) {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(shard, front_end = %c.addr(), "{what} at another shard: {e}");
                    last = format!("{}: {e}", c.addr());
                }
            }
        }
        Err(format!("shard {shard}'s front ends unavailable (last: {last})"))
    }

    /// Sends the command `raw` (one complete request) to a front end of `shard` and appends
    /// its reply to `out`.
    pub fn forward(&self, shard: u16, raw: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        if raw.len() + 1 > crate::peer::FRAME_MAX {
            return Err(format!("a command of {} bytes does not fit a peer frame", raw.len()));
        }
        let reply = self.on_a_front_end(shard, "forward to", |c| c.call_command(raw))?;
        out.extend_from_slice(&reply);
        Ok(())
    }

    /// A page of a prefix scan from a front end of `shard`.
    pub fn scan(&self, shard: u16, req: &ScanRequest<'_>) -> ScanReply {
        self.on_a_front_end(shard, "scan", |c| c.call_scan(req))?.map_err(|e| format!("shard {shard}: {e}"))
    }
}

/// A scan page: items in key order, and whether more follow.
pub type Page<T> = (Vec<(Vec<u8>, T)>, bool);

/// Merges scan pages of several shards (each in key order, with whether more follow) into
/// the first `limit` keys in key order. A shard that has more past its page's last key `x`
/// may hold keys between `x` and the other pages' later keys, so nothing past the smallest
/// such `x` is returned; `more` then says so, and the next page starts after the last key
/// returned.
pub fn merge_pages<T>(pages: Vec<Page<T>>, limit: usize) -> Page<T> {
    let cutoff: Option<Vec<u8>> = pages
        .iter()
        .filter(|(items, more)| *more && !items.is_empty())
        .filter_map(|(items, _)| items.last())
        .map(|(k, _)| k.clone())
        .min();
    let mut more = pages.iter().any(|(_, m)| *m);
    let mut all: Vec<(Vec<u8>, T)> = pages.into_iter().flat_map(|(items, _)| items).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(c) = cutoff {
        all.retain(|(k, _)| *k <= c);
    }
    if all.len() > limit {
        all.truncate(limit);
        more = true;
    }
    (all, more)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Paging through merged pages of shards that each hold a disjoint set of keys yields
        /// every key exactly once, in order, whatever the page sizes.
        #[test]
        fn paging_through_merged_pages_yields_every_key_once_in_order(
            keys in proptest::collection::btree_set(proptest::collection::vec(0u8..4, 1..4), 0..40),
            shards in 1usize..4,
            limit in 1usize..6,
            page in 1usize..6,
        ) {
            let keys: Vec<Vec<u8>> = keys.into_iter().collect();
            let owner = |k: &Vec<u8>| k.iter().map(|b| *b as usize).sum::<usize>() % shards;
            let mut got: Vec<Vec<u8>> = Vec::new();
            let mut after: Option<Vec<u8>> = None;
            for _ in 0..200 {
                let pages: Vec<Page<()>> = (0..shards)
                    .map(|s| {
                        let mine: Vec<(Vec<u8>, ())> = keys
                            .iter()
                            .filter(|k| owner(k) == s && after.as_ref().is_none_or(|a| *k > a))
                            .map(|k| (k.clone(), ()))
                            .collect();
                        let more = mine.len() > page;
                        (mine.into_iter().take(page).collect(), more)
                    })
                    .collect();
                let (items, more) = merge_pages(pages, limit);
                prop_assert!(items.len() <= limit);
                got.extend(items.iter().map(|(k, _)| k.clone()));
                if !more {
                    break;
                }
                prop_assert!(!items.is_empty(), "a page that says more returns something");
                after = items.last().map(|(k, _)| k.clone());
            }
            prop_assert_eq!(got, keys);
        }
    }
}

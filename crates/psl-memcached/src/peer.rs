//! Forwarding read-modify-write commands to a key's home front end in another process.
//!
//! Front ends of one group (`psl memcached --cluster … --peer-listen A --peers A,B,…`) each
//! listen on a *peer address*. A conditional command whose key's home is another front end
//! ([`crate::op::Rmw`]) is sent there as one request frame and answered by one reply frame
//! ([`crate::op::Outcome`]): one extra loopback/LAN round trip, paid only by `cas`, `add`,
//! `replace`, `append`, `prepend`, `incr`, `decr`, `touch`, `gat(s)` and their meta forms on
//! non-home keys, and by reads that return a CAS unique (`gets`, `mg` with `c`). Plain
//! `get`/`set`/`delete` never leave the front end.
//!
//! The channel is untrusted like the fabric, so every frame is sealed (AES-256-GCM, a fresh
//! 16-byte salt per frame) under the *peer key*, derived one-way from the capsule's data key
//! ([`PeerKey::derive`]): only holders of the data key can send or read forwarded commands.
//! Replays and reordering are refused: the server opens each connection with a random 16-byte
//! nonce, and frame `seq` of the connection binds `direction || nonce || seq` as AAD.
//!
//! ```text
//! connection: server → client   nonce (16 bytes, plain)
//! frame:      len u32 LE (of what follows, ≤ FRAME_MAX) || salt (16) || sealed plaintext + tag (16)
//! request:    key_len u8 || key || op
//!   op 1 Store:  mode u8 (0 set 1 add 2 replace 3 append 4 prepend) flags u32 exptime i64 cas? data_len u32 data
//!   op 2 Delete: cas?
//!   op 3 Arith:  incr u8 delta u64 create? (initial u64 exptime i64) ttl? i64 cas?
//!   op 4 Touch:  exptime? i64 vivify? i64
//!   op 5 Read:   have? (lamport u64 writer u32)
//!   (x? = presence byte 0/1, then x if 1; integers little-endian)
//! command:    0xFF || one whole memcached request (its line and data block), for a key of
//!             another shard (crate::shards); its reply is the exact memcached reply bytes
//! scan:       0xFE || limit u32 || prefix_len u16 || prefix || after? (len u16, bytes)
//!   reply:    0 || count u32 || count × (key_len u16 key || item_len u32 item || lamport u64
//!             || writer u32 || cas u64) || more u8   |   1 || len u32 || message
//! reply:      tag u8: 1 Stored cas u64 | 2 NotStored | 3 Exists | 4 NotFound | 5 Deleted
//!             | 6 Number value u64 cas u64 ttl i64 | 7 Item len u32 value cas u64 won u8
//!             | 8 NonNumeric | 9 TooLarge | 10 Failed len u32 message | 11 Unreadable len u32 message
//!             | 13 Behind (a Read: the home has not applied the forwarder's version yet)
//! ```
//!
//! A home that cannot be reached within [`PeerConfig::timeout`] (connect, send, reply) makes
//! the command fail with `SERVER_ERROR` (never a hang, never a local guess, which could break
//! CAS atomicity). The decoders are fuzzed by `fuzz/fuzz_targets/memcached_parser.rs`.

use crate::home::{Ctl, CtlReply, Held, Refusal, MEMBERS_MAX};
use crate::op::{Outcome, Rmw};
use crate::proto::StoreMode;
use parking_lot::Mutex;
use psl_crypto::{sha256, DataKey};
use psl_scl::Version;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Largest frame body: a 1 MiB item plus headers, with room.
pub const FRAME_MAX: usize = (1 << 20) + 4096;
const SALT: usize = 16;
const NONCE: usize = 16;
const CONTEXT: &[u8] = b"psl-memcached/peer/v1";
/// Most simultaneous peer connections a home serves.
const SERVER_CONNS_MAX: usize = 256;
/// Idle pooled connections kept per peer.
const POOL_MAX: usize = 16;
/// A served peer connection idle this long is closed.
const SERVER_IDLE: Duration = Duration::from_secs(600);

/// Why a peer frame was refused: it does not open, or does not decode. The connection that
/// carried it is dropped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeerError {
    /// The frame ends before a field does; the offset where the missing field starts.
    #[error("peer frame truncated at byte {0}")]
    Truncated(usize),
    /// A field holds a value outside its range (an unknown tag or mode, a length or count
    /// past its bound, an invalid key).
    #[error("peer frame: bad {what} {value}")]
    Bad {
        /// Which field.
        what: &'static str,
        /// The value found in it.
        value: u64,
    },
    /// Bytes left over after a complete message (how many).
    #[error("peer frame: {0} trailing bytes")]
    Trailing(usize),
    /// AES-GCM authentication failed: another peer key, a tampered frame, or a frame replayed
    /// or reordered (its connection nonce or sequence number differs).
    #[error("peer frame does not open under the peer key (wrong capsule, tampered or replayed)")]
    Seal,
}

/// The key that seals forwarded commands: `SHA-256("psl-memcached/peer-key/v1" || data key)`.
#[derive(Clone)]
pub struct PeerKey(DataKey);

impl PeerKey {
    /// The peer key of the capsule whose data key is `data_key` (one-way: it reveals nothing
    /// of the data key). Every member of a group derives the same one.
    pub fn derive(data_key: &DataKey) -> PeerKey {
        let mut h = sha256(&[b"psl-memcached/peer-key/v1", &data_key.expose_bytes()[..]]);
        let key = PeerKey(DataKey::from_bytes(&h.0));
        zeroize::Zeroize::zeroize(&mut h.0);
        key
    }

    fn aad(dir: u8, nonce: &[u8; NONCE], seq: u64) -> [u8; 1 + NONCE + 8] {
        let mut a = [0u8; 1 + NONCE + 8];
        a[0] = dir;
        a[1..1 + NONCE].copy_from_slice(nonce);
        a[1 + NONCE..].copy_from_slice(&seq.to_le_bytes());
        a
    }

    fn seal(&self, dir: u8, nonce: &[u8; NONCE], seq: u64, plain: &[u8]) -> Vec<u8> {
        let salt: [u8; SALT] = rand::random();
        let body = self.0.seal(&salt, CONTEXT, &Self::aad(dir, nonce, seq), plain);
        let mut f = Vec::with_capacity(4 + SALT + body.len());
        f.extend_from_slice(&((SALT + body.len()) as u32).to_le_bytes());
        f.extend_from_slice(&salt);
        f.extend_from_slice(&body);
        f
    }

    fn open(&self, dir: u8, nonce: &[u8; NONCE], seq: u64, frame: &[u8]) -> Result<Vec<u8>, PeerError> {
        if frame.len() < SALT {
            return Err(PeerError::Truncated(frame.len()));
        }
        let mut salt = [0u8; SALT];
        salt.copy_from_slice(&frame[..SALT]);
        self.0
            .open(&salt, CONTEXT, &Self::aad(dir, nonce, seq), &frame[SALT..])
            .map(|z| z.to_vec())
            .map_err(|_| PeerError::Seal)
    }
}

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerKey(..)")
    }
}

// ---------------------------------------------------------------------------------------------
// Codec

fn put_opt_u64(o: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => {
            o.push(1);
            o.extend_from_slice(&v.to_le_bytes());
        }
        None => o.push(0),
    }
}

fn put_opt_i64(o: &mut Vec<u8>, v: Option<i64>) {
    put_opt_u64(o, v.map(|v| v as u64));
}

fn put_bytes(o: &mut Vec<u8>, b: &[u8]) {
    o.extend_from_slice(&(b.len() as u32).to_le_bytes());
    o.extend_from_slice(b);
}

struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PeerError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.b.len()).ok_or(PeerError::Truncated(self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PeerError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, PeerError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, PeerError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn i64(&mut self) -> Result<i64, PeerError> {
        Ok(self.u64()? as i64)
    }
    fn flag(&mut self) -> Result<bool, PeerError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(PeerError::Bad { what: "presence byte", value: v.into() }),
        }
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, PeerError> {
        Ok(if self.flag()? { Some(self.u64()?) } else { None })
    }
    fn opt_i64(&mut self) -> Result<Option<i64>, PeerError> {
        Ok(self.opt_u64()?.map(|v| v as i64))
    }
    fn bytes(&mut self) -> Result<&'a [u8], PeerError> {
        let n = self.u32()? as usize;
        if n > FRAME_MAX {
            return Err(PeerError::Bad { what: "length", value: n as u64 });
        }
        self.take(n)
    }
    fn end(&self) -> Result<(), PeerError> {
        match self.b.len() - self.pos {
            0 => Ok(()),
            n => Err(PeerError::Trailing(n)),
        }
    }
}

/// Appends the request `(key, op)` to `o`.
pub fn encode_request(key: &[u8], op: &Rmw<'_>, o: &mut Vec<u8>) {
    o.push(key.len().min(255) as u8);
    o.extend_from_slice(&key[..key.len().min(255)]);
    match *op {
        Rmw::Store { mode, flags, exptime, cas, data } => {
            o.push(1);
            o.push(match mode {
                StoreMode::Set | StoreMode::Cas => 0,
                StoreMode::Add => 1,
                StoreMode::Replace => 2,
                StoreMode::Append => 3,
                StoreMode::Prepend => 4,
            });
            o.extend_from_slice(&flags.to_le_bytes());
            o.extend_from_slice(&exptime.to_le_bytes());
            put_opt_u64(o, cas);
            put_bytes(o, data);
        }
        Rmw::Delete { cas } => {
            o.push(2);
            put_opt_u64(o, cas);
        }
        Rmw::Arith { incr, delta, create, ttl, cas } => {
            o.push(3);
            o.push(u8::from(incr));
            o.extend_from_slice(&delta.to_le_bytes());
            match create {
                Some((initial, exptime)) => {
                    o.push(1);
                    o.extend_from_slice(&initial.to_le_bytes());
                    o.extend_from_slice(&exptime.to_le_bytes());
                }
                None => o.push(0),
            }
            put_opt_i64(o, ttl);
            put_opt_u64(o, cas);
        }
        Rmw::Touch { exptime, vivify } => {
            o.push(4);
            put_opt_i64(o, exptime);
            put_opt_i64(o, vivify);
        }
        Rmw::Read { have } => {
            o.push(5);
            match have {
                Some(v) => {
                    o.push(1);
                    o.extend_from_slice(&v.lamport.to_le_bytes());
                    o.extend_from_slice(&v.writer.to_le_bytes());
                }
                None => o.push(0),
            }
        }
    }
}

/// Decodes a request. The key must be one the parser accepts (1 to 250 bytes, no space or
/// newline).
pub fn decode_request(b: &[u8]) -> Result<(&[u8], Rmw<'_>), PeerError> {
    let mut r = Rd { b, pos: 0 };
    let klen = r.u8()? as usize;
    let key = r.take(klen)?;
    if !crate::proto::valid_key(key, &crate::proto::Limits::default()) {
        return Err(PeerError::Bad { what: "key length or byte", value: klen as u64 });
    }
    let op = match r.u8()? {
        1 => {
            let mode = match r.u8()? {
                0 => StoreMode::Set,
                1 => StoreMode::Add,
                2 => StoreMode::Replace,
                3 => StoreMode::Append,
                4 => StoreMode::Prepend,
                v => return Err(PeerError::Bad { what: "store mode", value: v.into() }),
            };
            let flags = r.u32()?;
            let exptime = r.i64()?;
            let cas = r.opt_u64()?;
            let data = r.bytes()?;
            Rmw::Store { mode, flags, exptime, cas, data }
        }
        2 => Rmw::Delete { cas: r.opt_u64()? },
        3 => {
            let incr = r.flag()?;
            let delta = r.u64()?;
            let create = if r.flag()? { Some((r.u64()?, r.i64()?)) } else { None };
            let ttl = r.opt_i64()?;
            let cas = r.opt_u64()?;
            Rmw::Arith { incr, delta, create, ttl, cas }
        }
        4 => Rmw::Touch { exptime: r.opt_i64()?, vivify: r.opt_i64()? },
        5 => Rmw::Read { have: if r.flag()? { Some(Version { lamport: r.u64()?, writer: r.u32()? }) } else { None } },
        v => return Err(PeerError::Bad { what: "op", value: v.into() }),
    };
    r.end()?;
    Ok((key, op))
}

/// Appends the reply `o` to `out`. [`Outcome::Unavailable`] travels as `Failed`.
pub fn encode_outcome(o: &Outcome, out: &mut Vec<u8>) {
    match o {
        Outcome::Stored { cas } => {
            out.push(1);
            out.extend_from_slice(&cas.to_le_bytes());
        }
        Outcome::NotStored => out.push(2),
        Outcome::Exists => out.push(3),
        Outcome::NotFound => out.push(4),
        Outcome::Deleted => out.push(5),
        Outcome::Number { value, cas, ttl } => {
            out.push(6);
            out.extend_from_slice(&value.to_le_bytes());
            out.extend_from_slice(&cas.to_le_bytes());
            out.extend_from_slice(&ttl.to_le_bytes());
        }
        Outcome::Item { value, cas, won } => {
            out.push(7);
            put_bytes(out, value);
            out.extend_from_slice(&cas.to_le_bytes());
            out.push(u8::from(*won));
        }
        Outcome::NonNumeric => out.push(8),
        Outcome::TooLarge => out.push(9),
        Outcome::Failed(m) | Outcome::Unavailable(m) => {
            out.push(10);
            put_bytes(out, m.as_bytes());
        }
        Outcome::Unreadable(m) => {
            out.push(11);
            put_bytes(out, m.as_bytes());
        }
        Outcome::Behind => out.push(13),
    }
}

/// Decodes what [`encode_outcome`] wrote (an `Unavailable` comes back as `Failed`); fails on
/// an unknown tag, a truncated field or trailing bytes.
pub fn decode_outcome(b: &[u8]) -> Result<Outcome, PeerError> {
    let mut r = Rd { b, pos: 0 };
    let o = match r.u8()? {
        1 => Outcome::Stored { cas: r.u64()? },
        2 => Outcome::NotStored,
        3 => Outcome::Exists,
        4 => Outcome::NotFound,
        5 => Outcome::Deleted,
        6 => Outcome::Number { value: r.u64()?, cas: r.u64()?, ttl: r.i64()? },
        7 => {
            let value: Arc<[u8]> = r.bytes()?.into();
            Outcome::Item { value, cas: r.u64()?, won: r.flag()? }
        }
        8 => Outcome::NonNumeric,
        9 => Outcome::TooLarge,
        10 => Outcome::Failed(String::from_utf8_lossy(r.bytes()?).into_owned()),
        11 => Outcome::Unreadable(String::from_utf8_lossy(r.bytes()?).into_owned()),
        13 => Outcome::Behind,
        v => return Err(PeerError::Bad { what: "outcome", value: v.into() }),
    };
    r.end()?;
    Ok(o)
}

/// A forwarded command's answer: run, or refused by a member that is not the key's home now
/// (home failover), naming the member it believes is (`None`: it does not know).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// The command ran at this member; its outcome.
    Done(Outcome),
    /// Not this member's key now; the index (in the group's peer list) of the member it
    /// believes is the home, if any.
    NotHome(Option<u16>),
}

/// Appends the answer `r` to a forwarded command to `out` (reply tag 12: not home).
pub fn encode_routed(r: &Routed, out: &mut Vec<u8>) {
    match r {
        Routed::Done(o) => encode_outcome(o, out),
        Routed::NotHome(h) => {
            out.push(12);
            put_opt_u16(out, *h);
        }
    }
}

/// Decodes what [`encode_routed`] wrote; fails as [`decode_outcome`] does.
pub fn decode_routed(b: &[u8]) -> Result<Routed, PeerError> {
    if b.first() == Some(&12) {
        let mut r = Rd { b, pos: 1 };
        let h = r.opt_u16()?;
        r.end()?;
        return Ok(Routed::NotHome(h));
    }
    decode_outcome(b).map(Routed::Done)
}

fn put_opt_u16(o: &mut Vec<u8>, v: Option<u16>) {
    match v {
        Some(v) => {
            o.push(1);
            o.extend_from_slice(&v.to_le_bytes());
        }
        None => o.push(0),
    }
}

fn put_held(o: &mut Vec<u8>, h: &Held) {
    o.push(h.key.len().min(255) as u8);
    o.extend_from_slice(&h.key[..h.key.len().min(255)]);
    o.extend_from_slice(&h.version.lamport.to_le_bytes());
    o.extend_from_slice(&h.version.writer.to_le_bytes());
    match &h.value {
        Some(v) => {
            o.push(1);
            put_bytes(o, v);
        }
        None => o.push(0),
    }
}

fn put_entries(o: &mut Vec<u8>, es: &[Held]) {
    o.extend_from_slice(&(es.len() as u32).to_le_bytes());
    for h in es {
        put_held(o, h);
    }
}

/// Appends a home-failover request to `o`: a `0` byte (no key is empty, so it never starts a
/// forwarded command), then the request. Layout (integers little-endian):
///
/// ```text
/// 1 Acquire    slot u16 ballot u64 lease_ms u32 ceiling u64 renew u8
/// 2 Replicate  slot u16 ballot u64 count u32 (key_len u8 key lamport u64 writer u32 value?)*
/// 3 Prune      slot u16 ballot u64 upto u64 count u16 instance u64*
/// 4 Release    slot u16 ballot u64
/// 5 Entries    slot u16 ballot u64 after? (key_len u8 key)
/// (value? = 0, or 1 then len u32 and the bytes)
/// ```
pub fn encode_ctl(c: &Ctl, o: &mut Vec<u8>) {
    o.push(0);
    let head = |o: &mut Vec<u8>, tag: u8, slot: u16, ballot: u64| {
        o.push(tag);
        o.extend_from_slice(&slot.to_le_bytes());
        o.extend_from_slice(&ballot.to_le_bytes());
    };
    match c {
        Ctl::Acquire { slot, ballot, lease_ms, ceiling, renew } => {
            head(o, 1, *slot, *ballot);
            o.extend_from_slice(&lease_ms.to_le_bytes());
            o.extend_from_slice(&ceiling.to_le_bytes());
            o.push(u8::from(*renew));
        }
        Ctl::Replicate { slot, ballot, entries } => {
            head(o, 2, *slot, *ballot);
            put_entries(o, entries);
        }
        Ctl::Prune { slot, ballot, upto, instances } => {
            head(o, 3, *slot, *ballot);
            o.extend_from_slice(&upto.to_le_bytes());
            let n = instances.len().min(MEMBERS_MAX);
            o.extend_from_slice(&(n as u16).to_le_bytes());
            for i in &instances[..n] {
                o.extend_from_slice(&i.to_le_bytes());
            }
        }
        Ctl::Release { slot, ballot } => head(o, 4, *slot, *ballot),
        Ctl::Entries { slot, ballot, after } => {
            head(o, 5, *slot, *ballot);
            match after {
                Some(k) => {
                    o.push(1);
                    o.push(k.len().min(255) as u8);
                    o.extend_from_slice(&k[..k.len().min(255)]);
                }
                None => o.push(0),
            }
        }
    }
}

impl Rd<'_> {
    fn u16(&mut self) -> Result<u16, PeerError> {
        let mut a = [0u8; 2];
        a.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(a))
    }
    fn opt_u16(&mut self) -> Result<Option<u16>, PeerError> {
        Ok(if self.flag()? { Some(self.u16()?) } else { None })
    }
    fn key(&mut self) -> Result<Vec<u8>, PeerError> {
        let n = self.u8()? as usize;
        let k = self.take(n)?;
        if !crate::proto::valid_key(k, &crate::proto::Limits::default()) {
            return Err(PeerError::Bad { what: "key length or byte", value: n as u64 });
        }
        Ok(k.to_vec())
    }
    fn entries(&mut self) -> Result<Vec<Held>, PeerError> {
        let n = self.u32()? as usize;
        // Each entry takes at least 14 bytes: a count beyond what the frame holds is a lie.
        if n > (self.b.len() - self.pos) / 14 {
            return Err(PeerError::Bad { what: "entry count", value: n as u64 });
        }
        let mut es = Vec::with_capacity(n);
        for _ in 0..n {
            let key = self.key()?;
            let version = Version { lamport: self.u64()?, writer: self.u32()? };
            let value = if self.flag()? { Some(Arc::<[u8]>::from(self.bytes()?)) } else { None };
            es.push(Held { key, version, value });
        }
        Ok(es)
    }
}

/// Decodes what [`encode_ctl`] wrote.
pub fn decode_ctl(b: &[u8]) -> Result<Ctl, PeerError> {
    let mut r = Rd { b, pos: 0 };
    if r.u8()? != 0 {
        return Err(PeerError::Bad { what: "control marker", value: b[0].into() });
    }
    let tag = r.u8()?;
    let (slot, ballot) = (r.u16()?, r.u64()?);
    let c = match tag {
        1 => Ctl::Acquire { slot, ballot, lease_ms: r.u32()?, ceiling: r.u64()?, renew: r.flag()? },
        2 => Ctl::Replicate { slot, ballot, entries: r.entries()? },
        3 => {
            let upto = r.u64()?;
            let n = r.u16()? as usize;
            if n > MEMBERS_MAX {
                return Err(PeerError::Bad { what: "instance count", value: n as u64 });
            }
            let instances = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
            Ctl::Prune { slot, ballot, upto, instances }
        }
        4 => Ctl::Release { slot, ballot },
        5 => Ctl::Entries { slot, ballot, after: if r.flag()? { Some(r.key()?) } else { None } },
        v => return Err(PeerError::Bad { what: "control request", value: v.into() }),
    };
    r.end()?;
    Ok(c)
}

/// Appends an acceptor's answer to `o`:
///
/// ```text
/// 1 Granted  ceiling u64 complete u8 instance u64
/// 2 Refused  why u8 (0 starting 1 held 2 stale 3 full 4 invalid) holder? u16 promised u64 instance u64
/// 3 Ack      instance u64
/// 4 Page     count u32 entries (as Replicate) more u8 instance u64
/// ```
pub fn encode_ctl_reply(r: &CtlReply, o: &mut Vec<u8>) {
    match r {
        CtlReply::Granted { ceiling, complete, instance } => {
            o.push(1);
            o.extend_from_slice(&ceiling.to_le_bytes());
            o.push(u8::from(*complete));
            o.extend_from_slice(&instance.to_le_bytes());
        }
        CtlReply::Refused { why, holder, promised, instance } => {
            o.push(2);
            o.push(match why {
                Refusal::Starting => 0,
                Refusal::Held => 1,
                Refusal::Stale => 2,
                Refusal::Full => 3,
                Refusal::Invalid => 4,
            });
            put_opt_u16(o, *holder);
            o.extend_from_slice(&promised.to_le_bytes());
            o.extend_from_slice(&instance.to_le_bytes());
        }
        CtlReply::Ack { instance } => {
            o.push(3);
            o.extend_from_slice(&instance.to_le_bytes());
        }
        CtlReply::Page { entries, more, instance } => {
            o.push(4);
            put_entries(o, entries);
            o.push(u8::from(*more));
            o.extend_from_slice(&instance.to_le_bytes());
        }
    }
}

/// Decodes what [`encode_ctl_reply`] wrote; fails on an unknown tag or refusal, a truncated
/// field or trailing bytes.
pub fn decode_ctl_reply(b: &[u8]) -> Result<CtlReply, PeerError> {
    let mut r = Rd { b, pos: 0 };
    let c = match r.u8()? {
        1 => CtlReply::Granted { ceiling: r.u64()?, complete: r.flag()?, instance: r.u64()? },
        2 => {
            let why = match r.u8()? {
                0 => Refusal::Starting,
                1 => Refusal::Held,
                2 => Refusal::Stale,
                3 => Refusal::Full,
                4 => Refusal::Invalid,
                v => return Err(PeerError::Bad { what: "refusal", value: v.into() }),
            };
            CtlReply::Refused { why, holder: r.opt_u16()?, promised: r.u64()?, instance: r.u64()? }
        }
        3 => CtlReply::Ack { instance: r.u64()? },
        4 => CtlReply::Page { entries: r.entries()?, more: r.flag()?, instance: r.u64()? },
        v => return Err(PeerError::Bad { what: "control reply", value: v.into() }),
    };
    r.end()?;
    Ok(c)
}

// ---------------------------------------------------------------------------------------------
// Scans of another shard (crate::shards)

/// The first byte of a scan request to another shard's front end.
pub const SCAN_TAG: u8 = 0xFE;
/// Most items one scan page asks for.
pub const SCAN_LIMIT_MAX: u32 = 10_000;
/// A scan page's reply stops adding items past this many bytes (it says `more`): the reply
/// must fit a frame whatever the items' sizes.
pub const SCAN_REPLY_BYTES_MAX: usize = FRAME_MAX - 64 * 1024;

/// A page of a prefix scan asked of another shard: keys that start with `prefix`, after
/// `after`, at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRequest<'a> {
    /// Keys that start with this.
    pub prefix: &'a [u8],
    /// Keys after this one.
    pub after: Option<&'a [u8]>,
    /// At most this many items (1 ..= [`SCAN_LIMIT_MAX`]).
    pub limit: u32,
}

/// One live item of a scan page, as the shard's front end holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanItem {
    /// The key.
    pub key: Vec<u8>,
    /// The encoded item (`crate::item`).
    pub item: Vec<u8>,
    /// The record version that holds it.
    pub lamport: u64,
    /// The writer of that record.
    pub writer: u32,
    /// Its CAS unique.
    pub cas: u64,
}

/// A scan page (the items in key order, and whether more follow), or why there is none.
pub type ScanReply = Result<(Vec<ScanItem>, bool), String>;

/// `SCAN_TAG || limit u32 || prefix_len u16 || prefix || after? (len u16, bytes)`.
pub fn encode_scan_request(r: &ScanRequest<'_>, o: &mut Vec<u8>) {
    o.push(SCAN_TAG);
    o.extend_from_slice(&r.limit.to_le_bytes());
    o.extend_from_slice(&(r.prefix.len() as u16).to_le_bytes());
    o.extend_from_slice(r.prefix);
    match r.after {
        Some(a) => {
            o.push(1);
            o.extend_from_slice(&(a.len() as u16).to_le_bytes());
            o.extend_from_slice(a);
        }
        None => o.push(0),
    }
}

/// Decodes a scan request; refuses a limit of 0 or above [`SCAN_LIMIT_MAX`].
pub fn decode_scan_request(b: &[u8]) -> Result<ScanRequest<'_>, PeerError> {
    let mut r = Rd { b, pos: 0 };
    if r.u8()? != SCAN_TAG {
        return Err(PeerError::Bad { what: "scan tag", value: b.first().copied().unwrap_or(0).into() });
    }
    let limit = r.u32()?;
    if !(1..=SCAN_LIMIT_MAX).contains(&limit) {
        return Err(PeerError::Bad { what: "scan limit", value: limit.into() });
    }
    let n = r.u16()? as usize;
    let prefix = r.take(n)?;
    let after = if r.flag()? {
        let n = r.u16()? as usize;
        Some(r.take(n)?)
    } else {
        None
    };
    r.end()?;
    Ok(ScanRequest { prefix, after, limit })
}

/// `0 || count u32 || count × (key_len u16 key || item (len u32, bytes) || lamport u64 ||
/// writer u32 || cas u64) || more u8`, or `1 || message (len u32, bytes)`.
pub fn encode_scan_reply(r: &ScanReply, o: &mut Vec<u8>) {
    match r {
        Ok((items, more)) => {
            o.push(0);
            o.extend_from_slice(&(items.len() as u32).to_le_bytes());
            for it in items {
                o.extend_from_slice(&(it.key.len() as u16).to_le_bytes());
                o.extend_from_slice(&it.key);
                put_bytes(o, &it.item);
                o.extend_from_slice(&it.lamport.to_le_bytes());
                o.extend_from_slice(&it.writer.to_le_bytes());
                o.extend_from_slice(&it.cas.to_le_bytes());
            }
            o.push(u8::from(*more));
        }
        Err(e) => {
            o.push(1);
            put_bytes(o, e.as_bytes());
        }
    }
}

/// Decodes a scan reply; the item count is checked against the bytes left before anything is
/// allocated for it, and the keys must be in strictly increasing order.
pub fn decode_scan_reply(b: &[u8]) -> Result<ScanReply, PeerError> {
    let mut r = Rd { b, pos: 0 };
    let out = match r.u8()? {
        0 => {
            let count = r.u32()? as usize;
            // Each item takes at least 26 bytes.
            if count > (b.len() - r.pos) / 26 {
                return Err(PeerError::Bad { what: "scan item count", value: count as u64 });
            }
            let mut items: Vec<ScanItem> = Vec::with_capacity(count);
            for _ in 0..count {
                let n = r.u16()? as usize;
                let key = r.take(n)?.to_vec();
                if items.last().is_some_and(|l| l.key >= key) {
                    return Err(PeerError::Bad { what: "scan key order", value: items.len() as u64 });
                }
                let item = r.bytes()?.to_vec();
                let (lamport, writer, cas) = (r.u64()?, r.u32()?, r.u64()?);
                items.push(ScanItem { key, item, lamport, writer, cas });
            }
            Ok((items, r.flag()?))
        }
        1 => Err(String::from_utf8(r.bytes()?.to_vec()).map_err(|e| PeerError::Bad {
            what: "scan error text (not UTF-8)",
            value: e.utf8_error().valid_up_to() as u64,
        })?),
        v => return Err(PeerError::Bad { what: "scan reply tag", value: v.into() }),
    };
    r.end()?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Transport

fn read_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if !(SALT + 16..=FRAME_MAX + SALT + 16).contains(&n) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("peer frame of {n} bytes")));
    }
    buf.resize(n, 0);
    s.read_exact(buf)
}

fn invalid(e: PeerError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

/// Settings of forwarding.
#[derive(Debug, Clone, Copy)]
pub struct PeerConfig {
    /// Bound on connecting to a home, and on each send and reply.
    pub timeout: Duration,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig { timeout: Duration::from_secs(2) }
    }
}

/// The first byte of a whole command forwarded to another shard's front end (a request's key
/// length is at most 250, a control request's first byte is 0).
pub const COMMAND_TAG: u8 = 0xFF;

/// What the home side of the channel serves: forwarded commands and home-failover requests.
/// The front end (`store::FrontEnd`) implements it; the trait lives here so that the channel
/// does not depend on the store that uses it.
pub trait PeerService: Send + Sync {
    /// A command forwarded by another front end of the group: run here, or refused as not
    /// this member's (home failover).
    fn serve_forwarded(&self, key: &[u8], op: Rmw<'_>) -> Routed;
    /// A home-failover request for this member's acceptor; `None` when failover is off.
    fn handle_ctl(&self, req: &Ctl) -> Option<CtlReply>;
    /// A whole memcached request from a front end of another shard ([`crate::shards`]): its
    /// reply bytes.
    fn serve_command(&self, raw: &[u8]) -> Vec<u8>;
    /// A page of a prefix scan of this front end's shard, for a front end of another shard.
    fn serve_scan(&self, req: &ScanRequest<'_>) -> ScanReply;
}

/// The home side: serves forwarded commands with [`PeerService::serve_forwarded`], one thread
/// per peer connection (at most 256). Dropping it stops accepting; open connections end when
/// their peer closes them or idles out.
pub struct PeerServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeerServer {
    /// Serves `fe` on `listener` from an accept thread; frames must seal under `key`. The
    /// server holds `fe` weakly: once it is dropped, each connection ends at its next frame.
    /// Fails if the listener's address cannot be read or the thread cannot be spawned.
    pub fn start<S: PeerService + 'static>(
        fe: &Arc<S>,
        listener: TcpListener,
        key: PeerKey,
    ) -> std::io::Result<PeerServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let fe: Weak<S> = Arc::downgrade(fe);
        let fe: Weak<dyn PeerService> = fe;
        let st = stop.clone();
        let thread = std::thread::Builder::new().name("memcached-peer".into()).spawn(move || {
            let conns = Arc::new(AtomicUsize::new(0));
            for s in listener.incoming() {
                if st.load(Ordering::Acquire) {
                    return;
                }
                let s = match s {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of descriptors and the like: do not spin.
                        tracing::warn!("peer accept: {e}");
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                };
                if conns.load(Ordering::Acquire) >= SERVER_CONNS_MAX {
                    tracing::warn!("peer connections at the limit ({SERVER_CONNS_MAX}); refusing one");
                    continue;
                }
                conns.fetch_add(1, Ordering::AcqRel);
                let (fe, key, conns) = (fe.clone(), key.clone(), conns.clone());
                let spawned = std::thread::Builder::new().name("memcached-peer-conn".into()).spawn(move || {
                    if let Err(e) = serve_peer(&fe, s, &key) {
                        tracing::debug!("peer connection: {e}");
                    }
                    conns.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    tracing::warn!("could not spawn a peer connection thread");
                }
            }
        })?;
        Ok(PeerServer { addr, stop, thread: Some(thread) })
    }

    /// The address the server accepts peer connections on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_peer(fe: &Weak<dyn PeerService>, mut s: TcpStream, key: &PeerKey) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(SERVER_IDLE))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let nonce: [u8; NONCE] = rand::random();
    s.write_all(&nonce)?;
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    for seq in 0u64.. {
        match read_frame(&mut s, &mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let plain = key.open(b'q', &nonce, seq, &buf).map_err(invalid)?;
        let Some(fe) = fe.upgrade() else { return Ok(()) };
        out.clear();
        if plain.first() == Some(&COMMAND_TAG) {
            out = fe.serve_command(&plain[1..]);
        } else if plain.first() == Some(&SCAN_TAG) {
            let req = decode_scan_request(&plain).map_err(invalid)?;
            encode_scan_reply(&fe.serve_scan(&req), &mut out);
        } else if plain.first() == Some(&0) {
            let ctl = decode_ctl(&plain).map_err(invalid)?;
            let Some(reply) = fe.handle_ctl(&ctl) else {
                return Err(invalid(PeerError::Bad {
                    what: "control request to a front end without failover",
                    value: 0,
                }));
            };
            encode_ctl_reply(&reply, &mut out);
        } else {
            let (k, op) = decode_request(&plain).map_err(invalid)?;
            encode_routed(&fe.serve_forwarded(k, op), &mut out);
        }
        s.write_all(&key.seal(b'r', &nonce, seq, &out))?;
    }
    Ok(())
}

struct Conn {
    s: TcpStream,
    nonce: [u8; NONCE],
    seq: u64,
}

/// The forwarding side: a pool of connections to one home front end.
pub struct PeerClient {
    addr: SocketAddr,
    key: PeerKey,
    cfg: PeerConfig,
    pool: Mutex<Vec<Conn>>,
}

impl PeerClient {
    /// A client of the member at peer address `addr`; it connects on the first call (no I/O
    /// here) and keeps up to 16 idle connections.
    pub fn new(addr: SocketAddr, key: PeerKey, cfg: PeerConfig) -> PeerClient {
        PeerClient { addr, key, cfg, pool: Mutex::new(Vec::new()) }
    }

    /// The member's peer address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn connect(&self) -> std::io::Result<Conn> {
        let mut s = TcpStream::connect_timeout(&self.addr, self.cfg.timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.cfg.timeout))?;
        s.set_write_timeout(Some(self.cfg.timeout))?;
        let mut nonce = [0u8; NONCE];
        s.read_exact(&mut nonce)?;
        Ok(Conn { s, nonce, seq: 0 })
    }

    /// A pooled connection that the home has not closed, or a new one.
    fn take(&self) -> std::io::Result<Conn> {
        while let Some(c) = self.pool.lock().pop() {
            // A closed connection reads as EOF at once; a live idle one would block.
            if c.s.set_nonblocking(true).is_err() {
                continue;
            }
            let alive = matches!(c.s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            if alive && c.s.set_nonblocking(false).is_ok() {
                return Ok(c);
            }
        }
        self.connect()
    }

    fn exchange(&self, c: &mut Conn, req: &[u8]) -> std::io::Result<Vec<u8>> {
        c.s.write_all(&self.key.seal(b'q', &c.nonce, c.seq, req))?;
        let mut buf = Vec::new();
        read_frame(&mut c.s, &mut buf)?;
        let plain = self.key.open(b'r', &c.nonce, c.seq, &buf).map_err(invalid)?;
        c.seq += 1;
        Ok(plain)
    }

    /// One request and its reply on a pooled connection.
    fn round_trip<R>(&self, req: &[u8], decode: impl Fn(&[u8]) -> Result<R, PeerError>) -> std::io::Result<R> {
        blocking(|| {
            let mut c = self.take()?;
            let r = decode(&self.exchange(&mut c, req)?).map_err(invalid)?;
            let mut pool = self.pool.lock();
            if pool.len() < POOL_MAX {
                pool.push(c);
            } else {
                let _ = c.s.shutdown(Shutdown::Both);
            }
            Ok(r)
        })
    }

    /// Runs `op` at this home. Blocks for at most about three times the timeout; fails with
    /// [`Outcome::Unavailable`] when the home cannot be reached, answers garbage, or is not
    /// the key's home (home failover moved it).
    pub fn call(&self, key: &[u8], op: &Rmw<'_>) -> Outcome {
        match self.call_routed(key, op) {
            Routed::Done(Outcome::Unavailable(e)) => {
                tracing::warn!(home = %self.addr, "forwarding to the key's home front end failed: {e}");
                Outcome::Unavailable(e)
            }
            Routed::Done(o) => o,
            Routed::NotHome(h) => {
                Outcome::Unavailable(format!("front end {} is not this key's home (it names {h:?})", self.addr))
            }
        }
    }

    /// Runs `op` at this member if it is the key's home ([`Routed::NotHome`] otherwise);
    /// [`Outcome::Unavailable`] when it cannot be reached in time.
    pub fn call_routed(&self, key: &[u8], op: &Rmw<'_>) -> Routed {
        let mut req = Vec::with_capacity(64);
        encode_request(key, op, &mut req);
        match self.round_trip(&req, decode_routed) {
            Ok(r) => r,
            Err(e) => Routed::Done(Outcome::Unavailable(format!("home front end {} unreachable: {e}", self.addr))),
        }
    }

    /// A whole memcached request (`raw`: its line and data block) run at this front end of
    /// another shard; its reply bytes. Fails when it cannot be reached in time.
    pub fn call_command(&self, raw: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut req = Vec::with_capacity(raw.len() + 1);
        req.push(COMMAND_TAG);
        req.extend_from_slice(raw);
        self.round_trip(&req, |b| Ok(b.to_vec()))
    }

    /// A page of a prefix scan of this front end's shard.
    pub fn call_scan(&self, req: &ScanRequest<'_>) -> std::io::Result<ScanReply> {
        let mut b = Vec::with_capacity(16 + req.prefix.len());
        encode_scan_request(req, &mut b);
        self.round_trip(&b, decode_scan_reply)
    }

    /// A home-failover request to this member's acceptor.
    pub fn call_ctl(&self, ctl: &Ctl) -> std::io::Result<CtlReply> {
        let mut req = Vec::with_capacity(64);
        encode_ctl(ctl, &mut req);
        self.round_trip(&req, decode_ctl_reply)
    }
}

/// Runs blocking `f` so that a multi-thread tokio runtime moves its other tasks elsewhere.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> Vec<Rmw<'static>> {
        vec![
            Rmw::Store { mode: StoreMode::Append, flags: 7, exptime: -1, cas: Some(9), data: b"abc" },
            Rmw::Store { mode: StoreMode::Set, flags: 0, exptime: 100, cas: None, data: b"" },
            Rmw::Delete { cas: None },
            Rmw::Delete { cas: Some(u64::MAX) },
            Rmw::Arith { incr: true, delta: 5, create: Some((1, 2)), ttl: Some(-3), cas: None },
            Rmw::Arith { incr: false, delta: 0, create: None, ttl: None, cas: Some(4) },
            Rmw::Touch { exptime: Some(10), vivify: None },
            Rmw::Touch { exptime: None, vivify: Some(0) },
            Rmw::Read { have: None },
            Rmw::Read { have: Some(Version { lamport: u64::MAX, writer: 7 }) },
        ]
    }

    #[test]
    fn requests_and_outcomes_round_trip_and_truncations_fail() {
        for op in ops() {
            let mut b = Vec::new();
            encode_request(b"k1", &op, &mut b);
            let (k, back) = decode_request(&b).unwrap();
            assert_eq!(k, b"k1");
            assert_eq!(format!("{op:?}"), format!("{back:?}"));
            for cut in 0..b.len() {
                assert!(decode_request(&b[..cut]).is_err());
            }
            b.push(0);
            assert_eq!(decode_request(&b).unwrap_err(), PeerError::Trailing(1));
        }
        for o in [
            Outcome::Stored { cas: 3 },
            Outcome::NotStored,
            Outcome::Exists,
            Outcome::NotFound,
            Outcome::Deleted,
            Outcome::Number { value: 1, cas: 2, ttl: -1 },
            Outcome::Item { value: Arc::from(&b"xyz"[..]), cas: 8, won: true },
            Outcome::NonNumeric,
            Outcome::TooLarge,
            Outcome::Failed("disk".into()),
            Outcome::Unreadable("CapsuleDB did not answer".into()),
            Outcome::Behind,
        ] {
            let mut b = Vec::new();
            encode_outcome(&o, &mut b);
            assert_eq!(decode_outcome(&b).unwrap(), o);
            for cut in 0..b.len() {
                assert!(decode_outcome(&b[..cut]).is_err());
            }
        }
        let mut b = Vec::new();
        encode_request(b"bad key", &Rmw::Delete { cas: None }, &mut b);
        assert!(decode_request(&b).is_err());
        // Every key the parser accepts travels (a tab is a key byte in memcached's protocol).
        let mut b = Vec::new();
        encode_request(b"tab\tkey", &Rmw::Delete { cas: None }, &mut b);
        assert_eq!(decode_request(&b).unwrap().0, b"tab\tkey");
    }

    #[test]
    fn control_requests_replies_and_not_home_round_trip_exactly_and_truncations_fail() {
        let held = |k: &[u8], v: Option<&[u8]>| Held {
            key: k.to_vec(),
            version: Version { lamport: 77, writer: 3 },
            value: v.map(Arc::from),
        };
        let ctls = [
            Ctl::Acquire { slot: 2, ballot: crate::home::ballot(5, 2), lease_ms: 1000, ceiling: u64::MAX, renew: true },
            Ctl::Replicate { slot: 0, ballot: 9, entries: vec![held(b"a", Some(b"xyz")), held(b"b", None)] },
            Ctl::Replicate { slot: 0, ballot: 9, entries: vec![] },
            Ctl::Prune { slot: 1, ballot: 4, upto: 123, instances: vec![1, 2, 3] },
            Ctl::Release { slot: 254, ballot: 1 },
            Ctl::Entries { slot: 3, ballot: 8, after: Some(b"k".to_vec()) },
            Ctl::Entries { slot: 3, ballot: 8, after: None },
        ];
        for c in ctls {
            let mut b = Vec::new();
            encode_ctl(&c, &mut b);
            assert_eq!(decode_ctl(&b).unwrap(), c);
            // Never taken for a forwarded command.
            assert!(decode_request(&b).is_err());
            for cut in 0..b.len() {
                assert!(decode_ctl(&b[..cut]).is_err(), "{c:?} cut at {cut}");
            }
            b.push(0);
            assert_eq!(decode_ctl(&b).unwrap_err(), PeerError::Trailing(1));
        }
        let replies = [
            CtlReply::Granted { ceiling: 5, complete: true, instance: 6 },
            CtlReply::Refused { why: Refusal::Held, holder: Some(2), promised: 7, instance: 8 },
            CtlReply::Refused { why: Refusal::Starting, holder: None, promised: 0, instance: 1 },
            CtlReply::Ack { instance: 9 },
            CtlReply::Page { entries: vec![held(b"z", Some(b""))], more: true, instance: 4 },
        ];
        for r in replies {
            let mut b = Vec::new();
            encode_ctl_reply(&r, &mut b);
            assert_eq!(decode_ctl_reply(&b).unwrap(), r);
            for cut in 0..b.len() {
                assert!(decode_ctl_reply(&b[..cut]).is_err(), "{r:?} cut at {cut}");
            }
        }
        for r in [Routed::NotHome(Some(1)), Routed::NotHome(None), Routed::Done(Outcome::Exists)] {
            let mut b = Vec::new();
            encode_routed(&r, &mut b);
            assert_eq!(decode_routed(&b).unwrap(), r);
        }
        // A count of entries beyond what the frame can hold is refused before allocating.
        let mut b = vec![0, 2, 0, 0];
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_ctl(&b), Err(PeerError::Bad { what: "entry count", .. })));
        // Keys of stored writes are keys the parser accepts.
        let mut b = Vec::new();
        encode_ctl(&Ctl::Replicate { slot: 0, ballot: 1, entries: vec![held(b"bad key", None)] }, &mut b);
        assert!(decode_ctl(&b).is_err());
    }

    #[test]
    fn scan_requests_and_replies_round_trip_exactly_and_bad_ones_fail() {
        let req = ScanRequest { prefix: b"user:", after: Some(b"user:7"), limit: 100 };
        let mut b = Vec::new();
        encode_scan_request(&req, &mut b);
        assert_eq!(decode_scan_request(&b).unwrap(), req);
        for n in 0..b.len() {
            assert!(decode_scan_request(&b[..n]).is_err(), "truncated at {n}");
        }
        let mut zero = Vec::new();
        encode_scan_request(&ScanRequest { limit: 0, ..req.clone() }, &mut zero);
        assert!(decode_scan_request(&zero).is_err(), "a limit of 0");
        let it = |k: &[u8]| ScanItem { key: k.to_vec(), item: b"v".to_vec(), lamport: 9, writer: 65536, cas: 3 };
        for reply in [Ok((vec![it(b"a"), it(b"b")], true)), Ok((vec![], false)), Err("no".to_string())] {
            let mut b = Vec::new();
            encode_scan_reply(&reply, &mut b);
            assert_eq!(decode_scan_reply(&b).unwrap(), reply);
            for n in 0..b.len() {
                assert!(decode_scan_reply(&b[..n]).is_err(), "truncated at {n}");
            }
        }
        // Keys out of order, or a count the bytes cannot hold, are refused.
        let mut b = Vec::new();
        encode_scan_reply(&Ok((vec![it(b"b"), it(b"a")], false)), &mut b);
        assert!(decode_scan_reply(&b).is_err());
        assert!(decode_scan_reply(&[0, 255, 255, 255, 255, 0]).is_err());
    }

    #[test]
    fn frames_bind_key_direction_connection_and_sequence() {
        let k = PeerKey::derive(&DataKey::from_bytes(&[3; 32]));
        let n = [1u8; NONCE];
        let f = k.seal(b'q', &n, 5, b"hello");
        let body = &f[4..];
        assert_eq!(k.open(b'q', &n, 5, body).unwrap(), b"hello");
        assert_eq!(k.open(b'r', &n, 5, body), Err(PeerError::Seal));
        assert_eq!(k.open(b'q', &n, 6, body), Err(PeerError::Seal));
        assert_eq!(k.open(b'q', &[2; NONCE], 5, body), Err(PeerError::Seal));
        let other = PeerKey::derive(&DataKey::from_bytes(&[4; 32]));
        assert_eq!(other.open(b'q', &n, 5, body), Err(PeerError::Seal));
    }
}

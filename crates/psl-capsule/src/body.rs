//! Plaintext bodies, one layout per record kind. Bodies are sealed before they leave the
//! trusted core and are decoded only after the AEAD has authenticated them; the decoder is
//! bounded all the same.

use crate::certs::{KeyStatement, STATEMENTS_PER_RECORD_MAX};
use crate::codec::{DecodeError, Put, Reader};
use crate::limits::Limits;
use crate::record::Kind;
use psl_crypto::Hash256;

/// One key-value operation, stamped with its Lamport time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The op's Lamport time; strictly increasing within a record, and the last op's is the
    /// header's `lamport`.
    pub lamport: u64,
    /// The key, 1 to `key_bytes_max` bytes.
    pub key: Vec<u8>,
    /// What the op does to the key.
    pub action: Action,
}

/// What an [`Op`] does to its key (tag 1 or 2 in a data body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Sets the key to this value (at most `value_bytes_max` bytes; may be empty).
    Put(Vec<u8>),
    /// Removes the key.
    Delete,
}

impl Op {
    /// A put of `value` under `key` at Lamport time `lamport`.
    pub fn put(lamport: u64, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Op {
        Op { lamport, key: key.into(), action: Action::Put(value.into()) }
    }

    /// A delete of `key` at Lamport time `lamport`.
    pub fn delete(lamport: u64, key: impl Into<Vec<u8>>) -> Op {
        Op { lamport, key: key.into(), action: Action::Delete }
    }

    /// Bytes this op takes in a data body.
    pub fn encoded_len(&self) -> usize {
        let value = match &self.action {
            Action::Put(v) => Some(v.as_slice()),
            Action::Delete => None,
        };
        Op::encoded_len_of(&self.key, value)
    }

    /// Bytes an op of `key` (and, for a put, `value`) takes in a data body: tag, Lamport
    /// time, key length and key, then a put's value length and value.
    pub fn encoded_len_of(key: &[u8], value: Option<&[u8]>) -> usize {
        1 + 8 + 2 + key.len() + value.map_or(0, |v| 4 + v.len())
    }
}

/// Control messages carried in control records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ControlCode {
    /// Coordinator: ready to sync (end the epoch).
    Rts = 1,
    /// Writer: end of epoch, with its latest (seq, hash) in the links.
    Eoe = 2,
    /// Leader: wipe memtables and keys.
    Reset = 3,
    /// Leader: the application key rotates.
    Rotate = 4,
}

impl ControlCode {
    fn from_u8(v: u8) -> Option<ControlCode> {
        Some(match v {
            1 => ControlCode::Rts,
            2 => ControlCode::Eoe,
            3 => ControlCode::Reset,
            4 => ControlCode::Rotate,
            _ => return None,
        })
    }
}

/// A decoded plaintext body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A batch of ops, in strictly increasing Lamport order.
    Data(Vec<Op>),
    /// An atomic batch (a data record whose op count carries [`ATOMIC_FLAG`]): the same ops,
    /// which every node applies as one, so that no reader sees some of them and not the others.
    Atomic(Vec<Op>),
    /// A SYNC: the fingerprint of the application key in force.
    Sync {
        /// Fingerprint of the application xpub of the key generation in force at the SYNC's
        /// epoch (`SHA-256("psl/app-key-fp/v1" ‖ xpub)`); the whole 32-byte body.
        app_key_fp: Hash256,
    },
    /// A control message (RTS, EOE, RESET, ROTATE).
    Control {
        /// Which control message.
        code: ControlCode,
        /// Arbitrary bytes to the end of the body; for ROTATE, a 214-byte rotation certificate.
        payload: Vec<u8>,
    },
    /// A CapsuleDB block body; its content is CapsuleDB's and this layer does not decode it.
    DbBlock(Vec<u8>),
    /// A CapsuleDB index body; its content is CapsuleDB's and this layer does not decode it.
    DbIndex(Vec<u8>),
    /// Writer certificates and revocations (a Cert record, stored in the clear).
    Certs(Vec<KeyStatement>),
}

/// The top bit of a data body's op count: the record is an atomic batch ([`Body::Atomic`]).
pub const ATOMIC_FLAG: u32 = 1 << 31;

impl Body {
    /// The ops of a data body, atomic or not (`None` for every other kind).
    pub fn data_ops(&self) -> Option<&[Op]> {
        match self {
            Body::Data(ops) | Body::Atomic(ops) => Some(ops),
            _ => None,
        }
    }

    /// The record kind that carries this body.
    pub fn kind(&self) -> Kind {
        match self {
            Body::Data(_) | Body::Atomic(_) => Kind::Data,
            Body::Sync { .. } => Kind::Sync,
            Body::Control { .. } => Kind::Control,
            Body::DbBlock(_) => Kind::DbBlock,
            Body::DbIndex(_) => Kind::DbIndex,
            Body::Certs(_) => Kind::Cert,
        }
    }

    /// Checks the body against `limits` and the header's Lamport time: what an encoder must
    /// hold before writing and a decoder must find after reading.
    pub fn check(&self, limits: &Limits, header_lamport: u64) -> Result<(), DecodeError> {
        if let Body::Certs(list) = self {
            if list.is_empty() || list.len() > STATEMENTS_PER_RECORD_MAX {
                return Err(DecodeError::Limit {
                    field: "statement count",
                    len: list.len() as u64,
                    max: STATEMENTS_PER_RECORD_MAX as u64,
                });
            }
        }
        if let Some(ops) = self.data_ops() {
            if ops.is_empty() {
                return Err(DecodeError::Invalid { field: "ops", why: "a data record holds at least one op" });
            }
            if ops.len() as u64 > limits.ops_per_record_max as u64 {
                return Err(DecodeError::Limit {
                    field: "op count",
                    len: ops.len() as u64,
                    max: limits.ops_per_record_max as u64,
                });
            }
            let mut last = None;
            for op in ops {
                if op.key.is_empty() {
                    return Err(DecodeError::Invalid { field: "key", why: "empty" });
                }
                if op.key.len() as u64 > limits.key_bytes_max as u64 {
                    return Err(DecodeError::Limit {
                        field: "key",
                        len: op.key.len() as u64,
                        max: limits.key_bytes_max as u64,
                    });
                }
                if let Action::Put(v) = &op.action {
                    if v.len() as u64 > limits.value_bytes_max as u64 {
                        return Err(DecodeError::Limit {
                            field: "value",
                            len: v.len() as u64,
                            max: limits.value_bytes_max as u64,
                        });
                    }
                }
                if last.is_some_and(|l| op.lamport <= l) {
                    return Err(DecodeError::Invalid { field: "op lamport", why: "not strictly increasing" });
                }
                last = Some(op.lamport);
            }
            if last != Some(header_lamport) {
                return Err(DecodeError::Invalid { field: "header lamport", why: "differs from the last op's" });
            }
        }
        Ok(())
    }

    /// The plaintext bytes of the body (before sealing); does not check limits (see `check`).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Body::Data(ops) | Body::Atomic(ops) => {
                b.reserve(4 + ops.iter().map(Op::encoded_len).sum::<usize>());
                let flag = if matches!(self, Body::Atomic(_)) { ATOMIC_FLAG } else { 0 };
                b.put_u32(ops.len() as u32 | flag);
                for op in ops {
                    b.put_u8(match op.action {
                        Action::Put(_) => 1,
                        Action::Delete => 2,
                    });
                    b.put_u64(op.lamport);
                    b.put_u16(op.key.len() as u16);
                    b.extend_from_slice(&op.key);
                    if let Action::Put(v) = &op.action {
                        b.put_u32(v.len() as u32);
                        b.extend_from_slice(v);
                    }
                }
            }
            Body::Sync { app_key_fp } => b.extend_from_slice(&app_key_fp.0),
            Body::Control { code, payload } => {
                b.put_u8(*code as u8);
                b.extend_from_slice(payload);
            }
            Body::DbBlock(x) | Body::DbIndex(x) => b.extend_from_slice(x),
            Body::Certs(list) => b = KeyStatement::encode_list(list),
        }
        b
    }

    /// Decodes a plaintext body of `kind`. Bounded by `limits`; never panics.
    pub fn decode(kind: Kind, bytes: &[u8], limits: &Limits) -> Result<Body, DecodeError> {
        let mut r = Reader::new(bytes);
        let body = match kind {
            Kind::Data => {
                let count = r.u32("op count")?;
                let atomic = count & ATOMIC_FLAG != 0;
                let n = (count & !ATOMIC_FLAG) as u64;
                if n > limits.ops_per_record_max as u64 {
                    return Err(DecodeError::Limit {
                        field: "op count",
                        len: n,
                        max: limits.ops_per_record_max as u64,
                    });
                }
                // Each op takes at least 11 bytes, so n is also bounded by the bytes present.
                if n * 11 > r.remaining() as u64 {
                    return Err(DecodeError::Truncated {
                        field: "ops",
                        offset: r.pos(),
                        need: n as usize * 11,
                        have: r.remaining(),
                    });
                }
                let mut ops = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let tag = r.u8("op tag")?;
                    let lamport = r.u64("op lamport")?;
                    let klen = r.u16("key length")? as u64;
                    let key = r.bounded(klen, limits.key_bytes_max as u64, "key")?.to_vec();
                    let action = match tag {
                        1 => {
                            let vlen = r.u32("value length")? as u64;
                            Action::Put(r.bounded(vlen, limits.value_bytes_max as u64, "value")?.to_vec())
                        }
                        2 => Action::Delete,
                        t => return Err(DecodeError::Tag { field: "op tag", value: t as u64 }),
                    };
                    ops.push(Op { lamport, key, action });
                }
                if atomic {
                    Body::Atomic(ops)
                } else {
                    Body::Data(ops)
                }
            }
            Kind::Sync => Body::Sync { app_key_fp: Hash256(r.array("key fingerprint")?) },
            Kind::Control => {
                let c = r.u8("control code")?;
                let code =
                    ControlCode::from_u8(c).ok_or(DecodeError::Tag { field: "control code", value: c as u64 })?;
                let rest = r.remaining();
                Body::Control { code, payload: r.take(rest, "control payload")?.to_vec() }
            }
            Kind::DbBlock => Body::DbBlock(bytes.to_vec()),
            Kind::DbIndex => Body::DbIndex(bytes.to_vec()),
            Kind::Cert => return KeyStatement::decode_list(bytes).map(Body::Certs),
        };
        if matches!(kind, Kind::Data | Kind::Sync) {
            r.finish("body")?;
        }
        Ok(body)
    }
}

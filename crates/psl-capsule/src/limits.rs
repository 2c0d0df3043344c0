//! Size limits. Every decoder checks them before allocating; every encoder checks them before
//! writing. A capsule's metadata carries its limits so that every replica enforces the same ones.

use serde::Serialize;

/// A capsule's size limits, stored in its metadata policy so that every replica enforces the same
/// values. `Default` gives 250-byte keys, 1 MiB values, 4096 ops and 1024 links per record and
/// 8 MiB records; no field may exceed [`Limits::CEILING`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Largest key of a put or delete, in bytes (memcached's limit is 250).
    pub key_bytes_max: u32,
    /// Largest value of a put, in bytes.
    pub value_bytes_max: u32,
    /// Most ops in one data record.
    pub ops_per_record_max: u32,
    /// Most hash links (besides `prev`) in one record header.
    pub links_per_record_max: u32,
    /// Largest encoded record, header and signature included.
    pub record_bytes_max: u32,
}

impl Limits {
    /// Hard ceilings no capsule may raise its limits above, so that a hostile metadata block
    /// cannot make a decoder allocate without bound. Key length and link count are encoded in
    /// 16 bits, so their ceilings are `u16::MAX`.
    pub const CEILING: Limits = Limits {
        key_bytes_max: u16::MAX as u32,
        value_bytes_max: 64 << 20,
        ops_per_record_max: 1 << 20,
        links_per_record_max: u16::MAX as u32,
        record_bytes_max: 128 << 20,
    };

    /// Whether every limit is at or below [`Limits::CEILING`] and `key_bytes_max` and
    /// `ops_per_record_max` are at least 1: the check metadata decoding and signing apply.
    pub fn within_ceiling(&self) -> bool {
        let c = Self::CEILING;
        self.key_bytes_max <= c.key_bytes_max
            && self.value_bytes_max <= c.value_bytes_max
            && self.ops_per_record_max <= c.ops_per_record_max
            && self.links_per_record_max <= c.links_per_record_max
            && self.record_bytes_max <= c.record_bytes_max
            && self.key_bytes_max >= 1
            && self.ops_per_record_max >= 1
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            key_bytes_max: 250,
            value_bytes_max: 1 << 20,
            ops_per_record_max: 4096,
            links_per_record_max: 1024,
            record_bytes_max: 8 << 20,
        }
    }
}

//! Bounded little-endian reading and writing shared by every decoder in this crate.
//!
//! The reader never indexes past its buffer and never allocates more than a length it has
//! already checked against a limit and against the bytes actually present.

/// Why a byte string is not a valid encoding. `field` names what was being read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended before a fixed-size or length-prefixed field was complete.
    #[error("truncated: {field} needs {need} bytes at offset {offset}, {have} left")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Byte offset in the input where the field starts.
        offset: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes left in the input from `offset`.
        have: usize,
    },
    /// A length or count is above its limit; checked before anything is allocated or copied.
    #[error("{field} is {len}, over the limit of {max}")]
    Limit {
        /// The length or count field.
        field: &'static str,
        /// The value found (bytes, or items for a count).
        len: u64,
        /// The largest value allowed, in the same unit.
        max: u64,
    },
    /// A version byte this build does not read.
    #[error("unsupported {what} version {found} (this build reads version {supported})")]
    Version {
        /// The encoding whose version it is (metadata, record, proof, ...).
        what: &'static str,
        /// The version byte found.
        found: u8,
        /// The newest version this build reads.
        supported: u8,
    },
    /// The leading magic bytes are not the ones of the expected encoding.
    #[error("bad magic for {what}")]
    Magic {
        /// The encoding that was expected.
        what: &'static str,
    },
    /// A tag, kind or code byte with no defined meaning.
    #[error("unknown {field} value {value}")]
    Tag {
        /// The tag field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// Bytes are left over after a complete encoding: every decoder reads exactly its input.
    #[error("{count} trailing bytes after the end of {what}")]
    Trailing {
        /// The encoding that ended early.
        what: &'static str,
        /// How many bytes follow its end.
        count: usize,
    },
    /// A text field (such as the metadata label) is not valid UTF-8.
    #[error("{field} is not valid UTF-8")]
    Utf8 {
        /// The text field.
        field: &'static str,
    },
    /// A field decodes but its value is not allowed (not a curve point, an index at or above
    /// 2^31, an empty window, ...).
    #[error("{field}: {why}")]
    Invalid {
        /// The field whose value is refused.
        field: &'static str,
        /// Why it is refused.
        why: &'static str,
    },
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated { field, offset: self.pos, need: n, have: self.remaining() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A length-prefixed field whose length was already read: checks it against `max` and
    /// against the bytes present before touching them.
    pub(crate) fn bounded(&mut self, len: u64, max: u64, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if len > max {
            return Err(DecodeError::Limit { field, len, max });
        }
        self.take(len as usize, field)
    }

    pub(crate) fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        if self.remaining() != 0 {
            return Err(DecodeError::Trailing { what, count: self.remaining() });
        }
        Ok(())
    }
}

pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v)
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes())
    }
}

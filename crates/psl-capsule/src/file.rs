//! The portable capsule file (`.capsule`): one file holding the metadata and every record.
//!
//! ```text
//! "PSLCAPS" 0x01                      8-byte magic and version
//! signed metadata                     u16 len || metadata || owner signature
//! { 'R' || u32 len || record }*       each record self-authenticating (hash + signature)
//! 'T' || u64 record count || SHA-256(every byte before this digest)
//! ```
//!
//! The file must end exactly after the trailer. A flipped byte anywhere is caught by the
//! metadata signature, a record's signature, the framing, or the trailer digest; truncation
//! loses the trailer; appended bytes follow it. A deliberate cut at a record boundary with a
//! recomputed trailer looks like an older replica: only a signed head (the newest SYNC) can
//! expose that, see `docs/security/threat-model.md`.

use crate::codec::{DecodeError, Reader};
use crate::limits::Limits;
use crate::meta::{MetadataError, SignedMetadata};
use crate::record::Record;
use psl_crypto::{sha256, Hash256};

/// The first 8 bytes of every capsule file: the magic `PSLCAPS` and format version 1.
pub const FILE_MAGIC: &[u8; 8] = b"PSLCAPS\x01";
const TAG_RECORD: u8 = b'R';
const TAG_TRAILER: u8 = b'T';

/// Encodes a capsule file. Records are written in the order given.
pub fn encode<'a>(metadata: &SignedMetadata, records: impl IntoIterator<Item = &'a Record>) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(FILE_MAGIC);
    b.extend_from_slice(&metadata.encode());
    let mut n = 0u64;
    for r in records {
        b.push(TAG_RECORD);
        b.extend_from_slice(&(r.bytes().len() as u32).to_le_bytes());
        b.extend_from_slice(r.bytes());
        n += 1;
    }
    b.push(TAG_TRAILER);
    b.extend_from_slice(&n.to_le_bytes());
    let d = sha256(&[&b]);
    b.extend_from_slice(&d.0);
    b
}

/// One record frame as found in the file.
#[derive(Debug)]
pub struct Frame {
    /// Position among the file's records, from 0.
    pub index: usize,
    /// Byte offset of the frame's tag.
    pub offset: usize,
    /// The frame's record decoded (not verified) under the metadata's limits, or why it does
    /// not decode.
    pub record: Result<Record, DecodeError>,
}

/// Everything a scan found, good and bad, so that `verify` can name every problem.
#[derive(Debug)]
pub struct Scan {
    /// The signed metadata, decoded and owner-signature checked, or why it is refused.
    pub metadata: Result<SignedMetadata, MetadataError>,
    /// Every record frame read before the trailer or a fatal problem, in file order.
    pub frames: Vec<Frame>,
    /// A problem that stopped the scan (bad magic, framing, truncation, trailing bytes).
    pub fatal: Option<FileProblem>,
    /// Whether a trailer was found and its count and digest match.
    pub trailer_ok: bool,
}

/// A problem with a file's structure (magic, framing, trailer) that stops a scan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileProblem {
    /// The file does not start with [`FILE_MAGIC`].
    #[error("not a capsule file (bad magic or version)")]
    Magic,
    /// The metadata's length prefix is unreadable, over the limit, or runs past the file's end.
    #[error("metadata at offset 8: {0}")]
    Metadata(DecodeError),
    /// A frame has an unknown tag, or a record length that is over `record_bytes_max` or runs
    /// past the file's end.
    #[error("record #{index} at offset {offset}: frame: {err}")]
    Frame {
        /// Position of the frame among the file's records, from 0.
        index: usize,
        /// Byte offset of the frame's tag.
        offset: usize,
        /// What is wrong with the frame.
        err: DecodeError,
    },
    /// The file ends, or the trailer is cut short, before the trailer is complete.
    #[error("file ends without a trailer after record #{after} (truncated?)")]
    NoTrailer {
        /// How many frames were read before the end.
        after: usize,
    },
    /// The trailer's record count differs from the frames read.
    #[error("trailer says {claimed} records, the file holds {found}")]
    Count {
        /// The count the trailer states.
        claimed: u64,
        /// The frames actually read.
        found: u64,
    },
    /// The trailer's SHA-256 does not match the bytes before it (accidental damage; it has no key).
    #[error("trailer digest does not match the file's bytes (altered?)")]
    Digest,
    /// Bytes follow the trailer; carries how many.
    #[error("{0} bytes after the trailer")]
    Trailing(usize),
}

impl Scan {
    /// Whether nothing is wrong: metadata verified, no fatal problem, a matching trailer and
    /// every record decoded (records are not verified here).
    pub fn is_clean(&self) -> bool {
        self.metadata.is_ok() && self.fatal.is_none() && self.trailer_ok && self.frames.iter().all(|f| f.record.is_ok())
    }
}

/// Scans a capsule file, decoding (not verifying) what it can. Never panics.
pub fn scan(bytes: &[u8]) -> Scan {
    let mut s = Scan { metadata: Err(MetadataError::Signature), frames: Vec::new(), fatal: None, trailer_ok: false };
    if bytes.len() < FILE_MAGIC.len() || &bytes[..8] != FILE_MAGIC {
        s.metadata = Err(MetadataError::Decode(DecodeError::Magic { what: "capsule file" }));
        s.fatal = Some(FileProblem::Magic);
        return s;
    }
    let rest = &bytes[8..];
    let mlen = match SignedMetadata::encoded_len(rest) {
        Ok(n) if n <= rest.len() => n,
        Ok(n) => {
            let e = DecodeError::Truncated { field: "metadata", offset: 8, need: n, have: rest.len() };
            s.metadata = Err(e.clone().into());
            s.fatal = Some(FileProblem::Metadata(e));
            return s;
        }
        Err(e) => {
            s.metadata = Err(e.clone().into());
            s.fatal = Some(FileProblem::Metadata(e));
            return s;
        }
    };
    s.metadata = SignedMetadata::decode(&rest[..mlen]);
    // With damaged metadata, keep scanning under the default limits to report the records too.
    let limits = s.metadata.as_ref().map(|m| m.meta.policy.limits).unwrap_or_default();
    let mut r = Reader::new(bytes);
    let _ = r.take(8 + mlen, "header");
    loop {
        let offset = r.pos();
        let index = s.frames.len();
        let tag = match r.u8("frame tag") {
            Ok(t) => t,
            Err(_) => {
                s.fatal = Some(FileProblem::NoTrailer { after: index });
                return s;
            }
        };
        match tag {
            TAG_RECORD => {
                let body =
                    r.u32("record length").and_then(|n| r.bounded(n as u64, limits.record_bytes_max as u64, "record"));
                match body {
                    Ok(b) => s.frames.push(Frame { index, offset, record: Record::decode(b, &limits) }),
                    Err(err) => {
                        s.fatal = Some(FileProblem::Frame { index, offset, err });
                        return s;
                    }
                }
            }
            TAG_TRAILER => {
                let end = r.u64("record count").and_then(|n| Ok((n, r.array::<32>("file digest")?)));
                match end {
                    Ok((n, digest)) => {
                        let computed = sha256(&[&bytes[..r.pos() - 32]]);
                        let count_ok = n == s.frames.len() as u64;
                        if !count_ok {
                            s.fatal = Some(FileProblem::Count { claimed: n, found: s.frames.len() as u64 });
                        } else if Hash256(digest) != computed {
                            s.fatal = Some(FileProblem::Digest);
                        } else if r.remaining() > 0 {
                            s.fatal = Some(FileProblem::Trailing(r.remaining()));
                        } else {
                            s.trailer_ok = true;
                        }
                    }
                    Err(_) => s.fatal = Some(FileProblem::NoTrailer { after: index }),
                }
                return s;
            }
            t => {
                s.fatal = Some(FileProblem::Frame {
                    index,
                    offset,
                    err: DecodeError::Tag { field: "frame tag", value: t as u64 },
                });
                return s;
            }
        }
    }
}

/// A strictly parsed file: every check of the framing passed and every record decoded.
#[derive(Debug, Clone)]
pub struct CapsuleFile {
    /// The file's signed metadata, owner signature checked.
    pub metadata: SignedMetadata,
    /// Every record, in file order, decoded but not verified (see `Verifier`).
    pub records: Vec<Record>,
}

/// Why [`CapsuleFile::parse`] refused a file: the first problem found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The file's structure is broken (magic, framing, trailer).
    #[error("{0}")]
    Problem(#[from] FileProblem),
    /// The metadata does not decode or its owner signature does not verify.
    #[error("metadata: {0}")]
    Metadata(#[from] MetadataError),
    /// A record inside an intact frame does not decode.
    #[error("record #{index} at offset {offset}: {err}")]
    Record {
        /// Position of the record among the file's records, from 0.
        index: usize,
        /// Byte offset of its frame's tag.
        offset: usize,
        /// Why the record does not decode.
        err: DecodeError,
    },
}

impl CapsuleFile {
    /// Parses a whole file strictly: any framing, trailer, metadata or record decoding problem
    /// is an error. Records are decoded, not verified.
    pub fn parse(bytes: &[u8]) -> Result<CapsuleFile, FileError> {
        let s = scan(bytes);
        if let Some(f) = s.fatal {
            return Err(f.into());
        }
        let metadata = s.metadata?;
        let mut records = Vec::with_capacity(s.frames.len());
        for f in s.frames {
            records.push(f.record.map_err(|err| FileError::Record { index: f.index, offset: f.offset, err })?);
        }
        Ok(CapsuleFile { metadata, records })
    }

    /// The file's bytes, records in the order held, with a fresh trailer (see [`encode`]).
    pub fn encode(&self) -> Vec<u8> {
        encode(&self.metadata, &self.records)
    }
}

/// Default limits, for callers that must bound a scan before they know a capsule's own.
pub fn default_limits() -> Limits {
    Limits::default()
}

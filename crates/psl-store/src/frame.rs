//! The frame format of `records.log` and the scanner that reads a log back.
//!
//! ```text
//! frame = u32 LE len || u32 LE crc32(record) || record (len bytes)
//! ```
//!
//! The scanner never trusts a byte of the file: every length is bounded before anything is
//! read or allocated, every frame's CRC is checked, every record is decoded under the
//! capsule's limits and verified by the capsule's [`Verifier`]. When the framing itself is in
//! doubt (a bad length, a CRC mismatch, an undecodable record), it *resynchronises*: it searches
//! for the next position where a whole valid frame starts, recognised by the capsule name that
//! every record header carries at a fixed offset, then a plausible length, a matching CRC and a
//! decodable record. What lies between is then classified (see the table in the crate documentation).

use crate::fsutil::read_exact_at;
use psl_capsule::record::HEADER_FIXED_LEN;
use psl_capsule::{CapsuleName, DecodeError, Limits, Record, Rejected, Verified, Verifier};
use psl_crypto::SIGNATURE_LEN;
use std::fmt;
use std::fs::File;
use std::io;

/// Bytes of a frame header (length and CRC).
pub const FRAME_HEADER_LEN: u64 = 8;
/// The smallest possible record: a header without links, a body length, no body, a signature.
/// A length field below this cannot be genuine (an all-zero region would otherwise parse as a
/// run of empty frames with a valid CRC of 0).
pub const MIN_RECORD_LEN: u32 = (HEADER_FIXED_LEN + 4 + SIGNATURE_LEN) as u32;
/// Offset of the capsule name inside a frame: frame header, then version, kind, link count.
const NAME_OFFSET_IN_FRAME: u64 = FRAME_HEADER_LEN + 4;
/// Bytes the reader fetches at a time when scanning sequentially.
const READ_CHUNK: u64 = 1 << 20;
/// Bytes the resynchronising search looks at per step.
const SEARCH_CHUNK: u64 = 64 << 10;

/// Appends the frame of `record` to `out`.
pub(crate) fn encode_frame(record: &[u8], out: &mut Vec<u8>) {
    let len =
        u32::try_from(record.len()).expect("record lengths are checked against the capsule's limits before framing");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(record).to_le_bytes());
    out.extend_from_slice(record);
}

/// What is wrong with a frame (or with the bytes where a frame should start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameFault {
    /// Fewer than 8 bytes remain for the frame header.
    ShortHeader {
        /// Bytes left in the file at the frame's offset.
        have: u64,
    },
    /// The length field is outside `[MIN_RECORD_LEN, record_bytes_max]`.
    Length {
        /// The record length the frame header states, in bytes.
        len: u32,
        /// The smallest possible record, [`MIN_RECORD_LEN`] bytes.
        min: u32,
        /// The capsule's `record_bytes_max`, in bytes.
        max: u32,
    },
    /// The frame claims more bytes than the file has left.
    PastEof {
        /// The record length the frame header states, in bytes.
        len: u32,
        /// Bytes left in the file after the frame header.
        have: u64,
    },
    /// The record bytes do not match the frame's CRC.
    Crc {
        /// The CRC-32 in the frame header.
        stored: u32,
        /// The CRC-32 of the record bytes as read.
        computed: u32,
    },
    /// The CRC matches but the bytes do not decode as a record.
    Decode(DecodeError),
    /// The record decodes but the verifier refuses it (signature, capsule, body, ...).
    Verify(Box<Rejected>),
    /// Read back: the frame's length is not the one the index recorded.
    LengthChanged {
        /// The record length the index recorded, in bytes.
        indexed: u32,
        /// The record length the frame header states now, in bytes.
        found: u32,
    },
    /// Read back: the frame holds a valid record, but not the one the index names.
    WrongRecord {
        /// Hash of the record actually found in the frame.
        found: psl_crypto::Hash256,
    },
}

impl fmt::Display for FrameFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameFault::ShortHeader { have } => {
                write!(f, "incomplete frame header ({have} of 8 bytes)")
            }
            FrameFault::Length { len, min, max } => {
                write!(f, "frame length {len} is outside the possible range {min}..={max}")
            }
            FrameFault::PastEof { len, have } => {
                write!(
                    f,
                    "frame of {len} record bytes runs past the end of the file ({have} bytes left after its header)"
                )
            }
            FrameFault::Crc { stored, computed } => {
                write!(f, "crc32 mismatch (frame says {stored:#010x}, bytes give {computed:#010x})")
            }
            FrameFault::Decode(e) => write!(f, "record does not decode: {e}"),
            FrameFault::Verify(r) => write!(f, "record does not verify: {r}"),
            FrameFault::LengthChanged { indexed, found } => {
                write!(f, "frame length is {found}, but the index recorded {indexed}")
            }
            FrameFault::WrongRecord { found } => {
                write!(f, "frame holds record {found}, not the one indexed here")
            }
        }
    }
}

/// A read-ahead window over the log, for sequential scans with occasional jumps.
pub(crate) struct LogReader<'a> {
    file: &'a File,
    len: u64,
    buf: Vec<u8>,
    start: u64,
}

impl<'a> LogReader<'a> {
    pub(crate) fn new(file: &'a File, len: u64) -> Self {
        LogReader { file, len, buf: Vec::new(), start: 0 }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bytes `[pos, pos + n)`. The caller has checked `pos + n <= len`.
    pub(crate) fn get(&mut self, pos: u64, n: u64) -> io::Result<&[u8]> {
        debug_assert!(pos + n <= self.len);
        let end = pos + n;
        if pos < self.start || end > self.start + self.buf.len() as u64 {
            let want = n.max(READ_CHUNK).min(self.len - pos);
            self.buf.resize(want as usize, 0);
            read_exact_at(self.file, &mut self.buf, pos)?;
            self.start = pos;
        }
        let o = (pos - self.start) as usize;
        Ok(&self.buf[o..o + n as usize])
    }
}

/// The result of reading one frame, before verification.
pub(crate) enum Probe {
    Ok { len: u32, record: Record },
    Bad { fault: FrameFault, stated_len: Option<u32> },
}

/// Reads, bounds-checks, CRC-checks and decodes the frame at `pos`.
pub(crate) fn probe(r: &mut LogReader<'_>, pos: u64, limits: &Limits) -> io::Result<Probe> {
    let have = r.len() - pos;
    if have < FRAME_HEADER_LEN {
        return Ok(Probe::Bad { fault: FrameFault::ShortHeader { have }, stated_len: None });
    }
    let hdr = r.get(pos, FRAME_HEADER_LEN)?;
    let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let stored = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
    if len < MIN_RECORD_LEN || len > limits.record_bytes_max {
        let fault = FrameFault::Length { len, min: MIN_RECORD_LEN, max: limits.record_bytes_max };
        return Ok(Probe::Bad { fault, stated_len: None });
    }
    let left = have - FRAME_HEADER_LEN;
    if len as u64 > left {
        return Ok(Probe::Bad { fault: FrameFault::PastEof { len, have: left }, stated_len: None });
    }
    let bytes = r.get(pos + FRAME_HEADER_LEN, len as u64)?;
    let computed = crc32fast::hash(bytes);
    if computed != stored {
        return Ok(Probe::Bad { fault: FrameFault::Crc { stored, computed }, stated_len: Some(len) });
    }
    match Record::decode(bytes, limits) {
        Ok(record) => Ok(Probe::Ok { len, record }),
        Err(e) => Ok(Probe::Bad { fault: FrameFault::Decode(e), stated_len: Some(len) }),
    }
}

/// The first position `>= from` where a whole, CRC-valid, decodable frame of capsule `name`
/// starts, if any.
pub(crate) fn find_next_frame(
    r: &mut LogReader<'_>,
    from: u64,
    name: &CapsuleName,
    limits: &Limits,
) -> io::Result<Option<u64>> {
    let needle: &[u8; 32] = name.0.as_bytes();
    let len = r.len();
    let mut s = from + NAME_OFFSET_IN_FRAME;
    while s + 32 <= len {
        let e = (s + SEARCH_CHUNK).min(len);
        let hits: Vec<u64> =
            r.get(s, e - s)?.windows(32).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| s + i as u64).collect();
        for m in hits {
            let candidate = m - NAME_OFFSET_IN_FRAME;
            if let Probe::Ok { record, .. } = probe(r, candidate, limits)? {
                if record.header().capsule == *name {
                    return Ok(Some(candidate));
                }
            }
        }
        if e == len {
            break;
        }
        // Overlap so that a name straddling the chunk boundary is found.
        s = e - 31;
    }
    Ok(None)
}

/// A frame that could be delimited but whose record is bad; the scan skipped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedFrame {
    /// Position of the frame in the log, from 0.
    pub index: u64,
    /// Byte offset of the frame header in `records.log`.
    pub offset: u64,
    /// Record bytes the frame holds.
    pub len: u32,
    /// What is wrong with the record.
    pub fault: FrameFault,
}

impl fmt::Display for DamagedFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "records.log frame #{} at offset {} ({} bytes) is damaged: {}",
            self.index, self.offset, self.len, self.fault
        )
    }
}

/// A region of the log in which no frame boundary could be trusted (typically a corrupted
/// length field in the middle of the log). The scan resumed at `end`, where a valid frame starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// Index the next frame would have had.
    pub index: u64,
    /// Byte offset in `records.log` where the region starts.
    pub offset: u64,
    /// Byte offset where the region ends (exclusive): the start of the next valid frame.
    pub end: u64,
    /// What was wrong at `offset`.
    pub fault: FrameFault,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "records.log bytes {}..{} ({} bytes, from frame #{}) are unreadable: {}; the next valid frame starts at {}",
            self.offset,
            self.end,
            self.end - self.offset,
            self.index,
            self.fault,
            self.end
        )
    }
}

/// Bytes at the end of the log that hold no valid frame: an interrupted write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Position of the frame where the tail starts.
    pub index: u64,
    /// Byte offset in `records.log` where the tail starts.
    pub offset: u64,
    /// Length of the tail in bytes, up to the end of the file.
    pub bytes: u64,
    /// What is wrong with the frame at `offset`.
    pub fault: FrameFault,
    /// Whether the file was cut back to `offset` (not in read-only mode or in a check).
    pub truncated: bool,
}

impl fmt::Display for TornTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "records.log frame #{} at offset {} starts a torn tail of {} bytes ({}){}",
            self.index,
            self.offset,
            self.bytes,
            self.fault,
            if self.truncated { ", truncated" } else { ", left in place" }
        )
    }
}

/// What the scanner found, in file order.
pub(crate) enum Event {
    Good { index: u64, offset: u64, len: u32, record: Verified<Record> },
    Damaged(DamagedFrame),
    Unreadable(Unreadable),
    Torn(TornTail),
}

/// Scans a whole log, verifying every record, and reports each frame to `on`. Returns the
/// number of frame positions seen.
///
/// At a position `p` where no valid frame starts:
/// - a frame whose CRC matches and whose record decodes but fails verification is *damaged*:
///   its framing is trustworthy, so the scan skips it by its length;
/// - otherwise the scan searches for the next valid frame `q > p`:
///   - none: everything from `p` to the end is a *torn tail* (no valid frame can be lost by
///     cutting it off);
///   - `q` is exactly where the frame at `p` says it ends: a *damaged* frame with intact framing;
///   - otherwise `p..q` is *unreadable* (the length field itself is corrupt) and the scan
///     resumes at `q`.
pub(crate) fn scan(r: &mut LogReader<'_>, verifier: &Verifier, on: impl FnMut(Event)) -> io::Result<u64> {
    scan_from(r, 0, 0, verifier, on)
}

/// [`scan`] from byte `pos`, where frame number `index` starts; returns the frame count (from
/// the log's start).
pub(crate) fn scan_from(
    r: &mut LogReader<'_>,
    mut pos: u64,
    mut index: u64,
    verifier: &Verifier,
    mut on: impl FnMut(Event),
) -> io::Result<u64> {
    let limits = verifier.metadata().meta.policy.limits;
    let name = verifier.name();
    // Records of a certified capsule whose writer's certificate comes later in the log wait
    // here (a statement's place in the log does not matter: the application key signs it).
    let mut held: Vec<(u64, u64, u32, Record)> = Vec::new();
    while pos < r.len() {
        let (fault, stated_len) = match probe(r, pos, &limits)? {
            Probe::Ok { len, record } => {
                let next = pos + FRAME_HEADER_LEN + len as u64;
                let is_cert = record.header().kind == psl_capsule::Kind::Cert;
                let verdict = verifier.verify(record.clone());
                if is_cert && verdict.is_ok() {
                    // A Cert record that verified may have taught the verifier the certificate
                    // that held records wait for. They come earlier in the log (a writer's
                    // first record can precede its certificate): placed first, a writer's chain
                    // stays in order even when this record is that writer's next one.
                    release_held(&mut held, verifier, &mut on);
                }
                match verdict {
                    Ok(record) => on(Event::Good { index, offset: pos, len, record }),
                    Err(rej) if rej.reason.wants_cert() && held.len() < psl_capsule::verify::HELD_RECORDS_MAX => {
                        held.push((index, pos, len, record))
                    }
                    Err(rej) => on(Event::Damaged(DamagedFrame {
                        index,
                        offset: pos,
                        len,
                        fault: FrameFault::Verify(Box::new(rej)),
                    })),
                }
                if is_cert {
                    release_held(&mut held, verifier, &mut on);
                }
                index += 1;
                pos = next;
                continue;
            }
            Probe::Bad { fault, stated_len } => (fault, stated_len),
        };
        match find_next_frame(r, pos + 1, &name, &limits)? {
            None => {
                on(Event::Torn(TornTail { index, offset: pos, bytes: r.len() - pos, fault, truncated: false }));
                break;
            }
            Some(q) => match stated_len {
                Some(len) if pos + FRAME_HEADER_LEN + len as u64 == q => {
                    on(Event::Damaged(DamagedFrame { index, offset: pos, len, fault }));
                    index += 1;
                    pos = q;
                }
                _ => {
                    on(Event::Unreadable(Unreadable { index, offset: pos, end: q, fault }));
                    index += 1;
                    pos = q;
                }
            },
        }
    }
    for (i, off, l, rec) in held {
        match verifier.verify(rec) {
            Ok(record) => on(Event::Good { index: i, offset: off, len: l, record }),
            Err(rej) => on(Event::Damaged(DamagedFrame {
                index: i,
                offset: off,
                len: l,
                fault: FrameFault::Verify(Box::new(rej)),
            })),
        }
    }
    Ok(index)
}

/// Verifies the held records again, in log order: reports those that verify now (or fail for
/// another reason) and keeps those still waiting for a certificate.
fn release_held(held: &mut Vec<(u64, u64, u32, Record)>, verifier: &Verifier, on: &mut impl FnMut(Event)) {
    if held.is_empty() {
        return;
    }
    let mut waiting = Vec::new();
    for (i, off, l, rec) in std::mem::take(held) {
        match verifier.verify(rec.clone()) {
            Ok(record) => on(Event::Good { index: i, offset: off, len: l, record }),
            Err(rej) if rej.reason.wants_cert() => waiting.push((i, off, l, rec)),
            Err(rej) => on(Event::Damaged(DamagedFrame {
                index: i,
                offset: off,
                len: l,
                fault: FrameFault::Verify(Box::new(rej)),
            })),
        }
    }
    *held = waiting;
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule, Author};
    use psl_crypto::OwnerKey;
    use std::io::Write;

    #[test]
    fn resync_finds_a_frame_wherever_it_sits_relative_to_the_search_chunks() {
        let owner = OwnerKey::from_seed(&[9; 32]).unwrap();
        let app = owner.app(1).unwrap();
        let meta = new_capsule(&owner, 1, "frame", 0, Limits::default()).unwrap();
        let rec = Author::new(&meta, &app, 1).unwrap().write_ops([("k", Some("v"))]).unwrap();
        let limits = meta.meta.policy.limits;
        let mut frame = Vec::new();
        encode_frame(rec.bytes(), &mut frame);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let chunk = SEARCH_CHUNK as usize;
        // Junk lengths that put the capsule name before, across and after the first chunk end.
        for junk in (chunk - 60..chunk + 20).chain([0, 1, 7, 3 * chunk + 5]) {
            let mut f = File::create(&path).unwrap();
            f.write_all(&vec![0xa5; junk]).unwrap();
            f.write_all(&frame).unwrap();
            drop(f);
            let f = File::open(&path).unwrap();
            let len = f.metadata().unwrap().len();
            let mut r = LogReader::new(&f, len);
            assert_eq!(find_next_frame(&mut r, 0, &meta.name(), &limits).unwrap(), Some(junk as u64), "junk {junk}");
            assert_eq!(find_next_frame(&mut r, junk as u64 + 1, &meta.name(), &limits).unwrap(), None, "junk {junk}");
        }
    }
}

#[cfg(test)]
mod held_order_tests {
    use super::*;
    use psl_capsule::{new_capsule_with, writer_credentials, Body, ControlCode, WriterKeys};
    use psl_crypto::OwnerKey;
    use std::io::Write;

    /// A certified writer whose first record precedes its own certificate (seq 0 a control
    /// record, seq 1 the Cert record introducing it, seq 2 data): the scan holds seq 0 until the
    /// certificate verifies and reports it before seq 1, so every record comes out in chain
    /// order and the index places all three.
    #[test]
    fn a_record_before_its_writers_certificate_comes_out_before_the_certificate() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let app = owner.app(2).unwrap();
        let meta = new_capsule_with(&owner, 2, "held", 0, Limits::default(), WriterKeys::Certified).unwrap();
        let w = 7 << 16;
        let (key, cert) = writer_credentials(&meta, &app, w).unwrap();
        let mut a = psl_capsule::Author::with_certified_keys(&meta, key, cert.unwrap(), app.data_key()).unwrap();
        let first = a.write_control(Body::Control { code: ControlCode::Rts, payload: vec![0; 8] }, Vec::new());
        let recs = [first.unwrap(), a.write_own_cert().unwrap().unwrap(), a.write_ops([("k", Some("v"))]).unwrap()];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut f = File::create(&path).unwrap();
        for r in &recs {
            let mut frame = Vec::new();
            encode_frame(r.bytes(), &mut frame);
            f.write_all(&frame).unwrap();
        }
        drop(f);
        let f = File::open(&path).unwrap();
        let len = f.metadata().unwrap().len();
        let v = Verifier::new(meta.clone(), None);
        let mut seqs = Vec::new();
        let mut idx = crate::index::Index::default();
        scan(&mut LogReader::new(&f, len), &v, |ev| match ev {
            Event::Good { record, offset, len, .. } => {
                seqs.push(record.header().seq);
                assert!(
                    matches!(idx.place(&record), Ok(crate::index::Placement::Extends)),
                    "seq {}",
                    record.header().seq
                );
                idx.push(&record, crate::index::Loc { offset, len });
            }
            _ => panic!("every frame verifies"),
        })
        .unwrap();
        assert_eq!(seqs, vec![0, 1, 2]);
    }
}

//! [`DirStore`]: a [`BlockStore`] in a directory: every record appended to one log file,
//! `records.log`, in frames that carry the record's hash and a CRC, with an in-memory map from
//! hash to frame built by scanning the log on open; [`BlockStore::sync`] makes every frame
//! appended since the last sync durable with one `fdatasync` (CapsuleDB calls it before and
//! after each index record, so an index is durable only after its blocks). And the `NEWEST`
//! pointer to the newest index record, which [`crate::CapsuleDb::open`] restarts from.
//!
//! Frame (integers little-endian):
//!
//! ```text
//! "PSLB" (4) ‖ len u32 ‖ record hash (32) ‖ crc32 u32 over (len ‖ hash ‖ bytes) ‖ bytes (len)
//! ```
//!
//! Opening scans the log and never changes it. A frame that does not check (a damaged byte, a
//! damaged length, or the tail of a write a crash tore) is left out of the map, and the scan
//! resumes at the next frame that checks: new frames are appended after whatever is there, so a
//! torn tail is simply skipped by later scans. A damaged record is thus only ever missing here
//! (CapsuleDB reads it from another store), never a reason to lose the records after it, and a
//! read-only open (`psl capsuledb get`) writes nothing. `get` checks the frame again, so damage
//! after open is also a miss.
//!
//! The store is untrusted like any other: whatever it returns is verified by
//! [`crate::CapsuleDb`] (hash against the index's pointer, signature or decryption). Several
//! directories (on different disks or machines) give the re-fetch from another copy.
//!
//! Why one log rather than a file per record: at 1,000,000 keys the tree writes about 28,000
//! block records, and creating, fsyncing and renaming a file for each cost more than all of
//! the tree's own work (`docs/protocol/capsuledb.md` §8).

use crate::db::BlockStore;
use crate::RecordHash;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const NEWEST: &str = "NEWEST";
/// The log's file name inside the store's directory.
pub const LOG: &str = "records.log";
const MAGIC: &[u8; 4] = b"PSLB";
const HEADER_LEN: usize = 4 + 4 + 32 + 4;
/// Largest record a frame may hold (CapsuleDB's blocks are at most 4 MiB, indexes a few MiB).
pub const RECORD_BYTES_MAX: usize = 64 << 20;

#[derive(Debug)]
struct Inner {
    /// Appends (opened with `O_APPEND`).
    file: File,
    /// hash -> (offset of the frame, record length).
    map: HashMap<RecordHash, (u64, u32)>,
    end: u64,
    /// Bytes of the log scanned into `map`. Another process (the running role, while
    /// `psl capsuledb get` reads the same directory) may append past it: a miss scans the new
    /// whole frames ([`DirStore::get`]), so a reader's view follows the writer's log.
    seen: u64,
    dirty: bool,
}

/// A [`BlockStore`] in a directory: an append-only log of CRC-framed records ([`LOG`]) and the
/// `NEWEST` pointer to the newest index record (see the module docs).
#[derive(Debug)]
pub struct DirStore {
    dir: PathBuf,
    /// For positioned reads, without the append lock.
    reader: File,
    inner: Mutex<Inner>,
    /// What the scan at open left out: frames that did not check, and their bytes.
    damaged_frames: usize,
    skipped_bytes: u64,
}

fn crc(len: u32, hash: &RecordHash, bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(hash);
    h.update(bytes);
    h.finalize()
}

/// The frame of a record. The record must be within [`RECORD_BYTES_MAX`] (`put` refuses
/// larger ones first): a longer one could not be read back.
fn frame(hash: &RecordHash, bytes: &[u8]) -> Vec<u8> {
    assert!(bytes.len() <= RECORD_BYTES_MAX, "a frame's record is checked against RECORD_BYTES_MAX first");
    let len = bytes.len() as u32;
    let mut f = Vec::with_capacity(HEADER_LEN + bytes.len());
    f.extend_from_slice(MAGIC);
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(hash);
    f.extend_from_slice(&crc(len, hash, bytes).to_le_bytes());
    f.extend_from_slice(bytes);
    assert_eq!(f.len(), HEADER_LEN + bytes.len(), "frame length");
    // What the scan and `get` check on the way back (the CRC again: debug builds only).
    debug_assert_eq!(check_frame(&f, 0), Some((*hash, len)), "a frame must check as it is written");
    f
}

/// Checks the frame read back for record `hash` at `at` (`f` holds the header and the `len`
/// bytes the map expects): magic, length field, CRC and hash, each named when it fails.
fn check_read(f: &[u8], at: u64, hash: &RecordHash, len: u32) -> std::io::Result<()> {
    let bad = |what: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("capsuledb store: frame at offset {at} for record {}: {what}", hex(hash)),
        ))
    };
    if f.len() != HEADER_LEN + len as usize {
        return bad(format!("read {} bytes, expected {}", f.len(), HEADER_LEN + len as usize));
    }
    if &f[..4] != MAGIC {
        return bad("bad magic".into());
    }
    let mut w = [0u8; 4];
    w.copy_from_slice(&f[4..8]);
    let got = u32::from_le_bytes(w);
    if got != len {
        return bad(format!("length field {got}, the scan found {len}"));
    }
    match check_frame(f, 0) {
        None => bad("CRC mismatch".into()),
        Some((h, _)) if h != *hash => bad(format!("holds record {}", hex(&h))),
        Some(_) => Ok(()),
    }
}

/// The frame at `at` of `log`, if it is whole and checks: (hash, record length).
fn check_frame(log: &[u8], at: usize) -> Option<(RecordHash, u32)> {
    let h = log.get(at..at.checked_add(HEADER_LEN)?)?;
    if &h[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(h[4..8].try_into().ok()?);
    if len as usize > RECORD_BYTES_MAX {
        return None;
    }
    let hash: RecordHash = h[8..40].try_into().ok()?;
    let want = u32::from_le_bytes(h[40..44].try_into().ok()?);
    let start = at + HEADER_LEN;
    let bytes = log.get(start..start.checked_add(len as usize)?)?;
    (crc(len, &hash, bytes) == want).then_some((hash, len))
}

/// What a scan of a whole log found.
struct Scan {
    map: HashMap<RecordHash, (u64, u32)>,
    /// Bytes in no good frame (damage, torn tails).
    skipped_bytes: usize,
    damaged_frames: usize,
    /// Of those, the bytes after the last good frame (a torn tail: a crash during an append,
    /// or the frame a running writer is in the middle of).
    tail_bytes: usize,
}

fn scan(log: &[u8]) -> Scan {
    let mut map = HashMap::new();
    let (mut at, mut skipped_bytes, mut damaged_frames, mut tail_bytes) = (0usize, 0usize, 0usize, 0usize);
    while at < log.len() {
        if let Some((hash, len)) = check_frame(log, at) {
            // The newest copy of a record wins (a record is re-put after a bad copy).
            map.insert(hash, (at as u64, len));
            at += HEADER_LEN + len as usize;
            continue;
        }
        // Damage: resume at the next frame that checks, if any.
        damaged_frames += 1;
        let next = (at + 1..log.len().saturating_sub(HEADER_LEN - 1))
            .find(|&i| log[i..i + 4] == *MAGIC && check_frame(log, i).is_some())
            .unwrap_or(log.len());
        skipped_bytes += next - at;
        if next == log.len() {
            tail_bytes = next - at;
        }
        at = next;
    }
    Scan { map, skipped_bytes, damaged_frames, tail_bytes }
}

/// What a scan of a log's bytes finds: (records held, frames left out, bytes left out). The
/// same scan as [`DirStore::open`] (fuzzed: `fuzz/fuzz_targets/capsuledb_store.rs`).
pub fn scan_log(log: &[u8]) -> (usize, usize, usize) {
    let s = scan(log);
    (s.map.len(), s.damaged_frames, s.skipped_bytes)
}

impl DirStore {
    /// Opens (creating if needed) the store in `dir`: scans its log and leaves frames that do
    /// not check out (the log is not changed).
    pub fn open(dir: &Path) -> std::io::Result<Arc<DirStore>> {
        fs::create_dir_all(dir)?;
        let path = dir.join(LOG);
        let ctx = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("capsuledb store: {what} {}: {e}", path.display()))
        };
        let created = !path.exists();
        let mut file =
            OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(|e| ctx("opening", e))?;
        let mut log = Vec::new();
        file.read_to_end(&mut log).map_err(|e| ctx("reading", e))?;
        let s = scan(&log);
        let in_middle = s.damaged_frames - usize::from(s.tail_bytes > 0);
        if in_middle > 0 {
            tracing::warn!(
                dir = %dir.display(),
                frames = in_middle,
                bytes = s.skipped_bytes - s.tail_bytes,
                "capsuledb store: damaged frames left out"
            );
        }
        if s.tail_bytes > 0 {
            // Not damage: nothing in it was ever recorded as an index's block (indexes follow
            // their blocks' sync), and a running role may be writing it right now.
            tracing::info!(
                dir = %dir.display(),
                bytes = s.tail_bytes,
                "capsuledb store: a torn tail (a crash during an append, or a frame being written) left out"
            );
        }
        if created {
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| ctx("syncing the directory of", e))?;
        }
        let reader = File::open(&path).map_err(|e| ctx("opening", e))?;
        Ok(Arc::new(DirStore {
            dir: dir.to_path_buf(),
            reader,
            inner: Mutex::new(Inner {
                file,
                map: s.map,
                end: log.len() as u64,
                seen: (log.len() - s.tail_bytes) as u64,
                dirty: false,
            }),
            damaged_frames: s.damaged_frames,
            skipped_bytes: s.skipped_bytes as u64,
        }))
    }

    fn write_atomic(&self, name: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = name.with_extension("tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, name)
    }

    /// Records the newest index (after its record is stored).
    pub fn set_newest(&self, hash: &RecordHash) -> std::io::Result<()> {
        let text = hex(hash);
        assert_eq!(text.len(), 64, "NEWEST holds 64 hex digits");
        debug_assert_eq!(parse_hex(&text), Some(*hash), "NEWEST must parse back to the hash written");
        self.write_atomic(&self.dir.join(NEWEST), text.as_bytes())?;
        File::open(&self.dir)?.sync_all()
    }

    /// The newest index, if one was recorded. A garbled pointer is an error, not `None`.
    pub fn newest(&self) -> std::io::Result<Option<RecordHash>> {
        let text = match fs::read_to_string(self.dir.join(NEWEST)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        parse_hex(text.trim()).map(Some).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a 64-digit hex hash", self.dir.join(NEWEST).display()),
            )
        })
    }

    /// The log file (tests alter it).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    /// Where record `hash`'s bytes sit in the log: (offset, length), if held.
    pub fn locate(&self, hash: &RecordHash) -> Option<(u64, usize)> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.map.get(hash).map(|&(at, len)| (at + HEADER_LEN as u64, len as usize))
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the scan at open left out: (frames that did not check, their bytes).
    pub fn open_report(&self) -> (usize, u64) {
        (self.damaged_frames, self.skipped_bytes)
    }

    /// Adds the whole frames appended past what was scanned (by another process) to the map;
    /// bytes after the last whole frame (a frame being written) are read again next time.
    fn catch_up(&self, g: &mut Inner) {
        let Ok(len) = self.reader.metadata().map(|m| m.len()) else { return };
        if len <= g.seen {
            return;
        }
        let mut tail = vec![0u8; (len - g.seen) as usize];
        if self.reader.read_exact_at(&mut tail, g.seen).is_err() {
            return;
        }
        // The same scan as at open; a torn tail (a frame being written) is read again next time.
        let sc = scan(&tail);
        for (hash, (at, n)) in sc.map {
            g.map.insert(hash, (g.seen + at, n));
        }
        let at = tail.len() - sc.tail_bytes;
        if at > 0 {
            tracing::debug!(dir = %self.dir.display(), bytes = at, "capsuledb store: read frames appended by another process");
        }
        g.seen += at as u64;
    }
}

impl BlockStore for DirStore {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        if bytes.len() > RECORD_BYTES_MAX {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("capsuledb store: a record of {} bytes is over the limit of {RECORD_BYTES_MAX}", bytes.len()),
            ));
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.map.contains_key(&hash) {
            // Already framed (the role keeps each data record once, even when its node
            // re-applies a chain after a restart).
            return Ok(());
        }
        // `frame` asserts the header matches the bytes (length, CRC, hash) before the append.
        let f = frame(&hash, &bytes);
        let at = g.end;
        if let Err(e) = g.file.write_all(&f) {
            // A partial frame may be on disk (later scans skip it); `end` must follow the
            // file, so re-read its length.
            g.end = g.file.metadata().map(|m| m.len()).unwrap_or(at);
            return Err(std::io::Error::new(
                e.kind(),
                format!("capsuledb store: appending to {}: {e}", self.dir.join(LOG).display()),
            ));
        }
        g.end = at + f.len() as u64;
        if g.seen == at {
            g.seen = g.end;
        }
        g.map.insert(hash, (at, bytes.len() as u32));
        g.dirty = true;
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !g.dirty {
            return Ok(());
        }
        g.file.sync_data().map_err(|e| {
            std::io::Error::new(e.kind(), format!("capsuledb store: syncing {}: {e}", self.dir.join(LOG).display()))
        })?;
        g.dirty = false;
        Ok(())
    }

    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        let (at, len) = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match g.map.get(hash) {
                Some(x) => *x,
                None => {
                    self.catch_up(&mut g);
                    *g.map.get(hash)?
                }
            }
        };
        let mut f = vec![0u8; HEADER_LEN + len as usize];
        self.reader.read_exact_at(&mut f, at).ok()?;
        // The frame is checked again: damage since open is a miss, not bytes to verify.
        if let Err(e) = check_read(&f, at, hash, len) {
            tracing::warn!(dir = %self.dir.display(), "{e}; a miss (another store may hold the record)");
            return None;
        }
        f.drain(..HEADER_LEN);
        Some(f)
    }
}

fn hex(h: &RecordHash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits.
pub fn parse_hex(s: &str) -> Option<RecordHash> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u8, len: usize) -> (RecordHash, Vec<u8>) {
        let mut h = [0u8; 32];
        h[0] = i;
        h[31] = 0xA5;
        (h, (0..len).map(|j| (j as u8).wrapping_mul(31).wrapping_add(i)).collect())
    }

    fn put_all(s: &DirStore, recs: &[(RecordHash, Vec<u8>)]) {
        for (h, b) in recs {
            s.put(*h, b.clone()).unwrap();
        }
        s.sync().unwrap();
    }

    #[test]
    fn records_survive_reopen_and_newest_pointer_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let recs: Vec<_> = (0..20).map(|i| rec(i, 100 + 37 * i as usize)).collect();
        {
            let s = DirStore::open(d.path()).unwrap();
            put_all(&s, &recs);
            s.set_newest(&recs[7].0).unwrap();
            assert_eq!(s.get(&recs[3].0).as_deref(), Some(&recs[3].1[..]));
        }
        let s = DirStore::open(d.path()).unwrap();
        assert_eq!(s.open_report(), (0, 0));
        assert_eq!(s.len(), 20);
        for (h, b) in &recs {
            assert_eq!(s.get(h).as_deref(), Some(&b[..]));
        }
        assert_eq!(s.newest().unwrap(), Some(recs[7].0));
        assert_eq!(s.get(&rec(99, 1).0), None);
    }

    #[test]
    fn a_torn_tail_is_skipped_and_frames_appended_after_it_are_read() {
        let d = tempfile::tempdir().unwrap();
        let recs: Vec<_> = (0..5).map(|i| rec(i, 300)).collect();
        let full = {
            let s = DirStore::open(d.path()).unwrap();
            put_all(&s, &recs);
            fs::metadata(s.log_path()).unwrap().len()
        };
        // Tear the last frame at every length short of whole.
        let last = (HEADER_LEN + 300) as u64;
        for cut in [1, HEADER_LEN as u64 - 1, HEADER_LEN as u64, last - 1] {
            let d2 = tempfile::tempdir().unwrap();
            fs::copy(d.path().join(LOG), d2.path().join(LOG)).unwrap();
            let f = OpenOptions::new().write(true).open(d2.path().join(LOG)).unwrap();
            f.set_len(full - last + cut).unwrap();
            drop(f);
            let s = DirStore::open(d2.path()).unwrap();
            assert_eq!(s.open_report(), (1, cut), "cut {cut}");
            assert_eq!(s.len(), 4);
            assert_eq!(s.get(&recs[4].0), None);
            s.put(recs[4].0, recs[4].1.clone()).unwrap();
            s.sync().unwrap();
            drop(s);
            let s = DirStore::open(d2.path()).unwrap();
            assert_eq!(s.open_report(), (1, cut), "the torn bytes stay, skipped");
            for (h, b) in &recs {
                assert_eq!(s.get(h).as_deref(), Some(&b[..]), "cut {cut}");
            }
        }
    }

    #[test]
    fn a_reader_follows_frames_another_process_appends_after_its_open() {
        let d = tempfile::tempdir().unwrap();
        let recs: Vec<_> = (0..6).map(|i| rec(i, 250)).collect();
        let writer = DirStore::open(d.path()).unwrap();
        put_all(&writer, &recs[..2]);
        // A reader (`psl capsuledb get` on a running role's directory) opens mid-stream: the
        // writer is half way through a frame.
        let f = frame(&recs[2].0, &recs[2].1);
        let mut raw = OpenOptions::new().append(true).open(writer.log_path()).unwrap();
        raw.write_all(&f[..HEADER_LEN + 10]).unwrap();
        let reader = DirStore::open(d.path()).unwrap();
        assert_eq!(reader.len(), 2);
        assert_eq!(reader.get(&recs[2].0), None, "a half-written frame is not served");
        raw.write_all(&f[HEADER_LEN + 10..]).unwrap();
        drop(raw);
        // The writer goes on (its own view knows nothing of the frame written by hand above;
        // the reader must find the writer's frames wherever they landed).
        for (h, b) in &recs[3..] {
            writer.put(*h, b.clone()).unwrap();
        }
        writer.sync().unwrap();
        for (h, b) in &recs {
            assert_eq!(reader.get(h).as_deref(), Some(&b[..]), "the reader finds frames appended after its open");
        }
        assert_eq!(reader.get(&rec(77, 1).0), None);
    }

    #[test]
    fn damage_in_the_middle_loses_only_the_damaged_records() {
        let d = tempfile::tempdir().unwrap();
        let recs: Vec<_> = (0..6).map(|i| rec(i, 200)).collect();
        let s = DirStore::open(d.path()).unwrap();
        put_all(&s, &recs);
        let frame_len = HEADER_LEN + 200;
        let mut log = fs::read(s.log_path()).unwrap();
        // Record 1: a body byte. Record 3: its length field (the scan must find record 4).
        log[frame_len + HEADER_LEN + 50] ^= 0x40;
        log[3 * frame_len + 5] ^= 0x7F;
        fs::write(s.log_path(), &log).unwrap();
        // Damage after open is a miss at read time.
        assert_eq!(s.get(&recs[1].0), None);
        assert_eq!(s.get(&recs[0].0).as_deref(), Some(&recs[0].1[..]));
        drop(s);
        let s = DirStore::open(d.path()).unwrap();
        assert_eq!(s.open_report(), (2, 2 * frame_len as u64));
        for (i, (h, b)) in recs.iter().enumerate() {
            let want = if i == 1 || i == 3 { None } else { Some(&b[..]) };
            assert_eq!(s.get(h).as_deref(), want, "record {i}");
        }
        // A re-put of a damaged record is served from its new frame.
        s.put(recs[3].0, recs[3].1.clone()).unwrap();
        s.sync().unwrap();
        drop(s);
        let s = DirStore::open(d.path()).unwrap();
        assert_eq!(s.get(&recs[3].0).as_deref(), Some(&recs[3].1[..]));
    }

    #[test]
    fn a_frame_read_back_is_checked_field_by_field() {
        let (h, b) = rec(3, 64);
        let good = frame(&h, &b);
        check_read(&good, 0, &h, 64).unwrap();
        let refused = |f: &[u8], hash: &RecordHash, len: u32, what: &str| {
            let e = check_read(f, 4096, hash, len).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
            let msg = e.to_string();
            assert!(msg.contains(what) && msg.contains("offset 4096"), "{what}: {msg}");
        };
        refused(&good[..good.len() - 1], &h, 64, "read 107 bytes");
        let mut magic = good.clone();
        magic[0] ^= 1;
        refused(&magic, &h, 64, "bad magic");
        // A length field that changed after the scan (shorter: its CRC may even check).
        let short = frame(&h, &b[..10]);
        let mut padded = short.clone();
        padded.resize(good.len(), 0);
        refused(&padded, &h, 64, "length field 10");
        let mut body = good.clone();
        body[HEADER_LEN + 5] ^= 0x10;
        refused(&body, &h, 64, "CRC mismatch");
        let (other, _) = rec(4, 64);
        refused(&good, &other, 64, "holds record");
    }

    #[test]
    #[should_panic(expected = "RECORD_BYTES_MAX")]
    fn framing_a_record_over_the_limit_is_a_bug() {
        let _ = frame(&[0; 32], &vec![0; RECORD_BYTES_MAX + 1]);
    }

    #[test]
    fn garbage_logs_never_panic_the_scan() {
        let mut seed = 0x1234_5678u64;
        for n in 0..200usize {
            let len = (n * 37) % 700;
            let log: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    if seed.is_multiple_of(5) {
                        MAGIC[(seed as usize / 5) % 4]
                    } else {
                        seed as u8
                    }
                })
                .collect();
            let s = scan(&log);
            assert!(s.skipped_bytes <= log.len());
            assert!(s.map.values().all(|&(at, len)| at as usize + HEADER_LEN + len as usize <= log.len()));
        }
    }
}

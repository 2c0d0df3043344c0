//! `psl bench replication --cases big-store`: one capsule server holding many records, and its
//! reads from a cold index (issue 35's goal: a server of 10 million records stays under
//! 256 MiB of resident memory, its index spilled or mapped from disk behind a bounded cache).
//!
//! Two stores, each measured the same way: the big one (`--records`, default 10,000,000) and
//! the baseline in the same run, a small one ([`SMALL_RECORDS`], or `--records` if fewer).
//!
//! 1. Build, offline: a capsule with derived writer keys (a server verifies its writers with
//!    the capsule's public key alone, no certificate), [`WRITERS`] writers, each record one put
//!    of a 16-byte key and a 32-byte value. One thread per core seals and signs (an `Author`
//!    per writer, each writer's records in seq order, writers independent) and verifies (a
//!    store takes only verified records); this thread appends them to a `psl_store::DiskStore`
//!    in batches of [`BATCH`] (one fsync each), in the directory a capsule server then opens
//!    as its store (`--dir`). Progress (records/s) goes to stderr.
//! 2. Open: a real `psl capsule-server --n 1` process on that directory, with a `psl router` as
//!    its fabric (nothing else on it). `open_s`: from its spawn until its read listener
//!    answers `HEADS` with every writer's newest record (which checks that it took them all).
//! 3. Measure: its `VmRSS` and `VmHWM` (`/proc/PID/status`) [`SETTLE`] after the open; then a
//!    read phase of `--seconds` × 10 (default 10 s) from [`READERS`] connections on the read
//!    protocol, each read a random record that was written, alternately `GET <hash>` (hashes
//!    sampled over the whole store) and `RANGE <writer> <seq> <seq>` (any seq), each answer
//!    checked to be the record asked for (signatures are the server's business: it verifies
//!    on open and on every read); then `VmRSS` and `VmHWM` again.
//!
//! "Cold index": no record was read since the server started. The open itself reads the whole
//! log, so the OS page cache may still hold the log and any index files; `--drop-caches` (as
//! root) drops it (`echo 1 > /proc/sys/vm/drop_caches`, after a `sync`) just before each read
//! phase, and the output says which it was (`page_cache`).
//!
//! Headline: `rss_mib_big` (the big server's `VmHWM` after the reads: its peak over open and
//! reads), `goal_rss_mib` (256) and `met`; `ratio_reads_cold` (reads per second, big over
//! small); `rss_mib_small`, `rss_bytes_per_record` (what each record beyond the baseline's
//! added to `VmRSS` after the open), `records`, `build_s`, `open_s`, `log_bytes`.

use super::cluster::ChildGuard;
use anyhow::{bail, Context, Result};
use psl_capsule::{new_capsule, Author, Limits, Record, SignedMetadata, Verified, Verifier};
use psl_crypto::{Hash256, OwnerKey};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The big store's records unless `--records` is given.
pub const RECORDS_DEFAULT: u64 = 10_000_000;
/// The baseline store's records.
pub const SMALL_RECORDS: u64 = 100_000;
/// The goal: the big server's peak resident memory.
const GOAL_RSS_MIB: f64 = 256.0;
/// Writers of each store (writer indexes 1 ..= WRITERS).
const WRITERS: u32 = 8;
/// Records per `DiskStore::append` (one fsync each).
const BATCH: usize = 4096;
const KEY_BYTES: usize = 16;
const VALUE_BYTES: usize = 32;
/// Most (writer, seq, hash) samples kept per store for `GET` reads, spread evenly over it.
const SAMPLES_MAX: u64 = 1 << 20;
/// Read connections during the read phase.
const READERS: usize = 4;
/// From the open until the first memory reading.
const SETTLE: Duration = Duration::from_secs(3);
/// The server's id (writer `psl_capsule::server_writer(0)`), in a deployment of one.
const SERVER_ID: u32 = 0;

/// `psl bench replication --cases big-store`: see the module documentation.
pub fn run(records: u64, read_s: f64, drop_caches: bool, show_progress: bool) -> Result<Value> {
    if records == 0 {
        bail!("--records must be at least 1");
    }
    let read = Duration::from_secs_f64(read_s.max(0.5));
    let small_n = SMALL_RECORDS.min(records);
    if drop_caches {
        // Fail now, not after a build of many minutes (opening the file drops nothing).
        drop_caches_file().context("--drop-caches")?;
    }
    let dir = tempfile::Builder::new().prefix("psl-bench-big-store").tempdir()?;
    let owner = OwnerKey::generate();
    let meta = new_capsule(&owner, 1, "bench-big-store", psl::util::now_ms(), Limits::default())?;
    let (capsule, owner_file) = (dir.path().join("c.capsule"), dir.path().join("owner.key"));
    psl::util::write_atomic(&capsule, &psl_capsule::file::encode(&meta, []), 0o644)?;
    psl::util::write_atomic(&owner_file, owner.to_file_string().as_bytes(), 0o600)?;

    let small = build(&owner, &meta, &dir.path().join("small"), small_n, show_progress)?;
    let big = build(&owner, &meta, &dir.path().join("big"), records, show_progress)?;
    drop(owner);

    let (_router, router) = start_router()?;
    let files = ServerFiles { capsule, owner: owner_file, router };
    let ms = measure(&files, &meta, &small, read, drop_caches)?;
    let mb = measure(&files, &meta, &big, read, drop_caches)?;

    let rss_mib_big = mb.hwm_reads_kib as f64 / 1024.0;
    let per_record = if records > small_n {
        (mb.rss_open_kib as f64 - ms.rss_open_kib as f64) * 1024.0 / (records - small_n) as f64
    } else {
        f64::NAN
    };
    Ok(json!({
        "bench": "replication",
        "case": "big-store",
        "records": records,
        "records_small": small_n,
        "build_s": round2(big.build_s),
        "open_s": round2(mb.open_s),
        "log_bytes": big.log_bytes,
        "store_bytes": big.store_bytes(),
        "rss_mib_big": round2(rss_mib_big),
        "rss_mib_small": round2(ms.hwm_reads_kib as f64 / 1024.0),
        "goal_rss_mib": GOAL_RSS_MIB,
        "met": rss_mib_big < GOAL_RSS_MIB,
        "rss_bytes_per_record": round2(per_record),
        "reads_per_s_cold_big": round2(mb.reads_per_s),
        "reads_per_s_cold_small": round2(ms.reads_per_s),
        "ratio_reads_cold": mb.reads_per_s / ms.reads_per_s.max(1e-9),
        "page_cache": if drop_caches {
            "dropped (sync; echo 1 > /proc/sys/vm/drop_caches) before each read phase"
        } else {
            "not dropped: the OS page cache may hold the log and index files (the open read them); --drop-caches drops it"
        },
        "detail": {"big": detail(&big, &mb), "small": detail(&small, &ms)},
        "load": {"writers": WRITERS, "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES, "batch_records": BATCH,
                 "read_connections": READERS, "read_s": read.as_secs_f64(), "settle_s": SETTLE.as_secs_f64(),
                 "reads": "random records written: half GET <hash> (sampled over the store), half RANGE <writer> <seq> <seq>"},
        "machine": super::machine(),
    }))
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn detail(b: &Built, m: &Measured) -> Value {
    let mib = |kib: u64| round2(kib as f64 / 1024.0);
    json!({
        "records": b.records,
        "build_s": round2(b.build_s),
        "build_records_per_s": round2(b.records as f64 / b.build_s.max(1e-9)),
        "log_bytes": b.log_bytes,
        "store_bytes": b.store_bytes(),
        "open_s": round2(m.open_s),
        "vm_rss_mib_open": mib(m.rss_open_kib),
        "vm_hwm_mib_open": mib(m.hwm_open_kib),
        "vm_rss_mib_reads": mib(m.rss_reads_kib),
        "vm_hwm_mib_reads": mib(m.hwm_reads_kib),
        "reads": m.gets + m.ranges,
        "gets": m.gets,
        "ranges": m.ranges,
        "reads_per_s": round2(m.reads_per_s),
        "read_us_p50": m.us_p50,
        "read_us_p99": m.us_p99,
        "read_seconds": round2(m.read_s),
    })
}

// ---------------------------------------------------------------------------------------------
// Building a store

/// A store built on disk, and what reads need to know about it.
struct Built {
    dir: PathBuf,
    records: u64,
    build_s: f64,
    log_bytes: u64,
    /// Each writer's records (writer `i + 1` has `per_writer[i]`).
    per_writer: Vec<u64>,
    /// `(writer, seq, hash)` of records spread evenly over the store.
    samples: Vec<(u32, u64, Hash256)>,
}

impl Built {
    /// Bytes of every file in the store's directory (the log, and any index files).
    fn store_bytes(&self) -> u64 {
        dir_bytes(&self.dir)
    }
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Each writer's share of `records` (the first ones take the remainder).
fn split(records: u64, writers: u32) -> Vec<u64> {
    let w = u64::from(writers);
    (0..w).map(|i| records / w + u64::from(i < records % w)).collect()
}

/// Writer `writer`'s record `seq`: its key, 16 bytes.
fn key_of(writer: u32, seq: u64) -> [u8; KEY_BYTES] {
    let mut k = [0u8; KEY_BYTES];
    k[..4].copy_from_slice(b"big/");
    k[4..8].copy_from_slice(&writer.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// What a signing thread sends: one writer's next records, in seq order.
type Batch = Result<Vec<Verified<Record>>>;

/// Writes `records` records into a new store in `dir` (see the module documentation).
fn build(owner: &OwnerKey, meta: &SignedMetadata, dir: &Path, records: u64, show_progress: bool) -> Result<Built> {
    let t0 = Instant::now();
    let app = owner.app(meta.meta.app_index)?;
    let per_writer = split(records, WRITERS);
    let stride = records.div_ceil(SAMPLES_MAX).max(1);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(WRITERS as usize);
    // Writer w goes to thread w % threads; each thread takes a batch of each of its writers in turn.
    let mut jobs: Vec<Vec<(Author, u64)>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, n) in per_writer.iter().enumerate() {
        let w = i as u32 + 1;
        jobs[i % threads].push((Author::new(meta, &app, w)?, *n));
    }
    drop(app);
    let mut store = psl_store::DiskStore::create(dir, meta.clone(), None)
        .with_context(|| format!("creating a store in {}", dir.display()))?;
    let (tx, rx) = mpsc::sync_channel::<Batch>(threads * 2);
    let mut handles = Vec::new();
    for (t, writers) in jobs.into_iter().enumerate() {
        let (tx, meta) = (tx.clone(), meta.clone());
        let h = std::thread::Builder::new()
            .name(format!("big-store-sign-{t}"))
            .spawn(move || sign(writers, &meta, stride, &tx))
            .context("starting a signing thread")?;
        handles.push(h);
    }
    drop(tx);
    let what = format!("big-store: building {records}");
    let pb = if show_progress { super::progress(records, &what) } else { indicatif::ProgressBar::hidden() };
    let (mut done, mut last_line, mut log_bytes) = (0u64, Instant::now(), 0u64);
    for batch in rx {
        let batch = batch?;
        let out = store.append(&batch).with_context(|| format!("appending to {}", dir.display()))?;
        if out.appended != batch.len() {
            bail!("the store took {} of a batch of {} records", out.appended, batch.len());
        }
        done += batch.len() as u64;
        log_bytes += out.bytes;
        pb.set_position(done);
        let rate = done as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        if !pb.is_hidden() {
            pb.set_message(format!("big-store: {rate:.0} records/s"));
        } else if last_line.elapsed() >= Duration::from_secs(10) {
            last_line = Instant::now();
            eprintln!("big-store: built {done} of {records} records ({rate:.0} records/s)");
        }
    }
    pb.finish_and_clear();
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.join().map_err(|_| anyhow::anyhow!("a signing thread panicked"))??);
    }
    if done != records || store.len() as u64 != records {
        bail!("built {done} records ({} in the store) of {records}", store.len());
    }
    let log_bytes = log_bytes.max(store.log_bytes());
    drop(store);
    let build_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "big-store: {records} records built in {build_s:.1} s ({:.0} records/s, {} MiB of log)",
        records as f64 / build_s.max(1e-9),
        log_bytes >> 20
    );
    Ok(Built { dir: dir.to_path_buf(), records, build_s, log_bytes, per_writer, samples })
}

/// A signing thread: seals, signs and verifies its writers' records, [`BATCH`] at a time,
/// each writer in turn; returns its samples (every `stride`-th seq of each writer).
fn sign(
    mut writers: Vec<(Author, u64)>,
    meta: &SignedMetadata,
    stride: u64,
    tx: &mpsc::SyncSender<Batch>,
) -> Result<Vec<(u32, u64, Hash256)>> {
    let verifier = Verifier::new(meta.clone(), None);
    let value = [0x5au8; VALUE_BYTES];
    let mut samples = Vec::new();
    let mut seqs = vec![0u64; writers.len()];
    loop {
        let mut any = false;
        for (i, (author, n)) in writers.iter_mut().enumerate() {
            let seq = &mut seqs[i];
            if *seq >= *n {
                continue;
            }
            any = true;
            let end = (*seq + BATCH as u64).min(*n);
            let mut batch = Vec::with_capacity((end - *seq) as usize);
            let w = author.writer();
            while *seq < end {
                let put = author.write_ops([(key_of(w, *seq).to_vec(), Some(value.to_vec()))]);
                let rec = match put.context("sealing a record").and_then(|r| {
                    verifier.verify(r).map_err(|e| anyhow::anyhow!("a record the bench sealed does not verify: {e}"))
                }) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::anyhow!("{e:#}")));
                        return Err(e);
                    }
                };
                if seq.is_multiple_of(stride) {
                    samples.push((w, *seq, rec.hash()));
                }
                batch.push(rec);
                *seq += 1;
            }
            if tx.send(Ok(batch)).is_err() {
                // The appender gave up (and says why).
                return Ok(samples);
            }
        }
        if !any {
            return Ok(samples);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A server on the store, and reads from it

/// What a capsule server process is started with.
struct ServerFiles {
    capsule: PathBuf,
    owner: PathBuf,
    router: SocketAddr,
}

/// What one store's server showed.
struct Measured {
    open_s: f64,
    rss_open_kib: u64,
    hwm_open_kib: u64,
    rss_reads_kib: u64,
    hwm_reads_kib: u64,
    gets: u64,
    ranges: u64,
    read_s: f64,
    reads_per_s: f64,
    us_p50: u64,
    us_p99: u64,
}

/// `psl router` on a free port (the servers' fabric); stopped when the guard drops.
fn start_router() -> Result<(ChildGuard, SocketAddr)> {
    let exe = psl::util::sibling_exe("psl")?;
    let mut cmd = Command::new(exe);
    cmd.args(["router", "--listen", "127.0.0.1:0", "--stats-every", "0"]).stdout(Stdio::piped()).stderr(Stdio::null());
    psl::kids::die_with_parent(&mut cmd, libc::SIGKILL);
    let mut child = cmd.spawn().context("starting psl router")?;
    let read = super::fabric::router_addr(&mut child);
    let guard = ChildGuard::new(child, None);
    Ok((guard, read?))
}

/// The records count of a server's ready line (`ready WRITER records=N repaired=B`).
fn ready_records(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("ready ")?;
    rest.split_whitespace().find_map(|f| f.strip_prefix("records="))?.parse().ok()
}

/// How long a server may take to open a store of `records` records (it re-reads the log).
fn open_patience(records: u64) -> Duration {
    Duration::from_secs(120) + Duration::from_micros(200).saturating_mul(u32::try_from(records).unwrap_or(u32::MAX))
}

/// Starts a server on `b`'s store, measures it (see the module documentation) and stops it.
fn measure(f: &ServerFiles, meta: &SignedMetadata, b: &Built, read: Duration, drop_caches: bool) -> Result<Measured> {
    let log = b.dir.with_extension("server.log");
    let exe = psl::util::sibling_exe("psl")?;
    let mut cmd = Command::new(exe);
    cmd.arg("capsule-server")
        .arg("--capsule")
        .arg(&f.capsule)
        .arg("--owner")
        .arg(&f.owner)
        .arg("--router")
        .arg(f.router.to_string())
        .arg("--dir")
        .arg(&b.dir)
        .args(["--id", &SERVER_ID.to_string(), "--n", "1", "--f", "0", "--read", "127.0.0.1:0"])
        .env("PSL_LOG", std::env::var("PSL_LOG").unwrap_or_else(|_| "warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log)?));
    psl::kids::die_with_parent(&mut cmd, libc::SIGKILL);
    eprintln!("big-store: opening a capsule server on {} records", b.records);
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("starting psl capsule-server")?;
    let out = child.stdout.take().context("psl capsule-server's stdout")?;
    let pid = child.id();
    let server = ChildGuard::new(child, None);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let tail =
        || std::fs::read_to_string(&log).unwrap_or_default().lines().rev().take(8).collect::<Vec<_>>().join(" | ");
    let deadline = t0 + open_patience(b.records);
    let mut addr: Option<SocketAddr> = None;
    while addr.is_none() {
        let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).map_err(|_| {
            anyhow::anyhow!("the capsule server did not come up on {} records; its log: {}", b.records, tail())
        })?;
        if let Some(n) = ready_records(&line) {
            if n != b.records {
                bail!("the capsule server opened {n} records of {}; its log: {}", b.records, tail());
            }
        }
        addr = line.strip_prefix("reads ").and_then(|a| a.trim().parse().ok());
    }
    let addr = addr.context("no read address")?;
    // Serving: HEADS names every writer's newest record.
    let heads = psl_server::read::ReadClient::connect(addr).and_then(|mut c| c.heads())?;
    for (i, n) in b.per_writer.iter().enumerate().filter(|(_, n)| **n > 0) {
        let w = i as u32 + 1;
        if heads.get(&w).map(|h| h.0) != Some(n - 1) {
            bail!("the server's HEADS says writer {w} is at {:?}, not seq {}", heads.get(&w), n - 1);
        }
    }
    let open_s = t0.elapsed().as_secs_f64();
    std::thread::sleep(SETTLE);
    let (rss_open_kib, hwm_open_kib) = memory_kib(pid)?;
    if drop_caches {
        drop_page_cache()?;
    }
    eprintln!("big-store: {} records open in {open_s:.1} s; reading for {:.0} s", b.records, read.as_secs_f64());
    let limits = meta.meta.policy.limits;
    let t = Instant::now();
    let results: Vec<Result<Reads>> = std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..READERS).map(|i| s.spawn(move || reads(addr, b, &limits, t + read, 0x5eed + i as u64))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a reading thread panicked")))).collect()
    });
    let read_s = t.elapsed().as_secs_f64();
    let (rss_reads_kib, hwm_reads_kib) = memory_kib(pid)?;
    drop(server);
    let mut all = Reads::default();
    for r in results {
        let r = r?;
        all.gets += r.gets;
        all.ranges += r.ranges;
        all.us.extend(r.us);
    }
    all.us.sort_unstable();
    let at = |q: f64| all.us.get(((all.us.len() as f64 * q) as usize).min(all.us.len().saturating_sub(1))).copied();
    Ok(Measured {
        open_s,
        rss_open_kib,
        hwm_open_kib,
        rss_reads_kib,
        hwm_reads_kib,
        gets: all.gets,
        ranges: all.ranges,
        read_s,
        reads_per_s: (all.gets + all.ranges) as f64 / read_s.max(1e-9),
        us_p50: at(0.50).unwrap_or(0),
        us_p99: at(0.99).unwrap_or(0),
    })
}

/// `VmRSS` and `VmHWM` of process `pid`, KiB.
fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |k| psl_node::memory::kib_field(&s, k).with_context(|| format!("no {k} in /proc/{pid}/status"));
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// `/proc/sys/vm/drop_caches`, open for writing (root only, and a writable `/proc/sys`).
fn drop_caches_file() -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .context("opening /proc/sys/vm/drop_caches for writing (needs root, and a writable /proc/sys)")
}

/// Empties the OS page cache (clean pages only, so after a `sync`).
fn drop_page_cache() -> Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    drop_caches_file()?.write_all(b"1\n").context("writing 1 to /proc/sys/vm/drop_caches")
}

/// What one reading connection did.
#[derive(Default)]
struct Reads {
    gets: u64,
    ranges: u64,
    /// Each read's time, µs.
    us: Vec<u64>,
}

/// Random reads of `b`'s records on one connection until `until`; each answer must be the
/// record asked for.
fn reads(addr: SocketAddr, b: &Built, limits: &Limits, until: Instant, seed: u64) -> Result<Reads> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let writers: Vec<(u32, u64)> =
        b.per_writer.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (i as u32 + 1, *n)).collect();
    let mut out = Reads::default();
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let by_hash = i.is_multiple_of(2) && !b.samples.is_empty();
        let (req, writer, seq, hash) = if by_hash {
            let (w, seq, h) = b.samples[rng.random_range(0..b.samples.len())];
            (format!("GET {}\n", h.to_hex()), w, seq, Some(h))
        } else {
            let (w, n) = writers[rng.random_range(0..writers.len())];
            let seq = rng.random_range(0..n);
            (format!("RANGE {w} {seq} {seq}\n"), w, seq, None)
        };
        let t = Instant::now();
        w.write_all(req.as_bytes())?;
        let frames = match psl_server::read::read_answer(&mut r)? {
            Ok(f) => f,
            Err(msg) => bail!("{} answered an error: {msg}", req.trim()),
        };
        out.us.push(t.elapsed().as_micros() as u64);
        let [frame] = frames.as_slice() else {
            bail!("{} answered {} records, not 1", req.trim(), frames.len());
        };
        let rec = Record::decode(frame, limits).with_context(|| format!("the answer to {}", req.trim()))?;
        let h = rec.header();
        if h.writer != writer || h.seq != seq || hash.is_some_and(|x| x != rec.hash()) {
            bail!("{} answered writer {} seq {} (hash {})", req.trim(), h.writer, h.seq, rec.hash().to_hex());
        }
        if by_hash {
            out.gets += 1;
        } else {
            out.ranges += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_split_over_writers() {
        assert_eq!(split(10, 8), vec![2, 2, 1, 1, 1, 1, 1, 1]);
        assert_eq!(split(3, 8).iter().sum::<u64>(), 3);
        assert_eq!(split(10_000_000, WRITERS).iter().sum::<u64>(), 10_000_000);
    }

    #[test]
    fn keys_are_sixteen_bytes_and_distinct() {
        assert_eq!(key_of(1, 0).len(), KEY_BYTES);
        assert_ne!(key_of(1, 7), key_of(2, 7));
        assert_ne!(key_of(1, 7), key_of(1, 8));
    }

    #[test]
    fn ready_line_and_memory_fields() {
        assert_eq!(ready_records("ready 32768 records=123 repaired=false"), Some(123));
        assert_eq!(ready_records("reads 127.0.0.1:1"), None);
        let status = "Name:\tpsl\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(psl_node::memory::kib_field(status, "VmRSS:"), Some(102_400));
        assert_eq!(psl_node::memory::kib_field(status, "VmHWM:"), Some(204_800));
    }
}

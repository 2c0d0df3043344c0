//! The worker side of CapsuleDB reads: a get that the memtable cannot answer (the key was
//! evicted, or never seen) sends a sealed request over the fabric and waits for CapsuleDB's
//! signed answer; the dispatcher verifies answers and frontiers and feeds the memtable.
//!
//! Pending requests are kept by request id (random 64 bits) with their key in the engine's
//! table (`psl_scl::engine::asks::Asks`, at most `ASKS_MAX`): an answer is applied only for a
//! request of this node still pending for that exact key, so an old answer replayed by the
//! fabric changes nothing. Every waiter for a key is woken by the first good answer, whichever
//! request it names (the answer is then fresh for all of them). This module verifies and
//! wakes; the table decides.
//!
//! CapsuleDB's signature is not enough: every version an answer names must come with the
//! signed data record that wrote it, which this node checks with its own verifier (writer
//! signature, certificate, revocations, key generation) before anything reaches the memtable
//! or the clock; the value is taken from that record (`psl_scl::dbwire::RecordCheck`).

use parking_lot::{Condvar, Mutex};
use psl_capsule::CapsuleName;
use psl_crypto::{DataKey, VerifyingKey};
use psl_scl::dbwire::{
    DbAnswer, DbGet, DbHeads, DbMsg, DbRequest, DbScan, DbScanAnswer, RecordCheck, ScanQuery, Scanned,
};
use psl_scl::engine::asks::{Answer, Asks, AsksFull, ASKS_MAX};
use psl_scl::{LamportClock, Memtable};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of the miss path.
#[derive(Debug, Default)]
pub struct DbClientStats {
    /// Get and scan requests sent to CapsuleDB (re-sends included).
    pub requests: AtomicU64,
    /// Verified answers (gets and scans) accepted.
    pub answers: AtomicU64,
    /// Answers and heads messages refused (unknown request, bad signature, failed check).
    pub rejected: AtomicU64,
    /// Gets and scans that failed with [`crate::NodeError::CapsuleDbTimeout`].
    pub timeouts: AtomicU64,
    /// Signed heads (frontier) messages from CapsuleDB accepted.
    pub heads: AtomicU64,
}

pub(crate) use psl_scl::engine::asks::Answered;

pub(crate) struct DbClient {
    pub capsule: CapsuleName,
    pub signer: u32,
    /// Where CapsuleDB's signing key comes from: derived, or (a certified capsule) its
    /// certificate, which may arrive after this client starts.
    pub verifier: Arc<psl_capsule::Verifier>,
    pub data_key: DataKey,
    pub memtable: Arc<Memtable>,
    /// The node's Lamport clock: it observes every version an answer brings, before the
    /// memtable shows it, so that a later write of the key is newer than what was read.
    clock: Arc<LamportClock>,
    /// The gets waiting for CapsuleDB and their answers until taken (the engine's table).
    asks: Mutex<Asks>,
    /// Scans still waiting, and the answers (with the index they were read at) until taken.
    scans: Mutex<FxHashMap<u64, Option<(u64, Scanned)>>>,
    /// Bumped (and waiters woken) whenever an answer settles some key.
    settled: Mutex<u64>,
    wake: Condvar,
    pub stats: DbClientStats,
}

impl DbClient {
    pub fn new(
        capsule: CapsuleName,
        signer: u32,
        verifier: Arc<psl_capsule::Verifier>,
        data_key: DataKey,
        memtable: Arc<Memtable>,
        clock: Arc<LamportClock>,
    ) -> DbClient {
        DbClient {
            capsule,
            signer,
            verifier,
            data_key,
            memtable,
            clock,
            asks: Mutex::new(Asks::new()),
            scans: Mutex::new(FxHashMap::default()),
            settled: Mutex::new(0),
            wake: Condvar::new(),
            stats: DbClientStats::default(),
        }
    }

    /// CapsuleDB's public key, once known (a certified capsule learns it from a certificate).
    fn signer_key(&self) -> Option<VerifyingKey> {
        self.verifier.writer_key(self.signer).ok()
    }

    /// Registers a request for `key` and returns its wire bytes.
    pub fn request(&self, key: &[u8]) -> Result<(u64, Vec<u8>), AsksFull> {
        let req_id: u64 = rand::random();
        self.asks.lock().ask(req_id, key)?;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let g = DbGet::seal(self.capsule, req_id, key, &self.data_key, rand::random());
        Ok((req_id, DbMsg::Get(g).encode()))
    }

    /// Registers a scan and returns its wire bytes (at most `ASKS_MAX` scans wait at once).
    pub fn request_scan(&self, q: &ScanQuery) -> Result<(u64, Vec<u8>), AsksFull> {
        let req_id: u64 = rand::random();
        {
            let mut scans = self.scans.lock();
            if scans.len() >= ASKS_MAX {
                return Err(AsksFull);
            }
            scans.insert(req_id, None);
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let m = DbScan::seal(self.capsule, req_id, q, &self.data_key, rand::random());
        Ok((req_id, DbMsg::Scan(m).encode()))
    }

    /// The answer to scan `req_id` (its index sequence and body), once it came.
    pub fn take_scan(&self, req_id: u64) -> Option<(u64, Scanned)> {
        self.scans.lock().get_mut(&req_id).and_then(Option::take)
    }

    pub fn forget_scan(&self, req_id: u64) {
        self.scans.lock().remove(&req_id);
    }

    pub fn forget(&self, req_id: u64) {
        self.asks.lock().forget(req_id);
    }

    /// Whether request `req_id` is still waiting.
    pub fn is_pending(&self, req_id: u64) -> bool {
        self.asks.lock().is_pending(req_id)
    }

    /// The answer to `req_id`, once it came (taken once).
    pub fn take_answer(&self, req_id: u64) -> Option<Answered> {
        self.asks.lock().take(req_id)
    }

    /// Waits until something settles or `until`; returns false on timeout.
    pub fn wait(&self, seen: u64, until: std::time::Instant) -> bool {
        let mut s = self.settled.lock();
        while *s == seen {
            if self.wake.wait_until(&mut s, until).timed_out() {
                return *s != seen;
            }
        }
        true
    }

    pub fn settled(&self) -> u64 {
        *self.settled.lock()
    }

    /// Handles a CapsuleDB message from the fabric (dispatcher thread). Gets and scans are not
    /// ours to answer: returned for a CapsuleDB role to take.
    pub fn on_message(&self, m: DbMsg) -> Option<DbRequest> {
        match m {
            DbMsg::Get(g) => return Some(DbRequest::Get(g)),
            DbMsg::Scan(q) => return Some(DbRequest::Scan(q)),
            DbMsg::Answer(a) => self.on_answer(a),
            DbMsg::ScanAnswer(a) => self.on_scan_answer(a),
            DbMsg::Heads(h) => self.on_heads(h),
        }
        None
    }

    /// A scan's answer: kept for the waiter if it answers a scan of ours still waiting and
    /// verifies (signature, then the sealed body, then every entry against its record: one
    /// that fails refuses the page). The waiter checks it is fresh enough.
    fn on_scan_answer(&self, a: DbScanAnswer) {
        if a.capsule != self.capsule || a.signer != self.signer {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !self.scans.lock().get(&a.req_id).is_some_and(Option::is_none) {
            return;
        }
        let Some(key) = self.signer_key() else {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match a.verify_open(&key, &self.data_key).and_then(|b| b.check(&self.verifier, self.signer)) {
            Ok(body) => {
                // What a scan reads, a later write must supersede (Lamport: observed first).
                if let Some(l) = body.entries.iter().map(|(_, v, _)| v.lamport).max() {
                    self.clock.observe(l);
                }
                if let Some(slot) = self.scans.lock().get_mut(&a.req_id) {
                    *slot = Some((a.index_seq, body));
                }
                self.stats.answers.fetch_add(1, Ordering::Relaxed);
                *self.settled.lock() += 1;
                self.wake.notify_all();
            }
            Err(e) => {
                tracing::debug!("CapsuleDB scan answer rejected: {e}");
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn on_answer(&self, a: DbAnswer) {
        if a.capsule != self.capsule || a.signer != self.signer {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Cheap filter before the signature check: is any of its requests ours?
        if !self.asks.lock().any_pending(&a.req_ids) {
            return;
        }
        let Some(signer_key) = self.signer_key() else {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let body = match a.verify_open(&signer_key, &self.data_key) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!("CapsuleDB answer rejected: {e}");
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let mut any = false;
        // Each carried record is verified once, and only for keys this node asked for.
        let mut records = RecordCheck::new(&self.verifier, self.signer, &body.records);
        for e in &body.entries {
            let key = &e.key;
            // Checked against the records only for keys this node still waits for.
            if !self.asks.lock().wants(&a.req_ids, key) {
                continue;
            }
            let found = match &e.found {
                None => None,
                Some(p) => match records.check(key, p) {
                    Ok(x) => Some(x),
                    Err(err) => {
                        // Not proven by a record this node verifies: never used.
                        tracing::debug!("CapsuleDB answer entry refused: {err}");
                        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                },
            };
            let found = found.map(|(v, val)| (v, val.map(Arc::<[u8]>::from)));
            // The engine takes the answer in (`Asks::answer`): the clock passes its version
            // before the memtable can show it, so a write of this key after the read (a `cas`
            // at its home) gets a newer version. Without that, a node that learned a key from
            // CapsuleDB before applying the record that wrote it (its clock still below that
            // record's) wrote the key *below* what it had just read: the write was sealed but
            // never applied anywhere, and two `cas` on one unique were both answered STORED
            // (psl chaos seed 5, cas_stale). Every request of ours for the key is answered.
            match self.asks.lock().answer(&a.req_ids, key, found, a.index_seq, &self.memtable, &self.clock) {
                Answer::NotAsked => {}
                // Older than the frontier this node evicted under: the waiters ask again.
                Answer::Stale => {
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Answer::Settled(_) => {
                    any = true;
                    self.stats.answers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if !any {
            return;
        }
        *self.settled.lock() += 1;
        self.wake.notify_all();
    }

    fn on_heads(&self, h: DbHeads) {
        let verified = self.signer_key().is_some_and(|k| h.verify(&k).is_ok());
        if h.capsule != self.capsule || h.signer != self.signer || !verified {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.stats.heads.fetch_add(1, Ordering::Relaxed);
        self.memtable.raise_floor(&h.frontier, h.seq);
    }
}

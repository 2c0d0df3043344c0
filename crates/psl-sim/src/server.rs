//! Simulated capsule servers: the real [`psl_server::ServerCore`] and the real commit path
//! ([`psl_server::disk`]) over [`SimDisk`], a disk that keeps written records in a volatile
//! cache until they are synced, and loses them (or keeps a torn prefix of them) when it crashes.

use psl_capsule::{Kind, Record, SignedMetadata, Verified, Verifier};
use psl_crypto::{AppKey, Hash256};
use psl_server::disk::{self, Disk};
use psl_server::{Output, ServerConfig, ServerCore};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A disk that survives server crashes. Records are kept per writer in chain order; the first
/// `synced[w]` of writer `w`'s chain are durable, the rest sit in the volatile cache.
#[derive(Default)]
pub struct SimDisk {
    chains: BTreeMap<u32, Vec<Verified<Record>>>,
    synced: BTreeMap<u32, usize>,
    /// Writers of the records written since the last sync, in write order (the order pages
    /// would reach the medium).
    unsynced: Vec<u32>,
    /// Hashes of records written since the run loop last looked (it checks each one).
    pub fresh: Vec<Hash256>,
    /// Records written but not synced that crashes lost, over the run (torn ones included).
    pub lost_on_crash: u64,
    /// Crashes that left a torn prefix of the unsynced writes on the medium.
    pub torn_writes: u64,
}

impl SimDisk {
    /// Writer `writer`'s durable chain length.
    pub fn synced_len(&self, writer: u32) -> u64 {
        self.synced.get(&writer).copied().unwrap_or(0) as u64
    }

    /// Every writer's durable chain.
    pub fn synced_chains(&self) -> impl Iterator<Item = (u32, &[Verified<Record>])> + '_ {
        self.chains.iter().map(|(w, c)| (*w, &c[..self.synced.get(w).copied().unwrap_or(0).min(c.len())]))
    }

    /// The durable record at (writer, seq), if any.
    pub fn synced_hash(&self, writer: u32, seq: u64) -> Option<Hash256> {
        if seq >= self.synced_len(writer) {
            return None;
        }
        self.chains.get(&writer).and_then(|c| c.get(seq as usize)).map(|r| r.hash())
    }

    /// The machine dies: the volatile cache is lost. With probability `torn`, a prefix (in write
    /// order) of what was written reached the medium before the power went, and the last record
    /// of that prefix was torn (half written: its checksum fails, so recovery drops it).
    pub fn crash(&mut self, rng: &mut StdRng, torn: f64) {
        let mut kept: BTreeMap<u32, usize> = BTreeMap::new();
        if !self.unsynced.is_empty() && rng.random_bool(torn) {
            let k = rng.random_range(1..=self.unsynced.len());
            // The k-th page is torn: only the first k - 1 records survive intact.
            for w in &self.unsynced[..k - 1] {
                *kept.entry(*w).or_default() += 1;
            }
            self.torn_writes += 1;
        }
        for (w, chain) in self.chains.iter_mut() {
            let keep = self.synced.get(w).copied().unwrap_or(0) + kept.get(w).copied().unwrap_or(0);
            self.lost_on_crash += chain.len().saturating_sub(keep) as u64;
            chain.truncate(keep);
        }
        self.chains.retain(|_, c| !c.is_empty());
        // What survived is on the medium now.
        self.synced = self.chains.iter().map(|(w, c)| (*w, c.len())).collect();
        self.unsynced.clear();
    }
}

/// The simulator's deliberate bug (`bug_ack_before_sync`): a disk whose `sync` returns at
/// once without making anything durable, so the server acks a batch a crash can still lose
/// (the checker must catch it). Everything else is the simulated disk's.
struct LyingDisk<'a>(&'a mut SimDisk);

impl Disk for LyingDisk<'_> {
    fn write(&mut self, batch: &[Verified<Record>]) -> Result<usize, String> {
        self.0.write(batch)
    }
    fn sync(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn heads(&self) -> BTreeMap<u32, (u64, u64)> {
        self.0.heads()
    }
    fn chain_tail(&self, writer: u32, n: usize) -> Result<(u64, Vec<Hash256>), String> {
        self.0.chain_tail(writer, n)
    }
    fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String> {
        self.0.range(writer, from_seq, to_seq)
    }
    fn latest_sync(&self) -> Result<Option<Verified<Record>>, String> {
        self.0.latest_sync()
    }
}

impl Disk for SimDisk {
    fn write(&mut self, batch: &[Verified<Record>]) -> Result<usize, String> {
        // Same rules as the real store: chain order, duplicates skipped, nothing written if
        // anything is refused.
        let mut next: BTreeMap<u32, u64> = BTreeMap::new();
        let mut plan = Vec::new();
        for r in batch {
            let h = r.header();
            let chain = self.chains.get(&h.writer).map(|c| &c[..]).unwrap_or(&[]);
            let n = *next.entry(h.writer).or_insert(chain.len() as u64);
            if h.seq < chain.len() as u64 {
                if chain[h.seq as usize].hash() == r.hash() {
                    continue;
                }
                return Err(format!("writer {} seq {}: another record is stored there", h.writer, h.seq));
            }
            if h.seq != n {
                return Err(format!("writer {} seq {}: the chain is at {n}", h.writer, h.seq));
            }
            let prev = if n == 0 {
                Hash256::ZERO
            } else if (n as usize) <= chain.len() {
                chain[n as usize - 1].hash()
            } else {
                plan.iter()
                    .rev()
                    .find(|p: &&&Verified<Record>| p.header().writer == h.writer)
                    .map(|p| p.hash())
                    .unwrap_or(Hash256::ZERO)
            };
            if h.prev != prev {
                return Err(format!("writer {} seq {}: does not link to the stored chain", h.writer, h.seq));
            }
            next.insert(h.writer, n + 1);
            plan.push(r);
        }
        for r in plan {
            let w = r.header().writer;
            self.fresh.push(r.hash());
            self.unsynced.push(w);
            self.chains.entry(w).or_default().push(r.clone());
        }
        Ok(batch.len())
    }

    fn sync(&mut self) -> Result<(), String> {
        self.synced = self.chains.iter().map(|(w, c)| (*w, c.len())).collect();
        self.unsynced.clear();
        Ok(())
    }

    fn heads(&self) -> BTreeMap<u32, (u64, u64)> {
        self.chains.iter().filter_map(|(w, c)| c.last().map(|r| (*w, (c.len() as u64, r.header().epoch)))).collect()
    }

    fn chain_tail(&self, writer: u32, n: usize) -> Result<(u64, Vec<Hash256>), String> {
        let c = self.chains.get(&writer).map(|c| &c[..]).unwrap_or(&[]);
        Ok((c.len() as u64, c[c.len().saturating_sub(n)..].iter().map(|r| r.hash()).collect()))
    }

    fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, String> {
        let Some(c) = self.chains.get(&writer) else { return Ok(Vec::new()) };
        let end = (to_seq.saturating_add(1)).min(c.len() as u64);
        Ok(if from_seq >= end { Vec::new() } else { c[from_seq as usize..end as usize].to_vec() })
    }

    fn latest_sync(&self) -> Result<Option<Verified<Record>>, String> {
        Ok(self
            .chains
            .values()
            .flat_map(|c| c.iter())
            .filter(|r| r.header().kind == Kind::Sync)
            .max_by_key(|r| r.header().epoch)
            .cloned())
    }
}

/// One simulated capsule server (its disk lives outside it, in the run loop, so that it
/// survives crashes).
pub struct SimServer {
    /// The server's id (its slot index), from which its key and writer index come.
    pub id: u32,
    /// The product's server core (ordering, acks, repair, equivocation detection).
    pub core: ServerCore,
    verifier: Arc<Verifier>,
    /// A batch written and waiting for its fsync: (records, fsync done at).
    syncing: Option<(usize, u64)>,
    /// Deliberate bug for checking the checker: ack a batch as soon as it is written.
    ack_before_sync: bool,
}

/// Something a simulated server did that the run loop acts on.
pub enum ServerEffect {
    /// Bytes to publish on the network: an ack, an announcement, or a served record.
    Publish(Vec<u8>),
    /// The server saw two different signed records for one (writer, seq); fails the run.
    Equivocation {
        /// The writer that equivocated.
        writer: u32,
        /// The seq it signed twice.
        seq: u64,
    },
}

impl SimServer {
    /// Server `id` (re)started at `now` over `disk`: it learns the statements in its synced
    /// records and adopts its chains; `ack_before_sync` is the deliberate bug.
    pub fn new(
        id: u32,
        meta: &SignedMetadata,
        app: &AppKey,
        disk: &SimDisk,
        now: u64,
        ack_before_sync: bool,
    ) -> SimServer {
        let verifier = Arc::new(Verifier::new(meta.clone(), None));
        let (key, cert) = psl_server::server_credentials(meta, app, id).expect("simulated server ids are small");
        let me = psl_scl::server_writer(id).expect("simulated server ids are small");
        let mut core = ServerCore::new(verifier.clone(), key, me, ServerConfig::default());
        core.set_announcements(cert.map(psl_capsule::KeyStatement::Cert).into_iter().collect());
        // What its disk holds was verified when written: its statements are known again.
        verifier.learn_statements(disk.synced_chains().flat_map(|(_, c)| c.iter().map(|r| &**r)));
        disk::adopt(&mut core, disk, now).expect("the simulated disk reads its chains back");
        SimServer { id, core, verifier, syncing: None, ack_before_sync }
    }

    /// A message from the network: a record of its capsule is prechecked and verified (or held
    /// for a certificate) before the core takes it; undecodable bytes count as rejected.
    pub fn receive(&mut self, bytes: &[u8], now: u64, disk: &SimDisk, fx: &mut Vec<ServerEffect>) {
        match psl_scl::Msg::decode(bytes) {
            Err(_) => self.core.on_rejected(),
            Ok(psl_scl::Msg::Record { capsule, bytes }) if capsule == self.verifier.name() => {
                let limits = self.verifier.metadata().meta.policy.limits;
                match Record::decode(&bytes, &limits) {
                    Err(_) => self.core.on_rejected(),
                    Ok(rec) => self.incoming(rec, now, disk, fx),
                }
            }
            Ok(psl_scl::Msg::Ack(_)) | Ok(psl_scl::Msg::Record { .. }) => {}
            Ok(m) => {
                let certs = matches!(m, psl_scl::Msg::Certs { .. });
                self.core.on_message(m);
                if certs {
                    self.release_held(now, disk, fx);
                }
            }
        }
    }

    /// The server's verifier (its revocations tell whether it has learnt one).
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    fn incoming(&mut self, rec: Record, now: u64, disk: &SimDisk, fx: &mut Vec<ServerEffect>) {
        if self.core.precheck(&rec) {
            return;
        }
        match self.verifier.verify_or_hold(rec, now) {
            Ok(None) => {}
            Err(_) => self.core.on_rejected(),
            Ok(Some(v)) => {
                let certs = v.header().kind == Kind::Cert;
                let out = self.core.on_verified(v, now);
                self.outputs(out, disk, fx);
                if certs {
                    self.release_held(now, disk, fx);
                }
            }
        }
    }

    fn release_held(&mut self, now: u64, disk: &SimDisk, fx: &mut Vec<ServerEffect>) {
        for rec in self.verifier.release_held() {
            self.incoming(rec, now, disk, fx);
        }
    }

    /// One simulated millisecond: finish a due fsync (then ack), start the next group commit,
    /// and tick every `tick_ms`.
    pub fn step(&mut self, now: u64, tick: bool, fsync_ms: u64, disk: &mut SimDisk, fx: &mut Vec<ServerEffect>) {
        if let Some((n, at)) = self.syncing {
            if now < at {
                if tick {
                    let out = self.core.on_tick(now);
                    self.outputs(out, disk, fx);
                }
                return;
            }
            self.syncing = None;
            if self.ack_before_sync {
                let _ = disk.sync();
            } else {
                let out = disk::commit_synced(&mut self.core, disk, n, now);
                self.outputs(out, disk, fx);
            }
        }
        match disk::commit_write(&mut self.core, disk, now) {
            None => {}
            Some(Ok(n)) => {
                self.syncing = Some((n, now + fsync_ms));
                if self.ack_before_sync {
                    // The bug: a disk whose sync says done before anything is durable.
                    let out = disk::commit_synced(&mut self.core, &mut LyingDisk(disk), n, now);
                    self.outputs(out, disk, fx);
                }
            }
            Some(Err(out)) => self.outputs(out, disk, fx),
        }
        if tick {
            let out = self.core.on_tick(now);
            self.outputs(out, disk, fx);
        }
    }

    fn outputs(&mut self, out: Vec<Output>, disk: &SimDisk, fx: &mut Vec<ServerEffect>) {
        for o in out {
            match o {
                Output::Publish(b) => fx.push(ServerEffect::Publish(b)),
                Output::Serve { writer, from_seq, to_seq } => {
                    if let Ok(recs) = disk.range(writer, from_seq, to_seq) {
                        let capsule = self.verifier.name();
                        for r in recs {
                            fx.push(ServerEffect::Publish(
                                psl_scl::Msg::Record { capsule, bytes: r.shared_bytes() }.encode(),
                            ));
                        }
                    }
                }
                Output::Equivocation { writer, seq, .. } => fx.push(ServerEffect::Equivocation { writer, seq }),
                Output::Withholding { .. } | Output::Fatal(_) => {}
            }
        }
    }
}

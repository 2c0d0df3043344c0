//! One simulated node: the real protocol core, driven inline.

use psl_capsule::{Action, Author, Body, ControlCode, KeyStatement, Op, Record, SignedMetadata, Verifier};
use psl_crypto::AppKey;
use psl_scl::memtable::key_shard;
use psl_scl::{
    CoordinatorConfig, CoordinatorSm, LamportClock, Memtable, Metrics, NodeConfig, NodeCore, Output, Version,
};
use std::sync::Arc;

pub struct SimNode {
    pub id: u32,
    pub incarnation: u32,
    pub alive: bool,
    pub core: NodeCore,
    pub memtable: Arc<Memtable>,
    pub clock: Arc<LamportClock>,
    pub metrics: Arc<Metrics>,
    pub verifier: Arc<Verifier>,
    pub authors: Vec<Author>,
    pub pending: Vec<Vec<Op>>,
    pub coordinator: Option<Author>,
    pub batch_ops_max: usize,
    /// No puts before this time (a restarted node catching up first).
    pub quiet_until: u64,
    /// Whether the writers (a certified capsule) have written their own Cert records yet, and
    /// whether the coordinator has (before its first RTS or SYNC, as `psl-node` does).
    introduced: bool,
    coordinator_introduced: bool,
    /// What the core announces (own certificates, and statements handed to it).
    core_announcements: Vec<KeyStatement>,
}

/// Something a node produced that the run loop must act on.
pub enum Effect {
    Publish(Vec<u8>),
    /// A data op sealed into a record: (key, version, value).
    Sealed(Vec<u8>, Version, Option<Vec<u8>>),
    /// A record this node wrote: (writer, seq, hash, the data ops in it as (key, version)).
    Wrote(u32, u64, psl_crypto::Hash256, Vec<(Vec<u8>, Version)>),
    Note(Output),
}

#[allow(clippy::too_many_arguments)]
impl SimNode {
    pub fn new(
        id: u32,
        incarnation: u32,
        meta: &SignedMetadata,
        app: &AppKey,
        writers: usize,
        coordinator: Option<(u8, CoordinatorConfig)>,
        seed: u64,
        now: u64,
        batch_ops_max: usize,
        servers: u32,
    ) -> SimNode {
        let verifier = Arc::new(Verifier::new(meta.clone(), Some(app.data_key())));
        let memtable = Arc::new(Memtable::new());
        let clock = Arc::new(LamportClock::new(0));
        let metrics = Arc::new(Metrics::default());
        let authors: Vec<Author> = (0..writers as u32)
            .map(|a| {
                let w = psl_scl::writer_index(id, incarnation, a).expect("simulated ids are small");
                Author::new(meta, app, w).expect("valid writer").with_salt_seed(seed ^ ((w as u64) << 20))
            })
            .collect();
        let coord = coordinator.map(|(rank, cfg)| {
            let w = meta.meta.policy.coordinator_at(rank).expect("rank within the policy");
            let author = Author::new(meta, app, w).expect("valid writer").with_salt_seed(seed ^ 0xC0DE ^ w as u64);
            (w, author, CoordinatorSm::new(cfg, now))
        });
        let (core_coord, coord_author) = match coord {
            Some((w, a, sm)) => (Some((w, sm)), Some(a)),
            None => (None, None),
        };
        let own_certs: Vec<KeyStatement> = authors
            .iter()
            .chain(coord_author.iter())
            .filter_map(|a| a.cert().cloned().map(KeyStatement::Cert))
            .collect();
        let mut core = NodeCore::new(
            verifier.clone(),
            memtable.clone(),
            clock.clone(),
            metrics.clone(),
            authors.iter().map(|a| a.writer()),
            core_coord,
            NodeConfig { servers, ..NodeConfig::default() },
        );
        core.set_announcements(own_certs.clone());
        SimNode {
            id,
            incarnation,
            alive: true,
            core,
            memtable,
            clock,
            metrics,
            verifier,
            pending: vec![Vec::new(); authors.len()],
            authors,
            coordinator: coord_author,
            batch_ops_max,
            quiet_until: 0,
            introduced: false,
            coordinator_introduced: false,
            core_announcements: own_certs,
        }
    }

    /// Adds a statement (the leader's revocation) to what this node announces and, on a
    /// coordinator, carries it into the log in a Cert record.
    pub fn announce(&mut self, s: KeyStatement, now: u64, fx: &mut Vec<Effect>) {
        let mut list = self.core_announcements.clone();
        list.push(s.clone());
        self.core_announcements = list.clone();
        self.core.set_announcements(list);
        if let Some(c) = &mut self.coordinator {
            c.observe(self.clock.tick());
            let rec = c.write_certs(vec![s.clone()]).expect("a Cert record fits");
            self.clock.observe(rec.header().lamport);
            self.local_record(rec, &Body::Certs(vec![s]), now, fx);
        }
    }

    /// Each fresh writer's first record is its own certificate (a certified capsule).
    fn introduce(&mut self, now: u64, fx: &mut Vec<Effect>) {
        if self.introduced {
            return;
        }
        self.introduced = true;
        for i in 0..self.authors.len() {
            if self.authors[i].next_seq() != 0 {
                continue;
            }
            let Some(sealed) = self.authors[i].write_own_cert() else { continue };
            let rec = sealed.expect("a Cert record fits");
            self.clock.observe(rec.header().lamport);
            let body = Body::Certs(self.authors[i].cert().cloned().map(KeyStatement::Cert).into_iter().collect());
            self.local_record(rec, &body, now, fx);
        }
    }

    fn introduce_coordinator(&mut self, now: u64, fx: &mut Vec<Effect>) {
        if self.coordinator_introduced {
            return;
        }
        let Some(c) = &mut self.coordinator else { return };
        self.coordinator_introduced = true;
        let Some(sealed) = c.write_own_cert() else { return };
        let rec = sealed.expect("a Cert record fits");
        self.clock.observe(rec.header().lamport);
        let body = Body::Certs(c.cert().cloned().map(KeyStatement::Cert).into_iter().collect());
        self.local_record(rec, &body, now, fx);
    }

    /// A local put (`Some`) or delete (`None`): visible locally at once, sealed later.
    pub fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>, now: u64, fx: &mut Vec<Effect>) {
        if self.authors.is_empty() {
            return;
        }
        let shard = key_shard(&key, self.authors.len());
        let lamport = self.clock.tick();
        let writer = self.authors[shard].writer();
        self.memtable.apply(&key, Version { lamport, writer }, value.as_deref().map(Arc::from));
        let action = match value {
            Some(v) => Action::Put(v),
            None => Action::Delete,
        };
        self.pending[shard].push(Op { lamport, key, action });
        if self.pending[shard].len() >= self.batch_ops_max {
            self.flush_one(shard, now, fx);
        }
    }

    pub fn flush(&mut self, now: u64, fx: &mut Vec<Effect>) {
        self.introduce(now, fx);
        for i in 0..self.authors.len() {
            self.flush_one(i, now, fx);
        }
    }

    fn flush_one(&mut self, i: usize, now: u64, fx: &mut Vec<Effect>) {
        if self.pending[i].is_empty() {
            return;
        }
        let ops = std::mem::take(&mut self.pending[i]);
        let writer = self.authors[i].writer();
        let mut applied = Vec::with_capacity(ops.len());
        for op in &ops {
            applied.push((op.key.clone(), Version { lamport: op.lamport, writer }));
            let v = match &op.action {
                Action::Put(x) => Some(x.clone()),
                Action::Delete => None,
            };
            fx.push(Effect::Sealed(op.key.clone(), Version { lamport: op.lamport, writer }, v));
        }
        let body = Body::Data(ops.clone());
        let rec = self.authors[i].write_stamped(ops).expect("simulated ops fit the limits");
        fx.push(Effect::Wrote(writer, rec.header().seq, rec.hash(), applied));
        self.local_record(rec, &body, now, fx);
    }

    fn local_record(&mut self, rec: Record, body: &Body, now: u64, fx: &mut Vec<Effect>) {
        if !matches!(body, Body::Data(_)) {
            fx.push(Effect::Wrote(rec.header().writer, rec.header().seq, rec.hash(), Vec::new()));
        }
        let out = self.core.on_local_record(rec, body, now);
        self.outputs(out, now, fx);
    }

    /// Acts on the core's outputs (writers' duties) and passes the rest on.
    pub fn outputs(&mut self, out: Vec<Output>, now: u64, fx: &mut Vec<Effect>) {
        for o in out {
            match o {
                Output::Publish(b) => fx.push(Effect::Publish(b)),
                Output::EnterEpoch { sync, epoch } => {
                    for a in self.authors.iter_mut() {
                        a.enter_epoch(sync, epoch);
                    }
                    if let Some(c) = &mut self.coordinator {
                        c.enter_epoch(sync, epoch);
                    }
                }
                Output::WriteEoe { epoch, heads } => {
                    self.flush(now, fx);
                    for i in 0..self.authors.len() {
                        let body =
                            Body::Control { code: ControlCode::Eoe, payload: psl_scl::node::epoch_payload(epoch) };
                        // The first writer carries the node's view of every other writer's head.
                        let links = if i == 0 { heads.clone() } else { Vec::new() };
                        // Control records take their Lamport time from the node's clock too.
                        self.authors[i].observe(self.clock.tick());
                        let rec = self.authors[i].write_control(body.clone(), links).expect("control record fits");
                        self.clock.observe(rec.header().lamport);
                        self.local_record(rec, &body, now, fx);
                    }
                }
                Output::WriteRts { epoch } => {
                    self.introduce_coordinator(now, fx);
                    if let Some(c) = &mut self.coordinator {
                        let body =
                            Body::Control { code: ControlCode::Rts, payload: psl_scl::node::epoch_payload(epoch) };
                        c.observe(self.clock.tick());
                        let rec = c.write_body(body.clone()).expect("control record fits");
                        self.clock.observe(rec.header().lamport);
                        self.local_record(rec, &body, now, fx);
                    }
                }
                Output::WriteSync { epoch, heads } => {
                    if self.coordinator.as_ref().is_some_and(|c| epoch > c.epoch()) {
                        self.introduce_coordinator(now, fx);
                    }
                    if let Some(c) = &mut self.coordinator {
                        if epoch > c.epoch() {
                            c.observe(self.clock.tick());
                            let rec = c.write_sync_epoch(epoch, heads).expect("SYNC fits");
                            self.clock.observe(rec.header().lamport);
                            let body = Body::Sync { app_key_fp: self.verifier.metadata().meta.app.fingerprint() };
                            self.local_record(rec, &body, now, fx);
                        }
                    }
                }
                Output::Resume(head) => {
                    if let Some(c) = self.coordinator.as_mut().filter(|c| c.writer() == head.writer) {
                        c.resume(&head);
                    }
                }
                other => fx.push(Effect::Note(other)),
            }
        }
    }

    /// A message from the network.
    pub fn receive(&mut self, bytes: &[u8], now: u64, fx: &mut Vec<Effect>) {
        match psl_scl::Msg::decode(bytes) {
            Err(_) => self.core.on_rejected(psl_scl::RejectReason::BadMessage),
            Ok(psl_scl::Msg::Record { bytes, .. }) => {
                let limits = self.verifier.metadata().meta.policy.limits;
                match psl_capsule::Record::decode(&bytes, &limits) {
                    Err(_) => self.core.on_rejected(psl_scl::RejectReason::Encoding),
                    Ok(rec) => self.incoming(rec, now, fx),
                }
            }
            Ok(m) => {
                let certs = matches!(m, psl_scl::Msg::Certs { .. });
                self.core.on_message(m);
                if certs {
                    self.release_held(now, fx);
                }
            }
        }
    }

    /// A record from the network (or released from the hold-back): verified, or held back for
    /// its writer's certificate, as `psl-node`'s verify path does.
    fn incoming(&mut self, rec: Record, now: u64, fx: &mut Vec<Effect>) {
        if self.core.precheck(&rec) {
            return;
        }
        match self.verifier.verify_open_or_hold(rec, now) {
            Ok(None) => {}
            Err(rej) => self.core.on_rejected(psl_scl::RejectReason::from_verifier(&rej.reason)),
            Ok(Some(opened)) => {
                let certs = opened.record.header().kind == psl_capsule::Kind::Cert;
                let out = self.core.on_verified(opened, now);
                self.outputs(out, now, fx);
                if certs {
                    self.release_held(now, fx);
                }
            }
        }
    }

    fn release_held(&mut self, now: u64, fx: &mut Vec<Effect>) {
        for rec in self.verifier.release_held() {
            self.incoming(rec, now, fx);
        }
    }

    pub fn tick(&mut self, now: u64, fx: &mut Vec<Effect>) {
        let out = self.core.on_tick(now);
        self.outputs(out, now, fx);
    }
}

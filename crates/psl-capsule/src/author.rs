//! A writer's chain state: it assigns seq, prev, Lamport times and epoch links, and seals.

use crate::body::{Action, Body, Op};
use crate::certs::{KeyStatement, WriterCert};
use crate::limits::Limits;
use crate::meta::WriterKeys;
use crate::meta::{CapsuleName, SignedMetadata};
use crate::record::{Link, Record};
use crate::replica::Head;
use crate::rotation::RotationCert;
use crate::seal::{Draft, SealError};
use crate::signers::SignPool;
use psl_crypto::{AppKey, CryptoError, DataKey, Hash256, SigningKey, SALT_LEN};
use std::sync::Arc;

/// One writer of one capsule. Holds its signing key and the application data key.
pub struct Author {
    capsule: CapsuleName,
    limits: Limits,
    writer: u32,
    /// Shared with a [`SignPool`]'s threads while they sign a batch (never copied: the scalar
    /// stays in the key's one zeroized allocation).
    key: Arc<SigningKey>,
    data_key: DataKey,
    app_key_fp: Hash256,
    /// Application key generation of `key` and `data_key` (0: the metadata's).
    key_gen: u32,
    /// A scheduled rotation: from its epoch on, records are signed and sealed with its keys.
    rotation: Option<NextKeys>,
    next_seq: u64,
    prev: Hash256,
    lamport: u64,
    epoch: u64,
    /// The SYNC the next record must link to (set on entering an epoch).
    epoch_link: Option<Link>,
    /// Seeded salt source for reproducible simulations; OS randomness when `None`.
    salts: Option<rand::rngs::StdRng>,
    /// This writer's certificate, in a capsule that certifies writers.
    cert: Option<WriterCert>,
}

/// The keys of the next application key generation, waiting for its epoch.
struct NextKeys {
    key_gen: u32,
    from_epoch: u64,
    key: SigningKey,
    data_key: DataKey,
    app_key_fp: Hash256,
}

impl std::fmt::Debug for Author {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Author(writer={}, next_seq={}, lamport={}, epoch={})",
            self.writer, self.next_seq, self.lamport, self.epoch
        )
    }
}

impl Author {
    /// A writer at the start of its chain, its key made from the application key under the
    /// capsule's scheme (in a certified capsule it issues its own certificate, valid from epoch 0:
    /// whoever holds the application key may).
    pub fn new(meta: &SignedMetadata, app: &AppKey, writer: u32) -> Result<Author, CryptoError> {
        match meta.meta.policy.writer_keys {
            WriterKeys::Derived => Self::with_keys(meta, app.writer(writer)?, app.data_key(), writer),
            WriterKeys::Certified => {
                let cert =
                    WriterCert::issue(app, meta.name(), 0, writer, 0).map_err(|_| CryptoError::WriterIndex(writer))?;
                Self::with_certified_keys(meta, app.writer_hardened(writer)?, cert, app.data_key())
            }
        }
    }

    /// A writer from keys handed to it (as a worker receives them from the leader), in a capsule
    /// that derives writer keys; the key must be the derived child.
    pub fn with_keys(
        meta: &SignedMetadata,
        key: SigningKey,
        data_key: DataKey,
        writer: u32,
    ) -> Result<Author, CryptoError> {
        if meta.meta.policy.writer_keys != WriterKeys::Derived || meta.meta.app.writer(writer)? != key.verifying_key() {
            return Err(CryptoError::BadSignature);
        }
        Ok(Self::make(meta, key, data_key, writer, None))
    }

    /// A writer of a certified capsule from its key and its certificate (of key generation 0,
    /// signed by the metadata's application key, for this key and capsule).
    pub fn with_certified_keys(
        meta: &SignedMetadata,
        key: SigningKey,
        cert: WriterCert,
        data_key: DataKey,
    ) -> Result<Author, CryptoError> {
        let ok = meta.meta.policy.writer_keys == WriterKeys::Certified
            && cert.key_gen == 0
            && cert.key == key.verifying_key()
            && cert.check(meta.name(), &meta.meta.app.point()).is_ok();
        if !ok {
            return Err(CryptoError::BadSignature);
        }
        let writer = cert.writer;
        Ok(Self::make(meta, key, data_key, writer, Some(cert)))
    }

    /// This writer's certificate (a certified capsule's writer).
    pub fn cert(&self) -> Option<&WriterCert> {
        self.cert.as_ref()
    }

    /// Writes a Cert record carrying `statements` (certificates and revocations the application
    /// key signed; this writer only carries them).
    pub fn write_certs(&mut self, statements: Vec<KeyStatement>) -> Result<Record, SealError> {
        self.write_body(Body::Certs(statements))
    }

    /// Writes a Cert record carrying this writer's own certificate: how a certified writer
    /// introduces itself to verifiers that have not seen its certificate. `None` in a capsule
    /// that derives writer keys.
    pub fn write_own_cert(&mut self) -> Option<Result<Record, SealError>> {
        let cert = self.cert.clone()?;
        Some(self.write_certs(vec![KeyStatement::Cert(cert)]))
    }

    fn make(
        meta: &SignedMetadata,
        key: SigningKey,
        data_key: DataKey,
        writer: u32,
        cert: Option<WriterCert>,
    ) -> Author {
        Author {
            capsule: meta.name(),
            limits: meta.meta.policy.limits,
            writer,
            key: Arc::new(key),
            data_key,
            app_key_fp: meta.meta.app.fingerprint(),
            key_gen: 0,
            rotation: None,
            next_seq: 0,
            prev: Hash256::ZERO,
            lamport: 0,
            epoch: 0,
            epoch_link: None,
            salts: None,
            cert,
        }
    }

    /// Draws record salts from a generator seeded with `seed` instead of the OS: for seeded
    /// simulations only, where every run must produce the same bytes. The seed must differ per
    /// (data key, writer) and per run of a real deployment, or salts would repeat.
    pub fn with_salt_seed(mut self, seed: u64) -> Author {
        use rand::SeedableRng;
        self.salts = Some(rand::rngs::StdRng::seed_from_u64(seed));
        self
    }

    /// Continues after `head`, the newest record of this writer's chain.
    pub fn resume(&mut self, head: &Head) {
        self.next_seq = head.seq + 1;
        self.prev = head.hash;
        self.lamport = self.lamport.max(head.lamport);
        self.epoch = self.epoch.max(head.epoch);
    }

    /// This author's writer index.
    pub fn writer(&self) -> u32 {
        self.writer
    }

    /// The application key generation this writer signs with now.
    pub fn key_gen(&self) -> u32 {
        self.key_gen
    }

    /// Schedules a key rotation (the leader hands the writer its key under the new generation
    /// and the new data key): every record whose epoch is at or after `cert.from_epoch` is
    /// signed with `key`, sealed with `data_key` and marked with `cert.key_gen`, and a SYNC from
    /// then on names the new application key. The certificate's owner signature is the
    /// verifier's business; here the keys must match it and follow this writer's generation.
    pub fn schedule_rotation(
        &mut self,
        cert: &RotationCert,
        key: SigningKey,
        data_key: DataKey,
    ) -> Result<(), CryptoError> {
        if cert.key_gen != self.key_gen + 1 {
            return Err(CryptoError::Derivation {
                index: cert.key_gen,
                why: "rotation does not follow the writer's key generation",
            });
        }
        // A certified writer's new key is known to verifiers by its certificate under the new
        // generation (the leader publishes it); a derived writer's must be the derived child.
        let derived_ok = self.cert.is_some() || cert.app.writer(self.writer)? == key.verifying_key();
        if !derived_ok || data_key.fingerprint() != cert.data_key_fp {
            return Err(CryptoError::BadSignature);
        }
        // Only the generation right after the current one can be pending (checked above).
        self.rotation = Some(NextKeys {
            key_gen: cert.key_gen,
            from_epoch: cert.from_epoch,
            key,
            data_key,
            app_key_fp: cert.app.fingerprint(),
        });
        Ok(())
    }

    /// Switches to the scheduled generation if a record of `epoch` is due under it.
    fn keys_for(&mut self, epoch: u64) {
        if self.rotation.as_ref().is_some_and(|r| epoch >= r.from_epoch) {
            let r = self.rotation.take().expect("checked above");
            self.key = Arc::new(r.key);
            self.data_key = r.data_key;
            self.key_gen = r.key_gen;
            self.app_key_fp = r.app_key_fp;
        }
    }

    /// The seq the next record will take (0 for a fresh chain).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The writer's Lamport clock: the newest time it has stamped or observed; the next op takes
    /// one more.
    pub fn lamport(&self) -> u64 {
        self.lamport
    }

    /// The epoch the writer is in (the newest SYNC entered), written into its next record.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Lamport rule on receipt: `lamport = max(local, seen)`; the next op then takes `+ 1`.
    pub fn observe(&mut self, lamport: u64) {
        self.lamport = self.lamport.max(lamport);
    }

    /// Enters the epoch opened by `sync` (a SYNC record of epoch `epoch`): the next record
    /// carries the new epoch number and links to it.
    pub fn enter_epoch(&mut self, sync: Link, epoch: u64) {
        if epoch > self.epoch {
            self.epoch = epoch;
            self.epoch_link = Some(sync);
        }
    }

    /// Stamps ops (`Some(value)` = put, `None` = delete) with fresh Lamport times and seals
    /// them into one data record.
    pub fn write_ops<K, V>(&mut self, ops: impl IntoIterator<Item = (K, Option<V>)>) -> Result<Record, SealError>
    where
        K: Into<Vec<u8>>,
        V: Into<Vec<u8>>,
    {
        let mut lamport = self.lamport;
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|(k, v)| {
                lamport += 1;
                Op {
                    lamport,
                    key: k.into(),
                    action: match v {
                        Some(v) => Action::Put(v.into()),
                        None => Action::Delete,
                    },
                }
            })
            .collect();
        self.write_body(Body::Data(ops))
    }

    /// Seals an already stamped data batch (ops carry their own Lamport times).
    pub fn write_stamped(&mut self, ops: Vec<Op>) -> Result<Record, SealError> {
        self.write_body(Body::Data(ops))
    }

    /// Seals an already stamped atomic batch ([`Body::Atomic`]): one record whose ops every
    /// node applies as one.
    pub fn write_atomic(&mut self, ops: Vec<Op>) -> Result<Record, SealError> {
        self.write_body(Body::Atomic(ops))
    }

    /// Writes a SYNC record of the next epoch pointing at `heads` (coordinator only).
    pub fn write_sync(&mut self, heads: Vec<Link>) -> Result<Record, SealError> {
        self.write_sync_epoch(self.epoch + 1, heads)
    }

    /// Writes the SYNC record of `epoch` (which must be above this writer's epoch).
    pub fn write_sync_epoch(&mut self, epoch: u64, heads: Vec<Link>) -> Result<Record, SealError> {
        assert!(epoch > self.epoch, "a SYNC opens a newer epoch");
        // The SYNC names the application key in force at its own epoch.
        self.keys_for(epoch);
        let rec = self.write_with(Body::Sync { app_key_fp: self.app_key_fp }, heads, epoch, self.lamport + 1)?;
        self.epoch = epoch;
        self.epoch_link = None;
        Ok(rec)
    }

    /// Seals a non-data body with extra `links` (an EOE naming other writers' heads). The
    /// epoch's SYNC link, if due, comes first.
    pub fn write_control(&mut self, body: Body, links: Vec<Link>) -> Result<Record, SealError> {
        assert!(
            !matches!(body, Body::Data(_) | Body::Atomic(_) | Body::Sync { .. }),
            "data and SYNC records have their own rules"
        );
        let all: Vec<Link> = self.epoch_link.into_iter().chain(links).collect();
        let rec = self.write_with(body, all, self.epoch, self.lamport + 1)?;
        self.epoch_link = None;
        Ok(rec)
    }

    /// Seals any body at this writer's next seq.
    pub fn write_body(&mut self, body: Body) -> Result<Record, SealError> {
        let lamport = Self::lamport_for(&body, self.lamport);
        let links = self.epoch_link.into_iter().collect();
        let rec = self.write_with(body, links, self.epoch, lamport)?;
        self.epoch_link = None;
        Ok(rec)
    }

    /// Seals `bodies` as this writer's next records, byte for byte what [`Author::write_body`]
    /// makes of them one after another (same salts, seqs, `prev` links, Lamport times and
    /// epoch link), and signs them on `signers`' threads: [`Author::seal_bodies`], then
    /// [`SealedBatch::sign`]. A single body goes through [`Author::write_body`], without
    /// `signers`.
    pub fn write_bodies(&mut self, bodies: Vec<Body>, signers: &SignPool) -> Result<Vec<Record>, SealError> {
        if bodies.len() <= 1 {
            return bodies.into_iter().map(|b| self.write_body(b)).collect();
        }
        Ok(self.seal_bodies(bodies)?.sign(signers))
    }

    /// The first stage of [`Author::write_bodies`]: seals `bodies` in chain order as this
    /// writer's next records (a record's hash, which the next one's `prev` holds, does not
    /// cover its signature) and advances the chain past them. The batch is signed by
    /// [`SealedBatch::sign`], which needs no access to the author: a caller that keeps its
    /// author behind a lock signs after releasing it, so another batch can be sealed
    /// meanwhile. The records' seqs are taken whether or not the batch is then signed.
    ///
    /// All or nothing: on an error nothing is sealed and the chain state (seq, `prev`,
    /// Lamport time, epoch link) is as before the call; salts drawn for the batch are not
    /// drawn again.
    pub fn seal_bodies(&mut self, bodies: Vec<Body>) -> Result<SealedBatch, SealError> {
        let epoch = self.epoch;
        // Every record of the batch has this epoch, so one key signs and seals them all.
        self.keys_for(epoch);
        let (mut seq, mut prev, mut lamport) = (self.next_seq, self.prev, self.lamport);
        let mut epoch_link = self.epoch_link;
        let mut unsigned = Vec::with_capacity(bodies.len());
        for body in bodies {
            let l = Self::lamport_for(&body, lamport);
            let draft = Draft {
                writer: self.writer,
                key_gen: self.key_gen,
                seq,
                lamport: l,
                epoch,
                prev,
                links: epoch_link.take().into_iter().collect(),
                body,
            };
            let salt = self.salt();
            let u = draft.seal_unsigned(salt, self.capsule, &self.limits, &self.data_key)?;
            seq += 1;
            prev = u.hash();
            lamport = l;
            unsigned.push(u);
        }
        self.next_seq = seq;
        self.prev = prev;
        self.lamport = lamport;
        if !unsigned.is_empty() {
            self.epoch_link = None;
        }
        Ok(SealedBatch { key: self.key.clone(), unsigned })
    }

    /// The Lamport time of a record carrying `body` when the writer's clock is at `clock`: a
    /// data batch's is its last op's, any other body's the next tick.
    fn lamport_for(body: &Body, clock: u64) -> u64 {
        match body {
            Body::Data(ops) | Body::Atomic(ops) => ops.last().map(|o| o.lamport).unwrap_or(clock),
            _ => clock + 1,
        }
    }

    /// The next record's salt: from the seeded generator if there is one, else fresh randomness.
    fn salt(&mut self) -> [u8; SALT_LEN] {
        let mut salt = [0u8; SALT_LEN];
        match &mut self.salts {
            Some(rng) => rand::RngCore::fill_bytes(rng, &mut salt),
            None => rand::fill(&mut salt),
        }
        salt
    }

    fn write_with(&mut self, body: Body, links: Vec<Link>, epoch: u64, lamport: u64) -> Result<Record, SealError> {
        self.keys_for(epoch);
        let draft = Draft {
            writer: self.writer,
            key_gen: self.key_gen,
            seq: self.next_seq,
            lamport,
            epoch,
            prev: self.prev,
            links,
            body,
        };
        let salt = self.salt();
        let rec = draft.seal_with_salt(salt, self.capsule, &self.limits, &self.key, &self.data_key)?;
        self.next_seq += 1;
        self.prev = rec.hash();
        self.lamport = lamport;
        Ok(rec)
    }
}

/// Records sealed by [`Author::seal_bodies`], not yet signed: they hold their signing key
/// (shared, never copied) until [`SealedBatch::sign`] consumes them.
pub struct SealedBatch {
    key: Arc<SigningKey>,
    unsigned: Vec<crate::record::Unsigned>,
}

impl SealedBatch {
    /// Records in the batch.
    pub fn len(&self) -> usize {
        self.unsigned.len()
    }

    /// Whether the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.unsigned.is_empty()
    }

    /// Signs every record on `signers`' threads (RFC 6979 signatures do not depend on the
    /// thread) and returns them in chain order.
    pub fn sign(self, signers: &SignPool) -> Vec<Record> {
        let SealedBatch { key, unsigned } = self;
        let sigs = signers.sign_all(&key, unsigned.iter().map(|u| u.hash()).collect());
        assert_eq!(sigs.len(), unsigned.len(), "one signature per sealed record");
        unsigned.into_iter().zip(sigs).map(|(u, sig)| u.finish(sig)).collect()
    }
}

impl std::fmt::Debug for SealedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedBatch").field("records", &self.unsigned.len()).finish_non_exhaustive()
    }
}

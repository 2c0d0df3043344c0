//! Property tests of every codec in the crate: bodies, records and metadata round-trip; the
//! decoders neither panic on nor accept garbage or mutated encodings; and over-limit records
//! are refused when read under the limits they exceed.
//!
//! Sealing signs (tens of microseconds each), so properties that seal run a modest number of
//! cases; the whole file runs in a few seconds in a debug build.

mod common;

use common::Fixture;
use proptest::prelude::*;
use proptest::sample::Index;
use psl_capsule::meta::{LABEL_BYTES_MAX, META_BYTES_MAX};
use psl_capsule::{
    audit_file, file, new_capsule, Action, Body, ControlCode, DecodeError, Draft, Header, Kind, Limits, Link,
    MembershipProof, Metadata, MetadataError, Op, Reason, Record, Replica, SignedMetadata, Verifier,
    DEFAULT_COORDINATOR,
};
use psl_crypto::{Hash256, OwnerKey};
use std::sync::LazyLock;

/// Keys and values sized as the brief of these tests asks: keys 1..=250 bytes (memcached's
/// limit, also `Limits::default().key_bytes_max`), values up to 2000 bytes.
const KEY_MAX: usize = 250;
const VALUE_MAX: usize = 2000;
const WRITER_MAX: u32 = (1 << 31) - 1;

/// Everything built once and shared by every property: a capsule under the default limits,
/// its verifiers, a few valid records of every kind, and valid encodings of a capsule file and
/// a membership proof (for mutation and prefix fuzzing).
struct World {
    fx: Fixture,
    verifier: Verifier,
    public: Verifier,
    limits: Limits,
    valid: Vec<Record>,
    file: Vec<u8>,
    meta: Vec<u8>,
    proof: Vec<u8>,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let fx = Fixture::new(40);
    let verifier = fx.verifier();
    let public = fx.public_verifier();
    let limits = fx.meta.meta.policy.limits;
    let mut valid = fx.small_history();
    // One record of each remaining kind, with links, from writer 9.
    let mut a = fx.author(9);
    let sync = valid.iter().find(|r| r.header().kind == Kind::Sync).unwrap().link();
    a.enter_epoch(sync, 1);
    valid.push(a.write_body(Body::Control { code: ControlCode::Eoe, payload: b"end".to_vec() }).unwrap());
    valid.push(a.write_body(Body::DbBlock(vec![7; 300])).unwrap());
    valid.push(a.write_body(Body::DbIndex(Vec::new())).unwrap());
    for r in &valid {
        verifier.verify(r.clone()).expect("fixture records verify");
    }
    let file = file::encode(&fx.meta, &valid);
    let mut rep = Replica::new(fx.meta.name());
    for r in &valid {
        rep.insert(public.verify(r.clone()).unwrap()).unwrap();
    }
    let target = valid[0].hash();
    let proof = MembershipProof::build(&fx.meta, &rep, target, None).unwrap().encode();
    let meta = fx.meta.encode();
    World { fx, verifier, public, limits, valid, file, meta, proof }
});

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn hash() -> impl Strategy<Value = Hash256> {
    any::<[u8; 32]>().prop_map(Hash256)
}

fn nonzero_hash() -> impl Strategy<Value = Hash256> {
    hash().prop_filter("non-zero", |h| !h.is_zero())
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..=VALUE_MAX).prop_map(Action::Put),
        1 => Just(Action::Delete),
    ]
}

/// 1..50 ops with keys of 1..=250 bytes, values of 0..=2000 bytes and strictly increasing
/// Lamport times (starting anywhere, steps up to 2^32).
fn ops(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Op>> {
    let base = 0..=u64::MAX - 64 * (1u64 << 32);
    (base, prop::collection::vec((1..=1u64 << 32, prop::collection::vec(any::<u8>(), 1..=KEY_MAX), action()), n))
        .prop_map(|(mut lamport, raw)| {
            raw.into_iter()
                .map(|(step, key, action)| {
                    lamport += step;
                    Op { lamport, key, action }
                })
                .collect()
        })
}

fn control_code() -> impl Strategy<Value = ControlCode> {
    prop_oneof![Just(ControlCode::Rts), Just(ControlCode::Eoe), Just(ControlCode::Reset), Just(ControlCode::Rotate)]
}

/// Any body of any kind (a SYNC names an arbitrary key fingerprint).
fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        4 => ops(1..50).prop_map(Body::Data),
        2 => ops(1..50).prop_map(Body::Atomic),
        1 => hash().prop_map(|app_key_fp| Body::Sync { app_key_fp }),
        1 => (control_code(), prop::collection::vec(any::<u8>(), 0..600)).prop_map(|(code, payload)| Body::Control { code, payload }),
        1 => prop::collection::vec(any::<u8>(), 0..3000).prop_map(Body::DbBlock),
        1 => prop::collection::vec(any::<u8>(), 0..3000).prop_map(Body::DbIndex),
    ]
}

fn link() -> impl Strategy<Value = Link> {
    (any::<u32>(), any::<u64>(), hash()).prop_map(|(writer, seq, hash)| Link { writer, seq, hash })
}

/// A draft the verifier must accept (apart from `key_gen`, drawn non-zero one time in eight):
/// writer below 2^31, seq 0 exactly when prev is zero, header Lamport time equal to the last
/// op's for data, SYNCs by the coordinator naming the application key, and data records
/// linking only to the coordinator.
fn draft() -> impl Strategy<Value = Draft> {
    let app_fp = WORLD.fx.meta.meta.app.fingerprint();
    let key_gen = prop_oneof![7 => Just(0u32), 1 => 1..=u32::MAX];
    let seq_prev = prop_oneof![1 => Just((0u64, Hash256::ZERO)), 3 => (1..=u64::MAX, nonzero_hash())];
    let shape = prop_oneof![
        // Data: any writer (the coordinator included); links only to the coordinator.
        4 => (ops(1..20), 0..=WRITER_MAX, prop::collection::vec((any::<u64>(), hash()), 0..20)).prop_map(
            |(ops, writer, links)| {
                let lamport = ops.last().unwrap().lamport;
                let links = links.into_iter().map(|(seq, hash)| Link { writer: DEFAULT_COORDINATOR, seq, hash }).collect();
                (writer, lamport, links, Body::Data(ops))
            }
        ),
        1 => (any::<u64>(), prop::collection::vec(link(), 0..20)).prop_map(move |(lamport, links)| {
            (DEFAULT_COORDINATOR, lamport, links, Body::Sync { app_key_fp: app_fp })
        }),
        2 => (0..=WRITER_MAX, any::<u64>(), prop::collection::vec(link(), 0..20), body().prop_filter("not data or sync", |b| {
            !matches!(b.kind(), Kind::Data | Kind::Sync)
        })),
    ];
    (shape, key_gen, seq_prev, any::<u64>()).prop_map(
        |((writer, lamport, links, body), key_gen, (seq, prev), epoch)| Draft {
            writer,
            key_gen,
            seq,
            lamport,
            epoch,
            prev,
            links,
            body,
        },
    )
}

fn seal(d: Draft) -> Record {
    let w = &*WORLD;
    let key = w.fx.app.writer(d.writer).unwrap();
    d.seal(w.fx.meta.name(), &w.limits, &key, &w.fx.app.data_key()).expect("a well-formed draft seals")
}

/// Any limits within the hard ceilings.
fn limits() -> impl Strategy<Value = Limits> {
    let c = Limits::CEILING;
    (
        1..=c.key_bytes_max,
        0..=c.value_bytes_max,
        1..=c.ops_per_record_max,
        0..=c.links_per_record_max,
        0..=c.record_bytes_max,
    )
        .prop_map(
            |(key_bytes_max, value_bytes_max, ops_per_record_max, links_per_record_max, record_bytes_max)| Limits {
                key_bytes_max,
                value_bytes_max,
                ops_per_record_max,
                links_per_record_max,
                record_bytes_max,
            },
        )
}

/// A UTF-8 label of at most `max` bytes (cut at a character boundary), mixing ASCII with
/// multi-byte characters.
fn label(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![3 => any::<char>(), 2 => prop::char::range(' ', '~')], 0..=max).prop_map(
        move |cs| {
            let mut s = String::new();
            for c in cs {
                if s.len() + c.len_utf8() > max {
                    break;
                }
                s.push(c);
            }
            s
        },
    )
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Truncate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), 1..=u8::MAX).prop_map(|(i, m)| Mutation::Flip(i, m)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => any::<Index>().prop_map(Mutation::Delete),
        1 => any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(bytes: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for m in muts {
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let i = i.index(b.len());
                b[i] ^= x;
            }
            Mutation::Insert(i, x) => {
                let i = i.index(b.len() + 1);
                b.insert(i, *x);
            }
            Mutation::Delete(i) if !b.is_empty() => {
                let i = i.index(b.len());
                b.remove(i);
            }
            Mutation::Truncate(i) => {
                let n = i.index(b.len() + 1);
                b.truncate(n);
            }
            _ => {}
        }
    }
    b
}

/// Arbitrary bytes: mostly random, sometimes a prefix of a valid encoding followed by random
/// bytes, so that the decoders get past their magic and version checks.
fn garbage(valid: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..4096),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 0..512)).prop_map(move |(cut, tail)| {
            let mut b = valid[..cut.index(valid.len() + 1)].to_vec();
            b.extend_from_slice(&tail);
            b
        }),
    ]
}

const KINDS: [Kind; 5] = [Kind::Data, Kind::Sync, Kind::Control, Kind::DbBlock, Kind::DbIndex];

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `Body::decode(kind, &body.encode(), &limits) == body` for every kind, and the encoded
    /// length of a data body is the sum of its ops' `encoded_len` plus the count.
    #[test]
    fn body_round_trip(body in body()) {
        let limits = Limits::default();
        prop_assert_eq!(body.check(&limits, match body.data_ops() {
            Some(ops) => ops.last().unwrap().lamport,
            None => 0,
        }), Ok(()));
        let enc = body.encode();
        if let Some(ops) = body.data_ops() {
            prop_assert_eq!(enc.len(), 4 + ops.iter().map(Op::encoded_len).sum::<usize>());
            // The count's top bit says atomic, and nothing else does.
            let atomic = u32::from_le_bytes(enc[..4].try_into().unwrap()) & psl_capsule::ATOMIC_FLAG != 0;
            prop_assert_eq!(atomic, matches!(body, Body::Atomic(_)));
        }
        prop_assert_eq!(Body::decode(body.kind(), &enc, &limits), Ok(body.clone()));
        // Data and SYNC bodies fill their bytes exactly: one more byte is refused.
        if matches!(body.kind(), Kind::Data | Kind::Sync) {
            let mut longer = enc.clone();
            longer.push(0);
            let trailing = matches!(Body::decode(body.kind(), &longer, &limits), Err(DecodeError::Trailing { .. }));
            prop_assert!(trailing);
        }
        // Any proper prefix of a data or SYNC body is refused.
        if matches!(body.kind(), Kind::Data | Kind::Sync) && !enc.is_empty() {
            prop_assert!(Body::decode(body.kind(), &enc[..enc.len() - 1], &limits).is_err());
        }
    }

    /// Limits within the ceiling round-trip through metadata with any label and app index.
    #[test]
    fn metadata_round_trip(
        seed in any::<[u8; 32]>(),
        app_index in 0..=WRITER_MAX,
        coordinator in prop_oneof![Just(DEFAULT_COORDINATOR), 0..=WRITER_MAX],
        label in label(255),
        created_ms in any::<u64>(),
        limits in limits(),
    ) {
        prop_assume!(OwnerKey::from_seed(&seed).is_ok());
        let owner = OwnerKey::from_seed(&seed).unwrap();
        let signed = new_capsule(&owner, app_index, &label, created_ms, limits).unwrap();
        prop_assert_eq!(&signed.meta.label, &label);
        prop_assert_eq!(signed.meta.app_index, app_index);
        prop_assert_eq!(signed.meta.created_ms, created_ms);
        prop_assert_eq!(signed.meta.policy.limits, limits);
        prop_assert_eq!(signed.meta.policy.coordinator, DEFAULT_COORDINATOR);
        prop_assert_eq!(signed.meta.app, owner.app(app_index).unwrap().public());
        let enc = signed.encode();
        prop_assert!(enc.len() <= 2 + META_BYTES_MAX + 64);
        prop_assert_eq!(SignedMetadata::encoded_len(&enc), Ok(enc.len()));
        let back = SignedMetadata::decode(&enc).unwrap();
        prop_assert_eq!(back.name(), signed.name());
        prop_assert_eq!(back.name(), signed.meta.name());
        prop_assert_eq!(&back, &signed);
        prop_assert_eq!(back.encode(), enc);
        prop_assert_eq!(Metadata::decode(&signed.meta.encode()), Ok(signed.meta.clone()));

        // Another coordinator: signed again, still round-trips, under another name.
        let mut meta = signed.meta.clone();
        meta.policy.coordinator = coordinator;
        let resigned = SignedMetadata::sign(meta, &owner.signing_key()).unwrap();
        prop_assert_eq!(resigned.name() == signed.name(), coordinator == DEFAULT_COORDINATOR);
        prop_assert_eq!(SignedMetadata::decode(&resigned.encode()), Ok(resigned.clone()));

        // One byte over the label limit is refused when signing.
        let mut long = signed.meta.clone();
        long.label = "x".repeat(LABEL_BYTES_MAX + 1);
        prop_assert_eq!(SignedMetadata::sign(long, &owner.signing_key()), Err(MetadataError::Label(LABEL_BYTES_MAX + 1)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A sealed draft decodes to the same record (bytes, header, hash), and the verifier accepts
    /// it and opens the same body; a non-zero key generation is decoded faithfully and refused.
    #[test]
    fn record_round_trip(d in draft()) {
        let w = &*WORLD;
        let rec = seal(d.clone());
        let h = rec.header();
        prop_assert_eq!(h.kind, d.body.kind());
        prop_assert_eq!(h.capsule, w.fx.meta.name());
        prop_assert_eq!((h.writer, h.key_gen, h.seq, h.lamport, h.epoch), (d.writer, d.key_gen, d.seq, d.lamport, d.epoch));
        prop_assert_eq!(h.prev, d.prev);
        prop_assert_eq!(&h.links, &d.links);
        prop_assert_eq!(rec.link(), Link { writer: d.writer, seq: d.seq, hash: rec.hash() });

        let back = Record::decode(rec.bytes(), &w.limits).unwrap();
        prop_assert_eq!(&back, &rec);
        prop_assert_eq!(back.bytes(), rec.bytes());
        prop_assert_eq!(back.header(), rec.header());
        prop_assert_eq!(back.hash(), rec.hash());
        prop_assert_eq!(back.header_bytes(), rec.header_bytes());
        prop_assert_eq!(back.body(), rec.body());
        prop_assert_eq!(back.body_digest(), rec.body_digest());
        prop_assert_eq!(back.signature(), rec.signature());
        prop_assert_eq!(Header::decode(rec.header_bytes(), &w.limits), Ok(rec.header().clone()));
        prop_assert_eq!(rec.header_bytes().len(), rec.header().encoded_len());

        if d.key_gen == 0 {
            let (verified, body) = w.verifier.verify_open(back.clone()).unwrap().split();
            prop_assert_eq!(&*verified, &rec);
            prop_assert_eq!(&body, &d.body);
            prop_assert_eq!(w.verifier.open(&verified), Ok(d.body.clone()));
            prop_assert_eq!(&*w.public.verify(back).unwrap(), &rec);
            prop_assert_eq!(&*w.verifier.verify_bytes(rec.bytes()).unwrap(), &rec);
        } else {
            prop_assert_eq!(w.verifier.verify(back.clone()).unwrap_err().reason, Reason::KeyGeneration(d.key_gen));
            prop_assert_eq!(w.public.verify(back).unwrap_err().reason, Reason::KeyGeneration(d.key_gen));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Garbage and mutations
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// No decoder panics on arbitrary bytes, and none accepts bytes that are not a valid
    /// encoding: whatever decodes is refused by the check above it, unless it is byte-identical
    /// to the valid encoding it was cut from.
    #[test]
    fn decoders_survive_garbage(
        rec_bytes in any::<Index>().prop_flat_map(|i| {
            let v = &WORLD.valid;
            garbage(v[i.index(v.len())].bytes())
        }),
        meta_bytes in garbage(&WORLD.meta),
        proof_bytes in garbage(&WORLD.proof),
        file_bytes in garbage(&WORLD.file),
        body_bytes in prop::collection::vec(any::<u8>(), 0..4096),
    ) {
        let w = &*WORLD;
        let limits = w.limits;
        let tight = Limits { key_bytes_max: 1, value_bytes_max: 0, ops_per_record_max: 1, links_per_record_max: 0, record_bytes_max: 0 };

        for l in [&limits, &Limits::CEILING, &tight] {
            if let Ok(r) = Record::decode(&rec_bytes, l) {
                if w.valid.iter().all(|v| v.bytes() != &rec_bytes[..]) {
                    prop_assert!(w.verifier.verify(r.clone()).is_err(), "garbage record accepted");
                    prop_assert!(w.public.verify(r).is_err(), "garbage record accepted without the data key");
                }
            }
            let _ = Header::decode(&rec_bytes, l);
            let _ = Header::decode(&body_bytes, l);
            for k in KINDS {
                let _ = Body::decode(k, &body_bytes, l);
                let _ = Body::decode(k, &rec_bytes, l);
            }
        }
        let _ = w.verifier.verify_bytes(&rec_bytes);

        if let Ok(m) = SignedMetadata::decode(&meta_bytes) {
            prop_assert_eq!(&meta_bytes, &w.meta, "garbage metadata accepted: {:?}", m);
        }
        let _ = SignedMetadata::decode(&body_bytes);

        if let Ok(p) = MembershipProof::decode(&proof_bytes) {
            if p.verify(Some(w.fx.meta.name())).is_ok() {
                prop_assert_eq!(&proof_bytes, &w.proof, "garbage proof verified");
            }
        }
        let _ = MembershipProof::decode(&body_bytes);

        for b in [&file_bytes, &body_bytes] {
            let s = file::scan(b);
            let a = audit_file(b, Some(w.fx.app.data_key()));
            let p = audit_file(b, None);
            if b[..] != w.file[..] {
                prop_assert!(!s.is_clean(), "garbage file scans clean");
                prop_assert!(!a.ok() && !p.ok(), "garbage file audits clean");
            }
        }
    }

    /// A few flips, insertions, deletions and truncations of a valid record's bytes either fail
    /// to decode, or decode to a record every verifier refuses, or give back the original bytes.
    #[test]
    fn mutated_records_are_refused(
        which in any::<Index>(),
        muts in prop::collection::vec(mutation(), 1..5),
    ) {
        let w = &*WORLD;
        let orig = &w.valid[which.index(w.valid.len())];
        let m = mutate(orig.bytes(), &muts);
        match Record::decode(&m, &w.limits) {
            Err(_) => prop_assert!(w.verifier.verify_bytes(&m).is_err()),
            Ok(r) if m == orig.bytes() => {
                prop_assert_eq!(&r, orig);
                prop_assert!(w.verifier.verify(r).is_ok());
            }
            Ok(r) => {
                let full = w.verifier.verify(r.clone());
                prop_assert!(full.is_err(), "mutation {:?} of {:?} accepted", muts, orig);
                prop_assert!(w.public.verify(r).is_err(), "mutation {:?} of {:?} accepted without the data key", muts, orig);
            }
        }
    }

    /// The same for a whole capsule file: a mutated file never audits clean.
    #[test]
    fn mutated_files_never_audit_clean(muts in prop::collection::vec(mutation(), 1..4)) {
        let w = &*WORLD;
        let m = mutate(&w.file, &muts);
        if m != w.file {
            prop_assert!(!audit_file(&m, None).ok(), "mutation {:?} unnoticed", muts);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Mutated metadata and proofs: refused unless byte-identical to the original.
    #[test]
    fn mutated_metadata_and_proofs_are_refused(muts in prop::collection::vec(mutation(), 1..4)) {
        let w = &*WORLD;
        let m = mutate(&w.meta, &muts);
        if m != w.meta {
            prop_assert!(SignedMetadata::decode(&m).is_err(), "mutation {:?} of the metadata accepted", muts);
        }
        let p = mutate(&w.proof, &muts);
        if p != w.proof {
            let ok = MembershipProof::decode(&p).and_then(|p| p.verify(Some(w.fx.meta.name())));
            prop_assert!(ok.is_err(), "mutation {:?} of the proof accepted", muts);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

/// Tight limits for the over-limit properties. The record size limit is generous enough for
/// everything else to fit, and is tested on its own.
const TIGHT: Limits = Limits {
    key_bytes_max: 8,
    value_bytes_max: 16,
    ops_per_record_max: 4,
    links_per_record_max: 2,
    record_bytes_max: 4096,
};

static TIGHT_FX: LazyLock<(Fixture, Verifier)> = LazyLock::new(|| {
    let fx = Fixture::with_limits(41, TIGHT);
    let v = fx.verifier();
    (fx, v)
});

/// Which limit a record probes, and how far from it: `n` ops / key bytes / value bytes / links.
#[derive(Debug, Clone, Copy)]
enum Probe {
    Ops(usize),
    Key(usize),
    Value(usize),
    Links(usize),
}

fn probe() -> impl Strategy<Value = Probe> {
    // Up to 3 under and 5 over each limit, so both sides of the boundary are hit.
    prop_oneof![
        (1..=TIGHT.ops_per_record_max as usize + 5).prop_map(Probe::Ops),
        (1..=TIGHT.key_bytes_max as usize + 5).prop_map(Probe::Key),
        (TIGHT.value_bytes_max as usize - 3..=TIGHT.value_bytes_max as usize + 5).prop_map(Probe::Value),
        (0..=TIGHT.links_per_record_max as usize + 5).prop_map(Probe::Links),
    ]
}

fn probe_draft(p: Probe, writer: u32) -> Draft {
    let (nops, klen, vlen, nlinks) = match p {
        Probe::Ops(n) => (n, 1, 1, 0),
        Probe::Key(n) => (1, n, 1, 0),
        Probe::Value(n) => (1, 1, n, 0),
        Probe::Links(n) => (1, 1, 1, n),
    };
    let ops: Vec<Op> = (0..nops).map(|i| Op::put(i as u64 + 1, vec![b'k'; klen], vec![b'v'; vlen])).collect();
    let links = (0..nlinks)
        .map(|i| Link { writer: DEFAULT_COORDINATOR, seq: i as u64, hash: Hash256([i as u8 + 1; 32]) })
        .collect();
    Draft {
        writer,
        key_gen: 0,
        seq: 0,
        lamport: nops as u64,
        epoch: 0,
        prev: Hash256::ZERO,
        links,
        body: Body::Data(ops),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A record sealed under generous limits (in the name of a tight-limits capsule) is read
    /// back under the tight limits: accepted when within them, refused with a `Limit` error
    /// naming the limit when over. Links are refused by the record decoder itself; op count,
    /// key and value by the body decoder inside the verifier. `Draft::seal` under the tight
    /// limits refuses exactly the same drafts.
    #[test]
    fn over_limit_records_are_refused(p in probe(), writer in 0..64u32) {
        let (fx, v) = &*TIGHT_FX;
        let generous = Limits::default();
        let key = fx.app.writer(writer).unwrap();
        let d = probe_draft(p, writer);
        let (n, max, field) = match p {
            Probe::Ops(n) => (n, TIGHT.ops_per_record_max, "op count"),
            Probe::Key(n) => (n, TIGHT.key_bytes_max, "key"),
            Probe::Value(n) => (n, TIGHT.value_bytes_max, "value"),
            Probe::Links(n) => (n, TIGHT.links_per_record_max, "link count"),
        };
        let over = n as u64 > max as u64;
        let limit_err = DecodeError::Limit { field, len: n as u64, max: max as u64 };

        // The body decoder on its own.
        let body_dec = Body::decode(Kind::Data, &d.body.encode(), &TIGHT);
        match p {
            Probe::Links(_) => prop_assert_eq!(body_dec, Ok(d.body.clone())),
            _ if over => prop_assert_eq!(body_dec, Err(limit_err.clone())),
            _ => prop_assert_eq!(body_dec, Ok(d.body.clone())),
        }

        // The sealer under the tight limits refuses exactly the over-limit drafts.
        let tight_seal = d.clone().seal(fx.meta.name(), &TIGHT, &key, &fx.app.data_key());
        prop_assert_eq!(tight_seal.is_err(), over, "{:?}", tight_seal);

        let rec = d.clone().seal(fx.meta.name(), &generous, &key, &fx.app.data_key()).unwrap();
        prop_assert!(rec.bytes().len() <= TIGHT.record_bytes_max as usize);
        let dec = Record::decode(rec.bytes(), &TIGHT);
        match p {
            Probe::Links(_) if over => {
                prop_assert_eq!(dec, Err(limit_err.clone()));
                prop_assert_eq!(v.verify_bytes(rec.bytes()).unwrap_err().reason, Reason::Encoding(limit_err));
            }
            _ if over => {
                let r = dec.unwrap();
                prop_assert_eq!(&r, &rec);
                prop_assert_eq!(v.verify_open(r).unwrap_err().reason, Reason::Body(limit_err));
            }
            _ => {
                let r = dec.unwrap();
                let (ok, body) = v.verify_open(r).unwrap().split();
                prop_assert_eq!(&*ok, &rec);
                prop_assert_eq!(body, d.body);
            }
        }
    }

    /// The record size limit: a record of `len` bytes decodes under `record_bytes_max >= len`
    /// and is refused under anything smaller.
    #[test]
    fn record_size_limit(which in any::<Index>(), slack in -64i64..64) {
        let w = &*WORLD;
        let rec = &w.valid[which.index(w.valid.len())];
        let len = rec.bytes().len() as i64;
        let max = (len + slack).max(0) as u32;
        let l = Limits { record_bytes_max: max, ..w.limits };
        let dec = Record::decode(rec.bytes(), &l);
        if (max as i64) < len {
            prop_assert_eq!(dec, Err(DecodeError::Limit { field: "record", len: len as u64, max: max as u64 }));
        } else {
            prop_assert_eq!(dec.as_ref(), Ok(rec));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The ceilings themselves: the largest key and link count any capsule may allow round-trip.
// ---------------------------------------------------------------------------------------------

/// Key lengths are written as a `u16`: a key as long as `Limits::CEILING` allows must still seal,
/// verify and open to the same body (this failed while the ceiling was 65536), and limits one
/// above the ceiling are refused.
#[test]
fn key_at_the_ceiling_round_trips() {
    let limits = Limits { key_bytes_max: Limits::CEILING.key_bytes_max, ..Limits::default() };
    assert!(!Limits { key_bytes_max: limits.key_bytes_max + 1, ..limits }.within_ceiling());
    let body = Body::Data(vec![Op::put(1, vec![b'k'; limits.key_bytes_max as usize], b"v".to_vec())]);
    assert_eq!(body.check(&limits, 1), Ok(()));
    assert_eq!(Body::decode(Kind::Data, &body.encode(), &limits), Ok(body.clone()));
    let fx = Fixture::with_limits(42, limits);
    let rec = fx.author(1).write_body(body.clone()).expect("a key at the ceiling seals");
    let (_, opened) = fx.verifier().verify_open(rec).expect("a sealed record opens").split();
    assert_eq!(opened, body);
}

/// Link counts are written as a `u16`: as many links as `Limits::CEILING` allows must seal (not
/// panic, as `Header::encode_into` did while the ceiling was 65536) and verify.
#[test]
fn links_at_the_ceiling_seal_and_verify() {
    let limits = Limits { links_per_record_max: Limits::CEILING.links_per_record_max, ..Limits::default() };
    assert!(!Limits { links_per_record_max: limits.links_per_record_max + 1, ..limits }.within_ceiling());
    let fx = Fixture::with_limits(43, limits);
    let links: Vec<Link> = (0..limits.links_per_record_max)
        .map(|i| Link { writer: DEFAULT_COORDINATOR, seq: i as u64, hash: Hash256([1; 32]) })
        .collect();
    let d = Draft {
        writer: 1,
        key_gen: 0,
        seq: 0,
        lamport: 1,
        epoch: 0,
        prev: Hash256::ZERO,
        links: links.clone(),
        body: Body::Data(vec![Op::put(1, "k", "v")]),
    };
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        d.seal(fx.meta.name(), &limits, &fx.app.writer(1).unwrap(), &fx.app.data_key())
    }));
    let rec = out.expect("Draft::seal must not panic").expect("links at the ceiling seal");
    let back = Record::decode(rec.bytes(), &limits).unwrap();
    assert_eq!(back.header().links, links);
    fx.verifier().verify(back).expect("a sealed record verifies");
}

/// Signing refuses what decoding refuses: an application index or a coordinator of 2^31 and
/// above, so an owner can never sign metadata that no reader can decode.
#[test]
fn signed_metadata_always_decodes() {
    let fx = Fixture::new(44);
    for (app_index, coordinator) in [(1u32 << 31, DEFAULT_COORDINATOR), (11, 1 << 31), (11, u32::MAX)] {
        let mut meta = fx.meta.meta.clone();
        meta.app_index = app_index;
        meta.policy.coordinator = coordinator;
        let signed = SignedMetadata::sign(meta, &fx.owner.signing_key());
        assert!(signed.is_err(), "app index {app_index}, coordinator {coordinator} must be refused");
        if let Ok(s) = signed {
            assert_eq!(
                SignedMetadata::decode(&s.encode()).as_ref(),
                Ok(&s),
                "signed metadata with app index {app_index}, coordinator {coordinator} does not decode"
            );
        }
    }
}

/// Decoding shared bytes gives the same record as decoding a copy, keeps those very bytes (no
/// copy), and refuses what `Record::decode` refuses.
#[test]
fn decode_shared_equals_decode_without_copying() {
    let fx = Fixture::new(45);
    let limits = Limits::default();
    let d = Draft {
        writer: 1,
        key_gen: 0,
        seq: 0,
        lamport: 2,
        epoch: 0,
        prev: Hash256::ZERO,
        links: Vec::new(),
        body: Body::Data(vec![Op::put(1, "k", "v"), Op::delete(2, "j")]),
    };
    let rec = d.seal(fx.meta.name(), &limits, &fx.app.writer(1).unwrap(), &fx.app.data_key()).unwrap();
    let shared = rec.shared_bytes();
    let back = Record::decode_shared(shared.clone(), &limits).unwrap();
    assert_eq!(back, Record::decode(rec.bytes(), &limits).unwrap());
    assert!(std::sync::Arc::ptr_eq(&back.shared_bytes(), &shared));
    assert_eq!(fx.verifier().open(&fx.verifier().verify(back).unwrap()).unwrap(), d_body());
    let cut: std::sync::Arc<[u8]> = rec.bytes()[..rec.bytes().len() - 1].into();
    assert_eq!(Record::decode_shared(cut.clone(), &limits).err(), Record::decode(&cut, &limits).err());
    assert!(Record::decode_shared(cut, &limits).is_err());
}

fn d_body() -> Body {
    Body::Data(vec![Op::put(1, "k", "v"), Op::delete(2, "j")])
}

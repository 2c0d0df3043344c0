//! A replica is a grow-only set of verified records: merge (set union) is commutative,
//! associative and idempotent, insertion order does not matter, equal replicas report equal
//! problems, and merging never loses a record. Checked over random subsets of one fixed pool of
//! records that includes forks (equivocation) as well as clean chains and a SYNC.

mod common;

use common::Fixture;
use proptest::prelude::*;
use psl_capsule::{ChainProblem, Kind, Record, Replica, Verified, DEFAULT_COORDINATOR};
use psl_crypto::Hash256;
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// The pool, built once.
struct Pool {
    fx: Fixture,
    records: Vec<Verified<Record>>,
    /// Clean chains (writer, records in seq order): no other record of the pool claims a slot
    /// of these writers.
    chains: Vec<(u32, Vec<usize>)>,
    /// Writer 4 forks at seq 0: `x0 <- x1` and `y0`.
    fork0: [usize; 3],
    /// Writer 5 forks at seq 1: `s0 <- a1` and `s0 <- b1`.
    fork1: [usize; 3],
}

const FORK0_WRITER: u32 = 4;
const FORK1_WRITER: u32 = 5;

static POOL: LazyLock<Pool> = LazyLock::new(|| {
    let fx = Fixture::new(60);
    let v = fx.verifier();
    // Writers 1, 2, 3 (three records each, the last linking to the SYNC) and the coordinator.
    let mut recs: Vec<Record> = fx.small_history();
    let sync = recs.iter().find(|r| r.header().kind == Kind::Sync).unwrap().clone();

    // Writer 4: two authors for the same writer, both starting at seq 0.
    let mut x = fx.author(FORK0_WRITER);
    let mut y = fx.author(FORK0_WRITER);
    let x0 = x.write_ops([("a", Some("x0"))]).unwrap();
    let x1 = x.write_ops([("b", Some("x1"))]).unwrap();
    let y0 = y.write_ops([("a", Some("y0"))]).unwrap();

    // Writer 5: one seq 0, then two different seq 1 from two authors resuming after it.
    let mut s = fx.author(FORK1_WRITER);
    let s0 = s.write_ops([("k", Some("s0"))]).unwrap();
    let head = psl_capsule::Head {
        writer: FORK1_WRITER,
        seq: 0,
        hash: s0.hash(),
        lamport: s0.header().lamport,
        epoch: s0.header().epoch,
    };
    let mut a = fx.author(FORK1_WRITER);
    let mut b = fx.author(FORK1_WRITER);
    a.resume(&head);
    b.resume(&head);
    let a1 = a.write_ops([("k", Some("a1"))]).unwrap();
    let b1 = b.write_ops([("k", None::<&str>)]).unwrap();

    // Writer 6: a longer chain that enters epoch 1 half-way.
    let mut w6 = fx.author(6);
    let mut chain6 = Vec::new();
    for i in 0..5 {
        if i == 2 {
            w6.enter_epoch(sync.link(), 1);
        }
        chain6.push(w6.write_ops([(format!("k{i}"), Some(vec![i as u8; i]))]).unwrap());
    }

    let base = recs.len();
    recs.extend([x0, x1, y0, s0, a1, b1]);
    recs.extend(chain6);
    let records: Vec<Verified<Record>> = recs.into_iter().map(|r| v.verify(r).unwrap()).collect();

    let mut chains = Vec::new();
    for w in [1, 2, 3, 6, DEFAULT_COORDINATOR] {
        let mut idx: Vec<usize> = (0..records.len()).filter(|&i| records[i].header().writer == w).collect();
        idx.sort_by_key(|&i| records[i].header().seq);
        chains.push((w, idx));
    }
    assert!(records.len() <= 32, "pool subsets are u32 masks");
    Pool { fx, records, chains, fork0: [base, base + 1, base + 2], fork1: [base + 3, base + 4, base + 5] }
});

fn pool_len() -> usize {
    POOL.records.len()
}

fn mask() -> impl Strategy<Value = u32> {
    let full = (1u64 << pool_len()) as u32 - 1;
    prop_oneof![
        // Any subset, plus the two extremes and sparse subsets, which random bits rarely give.
        6 => any::<u32>().prop_map(move |m| m & full),
        1 => Just(0),
        1 => Just(full),
        2 => (any::<u32>(), any::<u32>()).prop_map(move |(a, b)| a & b & full),
    ]
}

fn order() -> impl Strategy<Value = Vec<usize>> {
    Just((0..pool_len()).collect::<Vec<_>>()).prop_shuffle()
}

fn replica_of(mask: u32) -> Replica {
    replica_in_order(mask, &(0..pool_len()).collect::<Vec<_>>())
}

/// The replica holding the records of `mask`, inserted in the order `order` visits them.
fn replica_in_order(mask: u32, order: &[usize]) -> Replica {
    let mut r = Replica::new(POOL.fx.meta.name());
    for &i in order {
        if mask & (1 << i) != 0 {
            assert!(r.insert(POOL.records[i].clone()).unwrap(), "record {i} inserted twice");
        }
    }
    r
}

fn union(a: &Replica, b: &Replica) -> Replica {
    let mut out = a.clone();
    out.merge(b).unwrap();
    out
}

fn hashes(r: &Replica) -> BTreeSet<Hash256> {
    r.iter().map(|v| v.hash()).collect()
}

fn mask_hashes(mask: u32) -> BTreeSet<Hash256> {
    (0..pool_len()).filter(|i| mask & (1 << i) != 0).map(|i| POOL.records[i].hash()).collect()
}

/// Everything observable about a replica, for comparing two that should be equal.
fn assert_same(a: &Replica, b: &Replica) -> Result<(), TestCaseError> {
    prop_assert_eq!(a, b);
    prop_assert_eq!(a.len(), b.len());
    prop_assert_eq!(a.check(), b.check());
    prop_assert_eq!(a.heads(), b.heads());
    prop_assert_eq!(a.writers(), b.writers());
    prop_assert_eq!(a.max_lamport(), b.max_lamport());
    prop_assert_eq!(a.latest_sync().map(|r| r.hash()), b.latest_sync().map(|r| r.hash()));
    let ia: Vec<_> = a.iter().map(|r| r.hash()).collect();
    let ib: Vec<_> = b.iter().map(|r| r.hash()).collect();
    prop_assert_eq!(ia, ib);
    let ca: Vec<_> = a.in_chain_order().map(|r| r.hash()).collect();
    let cb: Vec<_> = b.in_chain_order().map(|r| r.hash()).collect();
    prop_assert_eq!(ca, cb);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A ∪ B == B ∪ A, and both equal the replica built from the union of the subsets.
    #[test]
    fn merge_is_commutative(a in mask(), b in mask()) {
        let (ra, rb) = (replica_of(a), replica_of(b));
        let ab = union(&ra, &rb);
        let ba = union(&rb, &ra);
        assert_same(&ab, &ba)?;
        assert_same(&ab, &replica_of(a | b))?;
    }

    /// (A ∪ B) ∪ C == A ∪ (B ∪ C).
    #[test]
    fn merge_is_associative(a in mask(), b in mask(), c in mask()) {
        let (ra, rb, rc) = (replica_of(a), replica_of(b), replica_of(c));
        let left = union(&union(&ra, &rb), &rc);
        let right = union(&ra, &union(&rb, &rc));
        assert_same(&left, &right)?;
        assert_same(&left, &replica_of(a | b | c))?;
    }

    /// A ∪ A == A, merging adds nothing, and so does merging any subset of A or the empty replica.
    #[test]
    fn merge_is_idempotent(a in mask(), sub in mask()) {
        let ra = replica_of(a);
        let mut again = ra.clone();
        prop_assert_eq!(again.merge(&ra).unwrap(), 0);
        assert_same(&again, &ra)?;
        prop_assert_eq!(again.merge(&replica_of(a & sub)).unwrap(), 0);
        prop_assert_eq!(again.merge(&Replica::new(POOL.fx.meta.name())).unwrap(), 0);
        assert_same(&again, &ra)?;
        let mut empty = Replica::new(POOL.fx.meta.name());
        prop_assert_eq!(empty.merge(&ra).unwrap(), ra.len());
        assert_same(&empty, &ra)?;
    }

    /// The order records arrive in, one by one or as merged batches, does not matter; and
    /// inserting a record already held reports it as not new.
    #[test]
    fn insertion_order_does_not_matter(a in mask(), o1 in order(), o2 in order(), split in mask()) {
        let r1 = replica_in_order(a, &o1);
        let r2 = replica_in_order(a, &o2);
        assert_same(&r1, &r2)?;
        assert_same(&r1, &replica_of(a))?;
        // The same records arriving as two batches, merged either way round.
        let lo = replica_in_order(a & split, &o1);
        let hi = replica_in_order(a & !split, &o2);
        assert_same(&union(&lo, &hi), &r1)?;
        assert_same(&union(&hi, &lo), &r1)?;
        // Re-inserting anything held is a no-op.
        let mut r3 = r1.clone();
        for &i in &o2 {
            if a & (1 << i) != 0 {
                prop_assert!(!r3.insert(POOL.records[i].clone()).unwrap());
            }
        }
        assert_same(&r3, &r1)?;
    }

    /// Merge never loses a record: the result holds every record of both sides, byte for byte,
    /// and nothing else; merge reports exactly the records that were new.
    #[test]
    fn merge_never_loses_a_record(a in mask(), b in mask(), o in order()) {
        let ra = replica_in_order(a, &o);
        let rb = replica_of(b);
        let mut m = ra.clone();
        let added = m.merge(&rb).unwrap();
        prop_assert_eq!(added, (b & !a).count_ones() as usize);
        prop_assert_eq!(m.len(), (a | b).count_ones() as usize);
        prop_assert_eq!(hashes(&m), mask_hashes(a | b));
        for side in [&ra, &rb] {
            for r in side.iter() {
                let kept = m.get(&r.hash());
                prop_assert_eq!(kept.map(|k| k.bytes()), Some(r.bytes()));
                // Every record keeps its (writer, seq) slot.
                let h = r.header();
                prop_assert!(m.at(h.writer, h.seq).any(|k| k.hash() == r.hash()));
            }
        }
        // Problems found in one side are never resolved by merging: equivocation stays visible.
        for p in ra.check().into_iter().chain(rb.check()) {
            if let ChainProblem::Equivocation { writer, seq, hashes } = p {
                let found = m.check().into_iter().any(|q| matches!(q, ChainProblem::Equivocation { writer: w, seq: s, hashes: hs }
                    if w == writer && s == seq && hashes.iter().all(|h| hs.contains(h))));
                prop_assert!(found, "equivocation of writer {} seq {} lost in merge", writer, seq);
            }
        }
    }

    /// Replicas holding the same records report the same problems, and the problems are a
    /// function of the set: the equivocations reported are exactly the forks present.
    #[test]
    fn check_is_a_function_of_the_set(a in mask(), o1 in order(), o2 in order()) {
        let r1 = replica_in_order(a, &o1);
        let r2 = replica_in_order(a, &o2);
        prop_assert_eq!(r1.check(), r2.check());
        let has = |i: usize| a & (1 << i) != 0;
        let p = &*POOL;
        let mut expected = Vec::new();
        if has(p.fork0[0]) && has(p.fork0[2]) {
            expected.push((FORK0_WRITER, 0));
        }
        if has(p.fork1[1]) && has(p.fork1[2]) {
            expected.push((FORK1_WRITER, 1));
        }
        let equivocations: Vec<(u32, u64)> = r1
            .check()
            .into_iter()
            .filter_map(|p| match p {
                ChainProblem::Equivocation { writer, seq, hashes } => {
                    assert_eq!(hashes.len(), 2);
                    Some((writer, seq))
                }
                _ => None,
            })
            .collect();
        prop_assert_eq!(equivocations, expected);
        // Every clean chain complete, plus forked writers' records short of a fork: no problem.
        let clean: u32 = p.chains.iter().flat_map(|(_, c)| c.iter()).fold(0, |m, &i| m | 1 << i);
        // (Prefix-closed: a later record only with the one before it, else it is a gap.)
        let [x0, x1, _] = p.fork0;
        let [s0, a1, _] = p.fork1;
        let bit = |i: usize| if has(i) { 1u32 << i } else { 0 };
        let unforked = bit(x0) | if has(x0) { bit(x1) } else { 0 } | bit(s0) | if has(s0) { bit(a1) } else { 0 };
        let sound = replica_in_order(clean | unforked, &o1);
        prop_assert!(sound.check().is_empty(), "{:?}", sound.check());
    }

    /// A replica holding every record of a chain, in any order and whatever else it holds,
    /// names the chain's last record as the writer's head. A fork stops the head before it.
    #[test]
    fn heads_are_the_ends_of_complete_chains(which in any::<prop::sample::Index>(), others in mask(), o in order()) {
        let p = &*POOL;
        let (writer, chain) = &p.chains[which.index(p.chains.len())];
        let mine: u32 = chain.iter().fold(0, |m, &i| m | 1 << i);
        let r = replica_in_order(others | mine, &o);
        let last = &p.records[*chain.last().unwrap()];
        let head = r.heads().get(writer).copied();
        prop_assert!(head.is_some(), "writer {} has no head", writer);
        let head = head.unwrap();
        prop_assert_eq!(head.writer, *writer);
        prop_assert_eq!(head.hash, last.hash());
        prop_assert_eq!(head.seq, last.header().seq);
        prop_assert_eq!(head.lamport, last.header().lamport);
        prop_assert_eq!(head.epoch, last.header().epoch);

        // The forked writers: with both sides of a fork present, the head stops before it.
        let has = |i: usize| (others | mine) & (1 << i) != 0;
        let heads = r.heads();
        let [x0, x1, y0] = p.fork0;
        let h4 = heads.get(&FORK0_WRITER).map(|h| h.hash);
        match (has(x0), has(x1), has(y0)) {
            (true, _, true) => prop_assert_eq!(h4, None),
            (true, true, false) => prop_assert_eq!(h4, Some(p.records[x1].hash())),
            (true, false, false) => prop_assert_eq!(h4, Some(p.records[x0].hash())),
            (false, _, true) => prop_assert_eq!(h4, Some(p.records[y0].hash())),
            (false, _, false) => prop_assert_eq!(h4, None),
        }
        let [s0, a1, b1] = p.fork1;
        let h5 = heads.get(&FORK1_WRITER).map(|h| h.hash);
        match (has(s0), has(a1), has(b1)) {
            (false, _, _) => prop_assert_eq!(h5, None),
            (true, true, true) | (true, false, false) => prop_assert_eq!(h5, Some(p.records[s0].hash())),
            (true, true, false) => prop_assert_eq!(h5, Some(p.records[a1].hash())),
            (true, false, true) => prop_assert_eq!(h5, Some(p.records[b1].hash())),
        }
    }
}

/// Replicas of different capsules do not merge, and a failed merge changes nothing.
#[test]
fn merge_across_capsules_is_refused() {
    let other = Fixture::new(61);
    let v = other.verifier();
    let mut theirs = Replica::new(other.meta.name());
    for r in other.small_history() {
        theirs.insert(v.verify(r).unwrap()).unwrap();
    }
    let mut ours = replica_of(u32::MAX >> (32 - pool_len()));
    let before = ours.clone();
    assert!(ours.merge(&theirs).is_err());
    assert_eq!(ours, before);
    assert!(ours.insert(theirs.iter().next().unwrap().clone()).is_err());
    assert_eq!(ours, before);
}

/// The pool is what the properties assume: the full pool reports exactly the two forks.
#[test]
fn pool_has_the_forks_it_claims() {
    let full = replica_of(u32::MAX >> (32 - pool_len()));
    let checks: Vec<&str> = full.check().iter().map(|p| p.check()).collect();
    assert_eq!(checks, ["equivocation", "equivocation"], "{:?}", full.check());
    assert_eq!(full.len(), pool_len());
}

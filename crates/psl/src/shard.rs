//! The shard map capsule (`docs/protocol/sharding.md` §3) and `psl shard show|which`.
//!
//! `psl up --kv` and `psl up --config F --init` make a *map capsule* beside the KV capsule:
//! the same owner and application (so every role that can read the KV capsule can read the
//! map), certified writer keys, and one data record per map version, written by
//! [`MAP_WRITER`] with one op that puts the encoded map under [`MAP_KEY`]. The file is a
//! portable `.capsule` file (`docs/formats/datacapsule.md`): anyone may copy or relay it,
//! only the owner can write a map into it, and only holders of the data key can read it.
//!
//! A reader ([`read`]) refuses the whole file unless:
//! - the metadata is signed by the owner it expects, and the capsule certifies writer keys;
//! - every record verifies (the audit of `psl capsule verify`, bodies opened);
//! - every data record is writer [`MAP_WRITER`]'s, holds exactly one put of [`MAP_KEY`],
//!   and decodes as a map that passes [`ShardMap::check`];
//! - map versions strictly increase along the writer's chain, so chain order is version
//!   order;
//! - the newest map names the KV capsule the reader expects (a map of another deployment is
//!   refused).
//!
//! What this does not stop (piece 4 of the design): a relay that hands out an older copy of
//! the whole file. The reader gets an older map, never a forged one; the `map_version` that
//! each shard's coordinator will announce in its RTS is what tells a front end its map is
//! behind.

use crate::util::{data_key_for, now_ms, read_owner_key, write_atomic};
use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use psl_capsule::{
    audit_file, file, Action, Body, CapsuleFile, CapsuleName, Kind, Record, Replica, SignedMetadata, Verifier,
    WriterKeys,
};
use psl_crypto::{DataKey, Hash256, OwnerKey, OwnerPublicKey};
use psl_scl::shard::{point, ShardMap, MAP_KEY, MAP_WRITER};
use serde_json::json;
use std::path::{Path, PathBuf};

/// The label of a map capsule made for the KV capsule labelled `kv_label`.
fn map_label(kv_label: &str) -> String {
    format!("{kv_label}-map")
}

/// The newest map of a map capsule, with the record that holds it.
#[derive(Debug, Clone)]
pub struct CurrentMap {
    /// The map.
    pub map: ShardMap,
    /// The hash of the record that holds it.
    pub record: Hash256,
    /// That record's seq in [`MAP_WRITER`]'s chain.
    pub seq: u64,
}

/// Makes the map capsule `out` for the KV capsule `kv` (same owner and application index),
/// unless it exists; an existing one must be the owner's, of the same application.
pub fn create(owner: &OwnerKey, kv: &SignedMetadata, out: &Path) -> Result<()> {
    if out.exists() {
        let meta = metadata(out)?;
        if meta.meta.owner != kv.meta.owner || meta.meta.app_index != kv.meta.app_index {
            bail!(
                "{} is not the map capsule of KV capsule {} (another owner or application): remove it to make a new one",
                out.display(),
                kv.name()
            );
        }
        return Ok(());
    }
    if owner.public() != kv.meta.owner {
        bail!("the owner key is not the KV capsule {}'s owner", kv.name());
    }
    let meta = psl_capsule::new_capsule_with(
        owner,
        kv.meta.app_index,
        &map_label(&kv.meta.label),
        now_ms(),
        file::default_limits(),
        WriterKeys::Certified,
    )
    .context("making the map capsule's metadata")?;
    write_atomic(out, &file::encode(&meta, []), 0o644)
}

/// The signed metadata of the capsule file at `path`.
fn metadata(path: &Path) -> Result<SignedMetadata> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(CapsuleFile::parse(&bytes).with_context(|| format!("{}", path.display()))?.metadata)
}

/// A map capsule file, verified.
struct Loaded {
    meta: SignedMetadata,
    records: Vec<Record>,
    replica: Replica,
    /// The newest map; `None` while the file holds none.
    current: Option<CurrentMap>,
}

/// Reads the map capsule at `path`, checked as the module docs say, with the data key of its
/// application. `owner` is the owner the reader trusts; `kv`, when given, the KV capsule the
/// newest map must name.
fn load(path: &Path, owner: &OwnerPublicKey, kv: Option<&CapsuleName>, data_key: DataKey) -> Result<Loaded> {
    let at = path.display();
    let bytes = std::fs::read(path).with_context(|| format!("reading {at}"))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{at}"))?;
    let meta = f.metadata;
    if &meta.meta.owner != owner {
        bail!("{at}: the map capsule's owner is {}, not the trusted owner {owner}", meta.meta.owner);
    }
    if meta.meta.policy.writer_keys != WriterKeys::Certified {
        bail!("{at}: a map capsule must certify its writer keys (this one derives them)");
    }
    let audit = audit_file(&bytes, Some(data_key.clone()));
    if let Some(p) = audit.problems.first() {
        bail!("{at} does not verify ({} problems; see `psl capsule verify`): {p}", audit.problems.len());
    }
    if !audit.opened {
        bail!("{at}: the data key does not open this capsule's records");
    }
    let replica = audit.replica.context("metadata verified, so the audit built a replica")?;
    let v = Verifier::new(meta.clone(), Some(data_key));
    v.learn_statements(&f.records);
    let mut maps: Vec<&Record> = Vec::new();
    for r in &f.records {
        let h = r.header();
        match h.kind {
            Kind::Cert => {}
            Kind::Data if h.writer == MAP_WRITER => maps.push(r),
            Kind::Data => bail!(
                "{at}: record {} is writer {}'s; only writer {MAP_WRITER} writes maps (someone with the application key \
                 certified another writer here)",
                r.hash(),
                h.writer
            ),
            k => bail!("{at}: record {} is of kind {k:?}; a map capsule holds maps and certificates only", r.hash()),
        }
    }
    maps.sort_by_key(|r| r.header().seq);
    let mut current: Option<CurrentMap> = None;
    for r in maps {
        let opened = v.verify_open(r.clone()).map_err(|e| anyhow!("{at}: record {}: {e}", r.hash()))?;
        let map = match &opened.body {
            Body::Data(ops) => match ops.as_slice() {
                [op] if op.key == MAP_KEY => match &op.action {
                    Action::Put(b) => ShardMap::decode(b).map_err(|e| anyhow!("{at}: record {}: {e}", r.hash()))?,
                    Action::Delete => bail!("{at}: record {} deletes the map", r.hash()),
                },
                _ => bail!("{at}: record {} is not one put of the map", r.hash()),
            },
            _ => bail!("{at}: record {} is not a data record", r.hash()),
        };
        if let Some(c) = &current {
            if map.map_version <= c.map.map_version {
                bail!(
                    "{at}: record {} holds map version {} after version {}: versions must increase",
                    r.hash(),
                    map.map_version,
                    c.map.map_version
                );
            }
        }
        current = Some(CurrentMap { map, record: r.hash(), seq: r.header().seq });
    }
    if let (Some(c), Some(kv)) = (&current, kv) {
        if !c.map.shards.iter().any(|s| s.capsule == kv.0 .0) {
            bail!("{at}: map version {} does not name KV capsule {kv}: it is another deployment's", c.map.map_version);
        }
    }
    Ok(Loaded { meta, records: f.records, replica, current })
}

/// The newest map in the map capsule at `path` (checked as the module docs say), as a role of the KV capsule
/// `kv` reads it: with the KV application's data key, trusting `kv`'s owner, and refusing a
/// map that does not name `kv`.
pub fn read_as_member(path: &Path, kv: &SignedMetadata, data_key: DataKey) -> Result<Option<CurrentMap>> {
    Ok(load(path, &kv.meta.owner, Some(&kv.name()), data_key)?.current)
}

/// The newest map in the map capsule at `path` (checked as the module docs say), read with the owner key.
pub fn read(path: &Path, owner: &OwnerKey, kv: Option<&CapsuleName>) -> Result<Option<CurrentMap>> {
    let meta = metadata(path)?;
    let key = data_key_for(owner, &meta)?;
    Ok(load(path, &owner.public(), kv, key)?.current)
}

/// Writes `map` as the map capsule's next map, unless its newest map already has the same
/// shards, routes and moves. The version written is the newest's plus one (1 for the
/// first); `map.map_version` is ignored. Returns the newest map and whether it was written.
pub fn publish(path: &Path, owner: &OwnerKey, kv: &CapsuleName, mut map: ShardMap) -> Result<(CurrentMap, bool)> {
    let meta = metadata(path)?;
    let key = data_key_for(owner, &meta)?;
    let Loaded { meta, mut records, replica, current } = load(path, &owner.public(), None, key)?;
    if !map.shards.iter().any(|s| s.capsule == kv.0 .0) {
        bail!("the map to publish does not name KV capsule {kv}");
    }
    let prev = current.as_ref().map_or(0, |c| c.map.map_version);
    map.map_version = prev.checked_add(1).context("map versions exhausted")?;
    if let Some(c) = current {
        let same = (&c.map.shards, &c.map.routes, &c.map.moves) == (&map.shards, &map.routes, &map.moves);
        if same {
            return Ok((c, false));
        }
    }
    map.check().context("the map to publish")?;
    let app = owner.app(meta.meta.app_index)?;
    let mut author = psl_capsule::Author::new(&meta, &app, MAP_WRITER).context("the map writer's key")?;
    if let Some(h) = replica.heads().get(&MAP_WRITER) {
        author.resume(h);
    }
    author.observe(replica.max_lamport());
    if !records.iter().any(|r| r.header().kind == Kind::Cert && r.header().writer == MAP_WRITER) {
        let cert =
            author.write_own_cert().context("a certified author")?.context("sealing the map writer's certificate")?;
        records.push(cert);
    }
    let rec = author.write_ops([(MAP_KEY.to_vec(), Some(map.encode()))]).context("sealing the map record")?;
    let (hash, seq) = (rec.hash(), rec.header().seq);
    records.push(rec);
    write_atomic(path, &file::encode(&meta, &records), 0o644)?;
    // Read back what was written: the file must verify and hold exactly this map.
    let back = read(path, owner, Some(kv))?.context("the map just written is not there")?;
    if back.record != hash || back.map != map {
        bail!("{}: reading back the map just written gave another one", path.display());
    }
    Ok((CurrentMap { map, record: hash, seq }, true))
}

/// Refuses to replace the map `current` with `next` unless both have the same shards (by
/// capsule, in order) and routes, and neither moves a range: only the front ends' addresses
/// may change. A deployment started again with another shard count would otherwise route keys
/// away from the capsules that hold them, and they would read as missing (moving ranges is
/// `psl shard split`'s work, sharding.md §6, not built).
pub fn same_layout(current: &ShardMap, next: &ShardMap) -> Result<()> {
    let capsules = |m: &ShardMap| m.shards.iter().map(|s| hex::encode(s.capsule)).collect::<Vec<_>>();
    if capsules(current) != capsules(next) {
        bail!(
            "the store holds {} shard(s) (map version {}), this start asks for {}: changing the shard count of a store              would hide the keys of the ranges that move (psl shard split is not built); start with the same count, or              remove the KV directory to start an empty store",
            current.shards.len(),
            current.map_version,
            next.shards.len()
        );
    }
    if current.routes != next.routes || !current.moves.is_empty() || !next.moves.is_empty() {
        bail!(
            "map version {} routes the key space differently: a start of the same shards must keep their ranges",
            current.map_version
        );
    }
    Ok(())
}

/// The map capsule a `psl shard` command reads, and how it prints.
#[derive(clap::Args)]
pub struct MapArgs {
    /// The map capsule (`DIR/kv/map.capsule` of `psl up --kv`, `kv-map.capsule` in a
    /// cluster's shared directory).
    #[arg(long)]
    map: PathBuf,
    /// The owner key (the map is sealed under the KV application's data key).
    #[arg(long)]
    owner: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `psl shard ...`: the shard map of a KV deployment.
#[derive(Subcommand)]
pub enum ShardCmd {
    /// Verify a map capsule and print its newest map: shards, capsules, front ends, routes.
    Show(MapArgs),
    /// Which shard, and which capsule, holds each key under the newest map: what a client
    /// checks an answer's capsule against.
    Which {
        /// The map capsule, and how to print.
        #[command(flatten)]
        m: MapArgs,
        /// The keys (as memcached sees them; `{tag}` hash tags apply).
        #[arg(required = true)]
        keys: Vec<String>,
    },
}

/// Runs `psl shard ...`.
pub fn run(cmd: ShardCmd) -> Result<i32> {
    match cmd {
        ShardCmd::Show(m) => show(&m.map, &m.owner, m.json),
        ShardCmd::Which { m, keys } => which(&m.map, &m.owner, &keys, m.json),
    }
}

fn newest(map: &Path, owner: &Path) -> Result<CurrentMap> {
    let owner = read_owner_key(owner)?;
    read(map, &owner, None)?.with_context(|| format!("{} holds no map yet", map.display()))
}

fn show(path: &Path, owner: &Path, json: bool) -> Result<i32> {
    let c = newest(path, owner)?;
    let m = &c.map;
    let end = |i: usize| m.routes.get(i + 1).map_or(u64::MAX, |r| r.first - 1);
    if json {
        let shards: Vec<_> = m
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| json!({ "shard": i, "capsule": hex::encode(s.capsule), "front_ends": s.front_ends }))
            .collect();
        let routes: Vec<_> = m
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| json!({ "first": r.first, "last": end(i), "shard": r.shard }))
            .collect();
        let moves: Vec<_> = m
            .moves
            .iter()
            .map(|v| json!({ "first": v.first, "last": v.last, "from": v.from, "to": v.to, "phase": format!("{:?}", v.phase).to_lowercase() }))
            .collect();
        println!(
            "{}",
            json!({ "map_version": m.map_version, "record": c.record.to_hex(), "seq": c.seq,
                    "shards": shards, "routes": routes, "moves": moves })
        );
    } else {
        println!("map version {} (record {}, seq {})", m.map_version, c.record, c.seq);
        for (i, s) in m.shards.iter().enumerate() {
            println!("shard {i}: capsule {} front ends {}", hex::encode(s.capsule), s.front_ends.join(","));
        }
        for (i, r) in m.routes.iter().enumerate() {
            println!("points {:#018x} ..= {:#018x} -> shard {}", r.first, end(i), r.shard);
        }
        for v in &m.moves {
            println!("moving {:#018x} ..= {:#018x} from shard {} to {} ({:?})", v.first, v.last, v.from, v.to, v.phase);
        }
    }
    Ok(0)
}

fn which(path: &Path, owner: &Path, keys: &[String], json: bool) -> Result<i32> {
    let c = newest(path, owner)?;
    let rows: Vec<(String, u64, u16, String)> = keys
        .iter()
        .map(|k| {
            let p = point(k.as_bytes());
            let s = c.map.shard_of_point(p);
            (k.clone(), p, s, hex::encode(c.map.shards[s as usize].capsule))
        })
        .collect();
    if json {
        let keys: Vec<_> =
            rows.iter().map(|(k, p, s, cap)| json!({ "key": k, "point": p, "shard": s, "capsule": cap })).collect();
        println!("{}", json!({ "map_version": c.map.map_version, "keys": keys }));
    } else {
        for (k, p, s, cap) in rows {
            println!("{k}: point {p:#018x} shard {s} capsule {cap}");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::Author;

    struct Setup {
        _dir: tempfile::TempDir,
        owner: OwnerKey,
        kv: SignedMetadata,
        map: PathBuf,
    }

    fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let owner = OwnerKey::from_seed(b"psl shard map tests").unwrap();
        let kv =
            psl_capsule::new_capsule_with(&owner, 7, "kv", 1, file::default_limits(), WriterKeys::Certified).unwrap();
        let map = dir.path().join("map.capsule");
        create(&owner, &kv, &map).unwrap();
        Setup { _dir: dir, owner, kv, map }
    }

    fn one(s: &Setup, fronts: &[&str]) -> ShardMap {
        ShardMap::single(0, s.kv.name().0 .0, fronts.iter().map(|f| f.to_string()).collect())
    }

    /// Appends a data record that puts `value` under `key`, as `writer` (certified by the
    /// application key, which only the owner and the leader hold).
    fn append_as(s: &Setup, writer: u32, key: &[u8], value: Vec<u8>) {
        let bytes = std::fs::read(&s.map).unwrap();
        let f = CapsuleFile::parse(&bytes).unwrap();
        let app = s.owner.app(f.metadata.meta.app_index).unwrap();
        let mut a = Author::new(&f.metadata, &app, writer).unwrap();
        let mut records = f.records.clone();
        if let Some(h) = audit_file(&bytes, None).replica.unwrap().heads().get(&writer) {
            a.resume(h);
        }
        if !records.iter().any(|r| r.header().kind == Kind::Cert && r.header().writer == writer) {
            records.push(a.write_own_cert().unwrap().unwrap());
        }
        records.push(a.write_ops([(key.to_vec(), Some(value))]).unwrap());
        std::fs::write(&s.map, file::encode(&f.metadata, &records)).unwrap();
    }

    #[test]
    fn published_maps_read_back_in_version_order_and_an_unchanged_map_is_not_written_again() {
        let s = setup();
        assert!(read(&s.map, &s.owner, Some(&s.kv.name())).unwrap().is_none(), "a new map capsule holds no map");
        let (first, written) = publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7961"])).unwrap();
        assert!(written);
        assert_eq!(first.map.map_version, 1);
        let (same, written) = publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7961"])).unwrap();
        assert!(!written, "the same shards, routes and moves are not a new map");
        assert_eq!((same.map.map_version, same.record), (1, first.record));
        let (second, written) =
            publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7961", "10.0.0.2:7962"])).unwrap();
        assert!(written);
        assert_eq!(second.map.map_version, 2);
        let got = read(&s.map, &s.owner, Some(&s.kv.name())).unwrap().unwrap();
        assert_eq!(got.map, second.map);
        assert_eq!(got.record, second.record);
        // The key's shard is the map's: one shard holds every point.
        assert_eq!(got.map.shard_of(b"any key"), 0);
        // Made again: the file is kept.
        create(&s.owner, &s.kv, &s.map).unwrap();
        assert_eq!(read(&s.map, &s.owner, None).unwrap().unwrap().map.map_version, 2);
    }

    #[test]
    fn only_the_front_ends_addresses_may_change_between_starts() {
        let s = setup();
        let one = one(&s, &["10.0.0.1:7961"]);
        let mut moved = one.clone();
        moved.shards[0].front_ends = vec!["10.0.0.2:7961".into()];
        same_layout(&one, &moved).unwrap();
        let mut two = one.clone();
        two.shards.push(psl_scl::shard::Shard { capsule: [9; 32], front_ends: vec!["10.0.0.3:7961".into()] });
        two.routes.push(psl_scl::shard::Route { first: 1 << 63, shard: 1 });
        let e = same_layout(&one, &two).unwrap_err().to_string();
        assert!(e.contains("holds 1 shard(s)") && e.contains("asks for 2"), "{e}");
        assert!(same_layout(&two, &one).is_err());
        let mut recut = two.clone();
        recut.routes[1].first = 1 << 62;
        assert!(same_layout(&two, &recut).unwrap_err().to_string().contains("routes the key space differently"));
    }

    #[test]
    fn a_map_from_any_writer_but_the_map_writer_is_refused() {
        let s = setup();
        publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7961"])).unwrap();
        // Writer 65552 (node 1's first writer): certified by the application key, as the
        // leader certifies a front end, but not the map's writer. Its map would send every
        // key to an address of its choosing.
        let mut forged = one(&s, &["203.0.113.9:7961"]);
        forged.map_version = 99;
        append_as(&s, psl_scl::writer_index(1, 0, 0).unwrap(), MAP_KEY, forged.encode());
        let e = read(&s.map, &s.owner, None).unwrap_err().to_string();
        assert!(e.contains("writer 65536") && e.contains("only writer 1 writes maps"), "{e}");
    }

    #[test]
    fn a_map_whose_version_does_not_increase_or_that_is_not_one_put_of_the_map_is_refused() {
        let s = setup();
        publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7961"])).unwrap();
        publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7962"])).unwrap();
        let mut old = one(&s, &["10.0.0.1:7961"]);
        old.map_version = 2;
        append_as(&s, MAP_WRITER, MAP_KEY, old.encode());
        let e = read(&s.map, &s.owner, None).unwrap_err().to_string();
        assert!(e.contains("map version 2 after version 2"), "{e}");

        let s = setup();
        append_as(&s, MAP_WRITER, b"other", one(&s, &["10.0.0.1:7961"]).encode());
        let e = read(&s.map, &s.owner, None).unwrap_err().to_string();
        assert!(e.contains("not one put of the map"), "{e}");

        let s = setup();
        append_as(&s, MAP_WRITER, MAP_KEY, b"PSLM not a map".to_vec());
        let e = read(&s.map, &s.owner, None).unwrap_err().to_string();
        assert!(e.contains("shard map"), "{e}");
    }

    #[test]
    fn another_owners_file_a_changed_byte_and_another_deployments_map_are_refused() {
        let s = setup();
        publish(&s.map, &s.owner, &s.kv.name(), one(&s, &["10.0.0.1:7961"])).unwrap();

        // A map capsule made by another owner, read by one who trusts this owner.
        let other = OwnerKey::from_seed(b"someone else entirely").unwrap();
        let other_kv =
            psl_capsule::new_capsule_with(&other, 7, "kv", 1, file::default_limits(), WriterKeys::Certified).unwrap();
        let other_map = s.map.with_file_name("other.capsule");
        create(&other, &other_kv, &other_map).unwrap();
        let e = load(&other_map, &s.owner.public(), None, s.owner.app(7).unwrap().data_key()).err().unwrap();
        assert!(e.to_string().contains("not the trusted owner"), "{e}");
        assert!(create(&s.owner, &s.kv, &other_map).is_err(), "another owner's file is not taken as ours");

        // One byte of the map record's sealed body changed by a relay, which then wrote the
        // file again (its trailer digest recomputed, so only the signature can tell).
        let good = std::fs::read(&s.map).unwrap();
        let f = CapsuleFile::parse(&good).unwrap();
        let mut records = f.records.clone();
        let last = records.pop().unwrap();
        let mut b = last.bytes().to_vec();
        let at = b.len() - 100;
        b[at] ^= 1;
        records.push(Record::decode(&b, &f.metadata.meta.policy.limits).unwrap());
        std::fs::write(&s.map, file::encode(&f.metadata, &records)).unwrap();
        let e = read(&s.map, &s.owner, None).unwrap_err().to_string();
        assert!(e.contains("does not verify"), "{e}");
        std::fs::write(&s.map, &good).unwrap();

        // The map names KV capsule A; a reader that serves KV capsule B refuses it.
        let e = read(&s.map, &s.owner, Some(&other_kv.name())).unwrap_err().to_string();
        assert!(e.contains("another deployment's"), "{e}");
        assert!(publish(&s.map, &s.owner, &other_kv.name(), one(&s, &["10.0.0.1:7961"])).is_err());
    }
}

//! `psl capsule`: the DataCapsule tool.

use crate::util::{data_key_for, now_ms, read_owner_key, show_bytes, write_atomic};
use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use psl_capsule::certs::OPEN_ENDED;
use psl_capsule::{
    audit_file, file, new_capsule_with, Action, Author, Body, CapsuleFile, KeyStatement, Kind, Limits, MembershipProof,
    Record, Replica, Revocation, SignedMetadata, Verifier, WriterCert, WriterKeys,
};
use psl_crypto::{DataKey, Hash256};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum CapsuleCmd {
    /// Create an empty capsule file owned by a key file.
    New {
        #[arg(long)]
        owner: PathBuf,
        #[arg(long, default_value = "")]
        label: String,
        #[arg(long)]
        out: PathBuf,
        /// Application index (hardened child of the owner key); random when not given.
        #[arg(long)]
        app_index: Option<u32>,
        /// Largest key in bytes.
        #[arg(long, default_value_t = Limits::default().key_bytes_max)]
        key_bytes_max: u32,
        /// Largest value in bytes.
        #[arg(long, default_value_t = Limits::default().value_bytes_max)]
        value_bytes_max: u32,
        /// How writer keys are made: `certified` (hardened keys, each known by a certificate the
        /// application key signs; one leaked writer key forges nothing for another writer) or
        /// `derived` (the version-1 format: public derivation from the application key).
        #[arg(long, default_value = "certified", value_parser = ["certified", "derived"])]
        writer_keys: String,
        #[arg(long)]
        force: bool,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Append one data record of ops, written and signed by WRITER.
    Append {
        capsule: PathBuf,
        #[arg(long)]
        owner: PathBuf,
        #[arg(long)]
        writer: u32,
        /// The writer's certificate (from `psl keys cert`), in a capsule that certifies writers.
        /// Without it, a writer the file has no certificate for is certified by the owner key.
        #[arg(long)]
        cert: Option<PathBuf>,
        /// KEY=VALUE to put (repeatable).
        #[arg(long = "put", value_name = "KEY=VALUE")]
        puts: Vec<String>,
        /// KEY to delete (repeatable); deletes follow the puts in the record.
        #[arg(long = "del", value_name = "KEY")]
        dels: Vec<String>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Append a SYNC record (as the coordinator) pointing at every writer's newest record.
    Sync {
        capsule: PathBuf,
        #[arg(long)]
        owner: PathBuf,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Revoke one writer from an epoch on (a capsule that certifies writers): appends a Cert
    /// record, carried by the coordinator, with the application key's revocation.
    Revoke {
        capsule: PathBuf,
        #[arg(long)]
        owner: PathBuf,
        #[arg(long)]
        writer: u32,
        /// First epoch whose records of this writer are refused (default: the current epoch + 1).
        #[arg(long)]
        from_epoch: Option<u64>,
        /// First seq of the writer's chain that is refused, whatever epoch it claims (default:
        /// the one after its newest record in the file, so that nothing it signs from now on
        /// counts; `none`: no seq bound).
        #[arg(long)]
        from_seq: Option<String>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check every record and chain of a capsule file or a store directory; exit 1 on any failure.
    Verify {
        capsule: PathBuf,
        /// Owner key: also decrypt and check every body.
        #[arg(long)]
        key: Option<PathBuf>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List records (headers; with --key also the decrypted ops).
    #[command(alias = "log")]
    Show {
        capsule: PathBuf,
        #[arg(long)]
        key: Option<PathBuf>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Union of two replicas of one capsule.
    Merge {
        a: PathBuf,
        b: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Membership proof of one record, from the newest SYNC that reaches it (or its writer's head).
    Prove {
        capsule: PathBuf,
        #[arg(long)]
        record: String,
        /// Prove from this record instead (a later record or a SYNC).
        #[arg(long)]
        head: Option<String>,
        /// Also write the binary proof here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a binary membership proof, with public keys only.
    CheckProof {
        proof: PathBuf,
        /// The capsule name you trust (hex).
        #[arg(long)]
        name: Option<String>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a store directory's replica to a capsule file.
    Export {
        store: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Verify a capsule file's records and append them to a store directory (created if needed).
    Import {
        capsule: PathBuf,
        #[arg(long)]
        into: PathBuf,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: CapsuleCmd) -> Result<i32> {
    match cmd {
        CapsuleCmd::New { owner, label, out, app_index, key_bytes_max, value_bytes_max, writer_keys, force, json } => {
            let limits = Limits { key_bytes_max, value_bytes_max, ..Limits::default() };
            new_file(NewCapsule { owner, label, out, app_index, limits, writer_keys, force, json })
        }
        CapsuleCmd::Append { capsule, owner, writer, cert, puts, dels, json } => {
            append(AppendRequest { capsule, owner, writer, cert, puts, dels, json })
        }
        CapsuleCmd::Sync { capsule, owner, json } => sync(&capsule, &owner, json),
        CapsuleCmd::Revoke { capsule, owner, writer, from_epoch, from_seq, json } => {
            revoke(RevokeRequest { capsule, owner, writer, from_epoch, from_seq, json })
        }
        CapsuleCmd::Verify { capsule, key, json } => verify(&capsule, key.as_deref(), json),
        CapsuleCmd::Show { capsule, key, json } => show(&capsule, key.as_deref(), json),
        CapsuleCmd::Merge { a, b, out, json } => merge(&a, &b, &out, json),
        CapsuleCmd::Prove { capsule, record, head, out, json } => prove(&capsule, &record, head, out.as_deref(), json),
        CapsuleCmd::CheckProof { proof, name, json } => check_proof(&proof, name, json),
        CapsuleCmd::Export { store, out, json } => export(&store, &out, json),
        CapsuleCmd::Import { capsule, into, json } => import(&capsule, &into, json),
    }
}

/// The arguments of `psl capsule new`.
struct NewCapsule {
    owner: PathBuf,
    label: String,
    out: PathBuf,
    app_index: Option<u32>,
    /// The key and value limits from `--key-bytes-max` and `--value-bytes-max`.
    limits: Limits,
    writer_keys: String,
    force: bool,
    json: bool,
}

/// `psl capsule new`: writes an empty capsule file owned by the owner key.
fn new_file(n: NewCapsule) -> Result<i32> {
    let NewCapsule { owner, label, out, app_index, limits, writer_keys, force, json } = n;
    if out.exists() && !force {
        bail!("{} exists; pass --force to overwrite it", out.display());
    }
    let owner = read_owner_key(&owner)?;
    let app_index = app_index.unwrap_or_else(|| rand::random::<u32>() >> 1);
    let scheme = if writer_keys == "derived" { WriterKeys::Derived } else { WriterKeys::Certified };
    let meta = new_capsule_with(&owner, app_index, &label, now_ms(), limits, scheme)?;
    write_atomic(&out, &file::encode(&meta, []), 0o644)?;
    let name = meta.name();
    if json {
        println!(
            "{}",
            json!({ "name": name.to_string(), "app_index": app_index, "writer_keys": scheme.name(), "file": out })
        );
    } else {
        println!("capsule {name}");
        println!(
            "label {label:?}, application index {app_index}, {} writer keys, written to {}",
            scheme.name(),
            out.display()
        );
    }
    Ok(0)
}

/// The arguments of `psl capsule append`.
struct AppendRequest {
    capsule: PathBuf,
    owner: PathBuf,
    writer: u32,
    cert: Option<PathBuf>,
    puts: Vec<String>,
    dels: Vec<String>,
    json: bool,
}

/// `psl capsule append`: seals one data record of WRITER's ops onto the verified file.
fn append(r: AppendRequest) -> Result<i32> {
    let AppendRequest { capsule, owner, writer, cert, puts, dels, json } = r;
    let owner = read_owner_key(&owner)?;
    let (meta, mut records, replica) = load_verified(&capsule, Some(&owner))?;
    let app = owner.app(meta.meta.app_index)?;
    let ops = parse_ops(&puts, &dels)?;
    let cert = cert.map(|p| read_cert(&p)).transpose()?;
    let mut author = author_at(&meta, &app, writer, cert, &replica)?;
    let intro = introduce(&mut author, &meta, &records)?;
    records.extend(intro);
    let rec = author.write_ops(ops).context("sealing the record")?;
    let h = rec.header().clone();
    records.push(rec.clone());
    write_atomic(&capsule, &file::encode(&meta, &records), 0o644)?;
    if json {
        println!(
            "{}",
            json!({ "hash": rec.hash().to_hex(), "writer": writer, "seq": h.seq, "lamport": h.lamport, "epoch": h.epoch, "bytes": rec.bytes().len() })
        );
    } else {
        println!(
            "appended record {} (writer {writer}, seq {}, lamport {}, epoch {})",
            rec.hash(),
            h.seq,
            h.lamport,
            h.epoch
        );
    }
    Ok(0)
}

/// One op of a data record: a key and its new value (`None`: deleted).
type RawOp = (Vec<u8>, Option<Vec<u8>>);

/// A record's ops from `--put KEY=VALUE` and `--del KEY` (deletes after the puts; none empty).
fn parse_ops(puts: &[String], dels: &[String]) -> Result<Vec<RawOp>> {
    let mut ops: Vec<RawOp> = Vec::new();
    for p in puts {
        let (k, v) = p.split_once('=').ok_or_else(|| anyhow!("--put {p:?}: expected KEY=VALUE"))?;
        ops.push((k.as_bytes().to_vec(), Some(v.as_bytes().to_vec())));
    }
    for d in dels {
        if ops.iter().any(|(k, _)| k == d.as_bytes()) {
            bail!("key {d:?} is both put and deleted in one record; append them separately");
        }
        ops.push((d.as_bytes().to_vec(), None));
    }
    if ops.is_empty() {
        bail!("nothing to append: give --put KEY=VALUE or --del KEY");
    }
    Ok(ops)
}

/// `psl capsule sync`: the coordinator seals a SYNC record over every other writer's head.
fn sync(capsule: &Path, owner: &Path, json: bool) -> Result<i32> {
    let owner = read_owner_key(owner)?;
    let (meta, mut records, replica) = load_verified(capsule, Some(&owner))?;
    let app = owner.app(meta.meta.app_index)?;
    let coordinator = meta.meta.policy.coordinator;
    let mut author = author_at(&meta, &app, coordinator, None, &replica)?;
    let intro = introduce(&mut author, &meta, &records)?;
    records.extend(intro);
    let heads: Vec<_> = replica
        .heads()
        .values()
        .filter(|h| h.writer != coordinator)
        .map(|h| psl_capsule::Link { writer: h.writer, seq: h.seq, hash: h.hash })
        .collect();
    let n = heads.len();
    let rec = author.write_sync(heads).context("sealing the SYNC record")?;
    records.push(rec.clone());
    write_atomic(capsule, &file::encode(&meta, &records), 0o644)?;
    if json {
        println!("{}", json!({ "hash": rec.hash().to_hex(), "epoch": rec.header().epoch, "writers": n }));
    } else {
        println!("SYNC {} closes epoch {} over {n} writers", rec.hash(), rec.header().epoch);
    }
    Ok(0)
}

/// The arguments of `psl capsule revoke`.
struct RevokeRequest {
    capsule: PathBuf,
    owner: PathBuf,
    writer: u32,
    from_epoch: Option<u64>,
    from_seq: Option<String>,
    json: bool,
}

/// `psl capsule revoke`: the coordinator carries the application key's revocation of a writer.
fn revoke(r: RevokeRequest) -> Result<i32> {
    let RevokeRequest { capsule, owner, writer, from_epoch, from_seq, json } = r;
    let owner = read_owner_key(&owner)?;
    let (meta, mut records, replica) = load_verified(&capsule, Some(&owner))?;
    if meta.meta.policy.writer_keys != WriterKeys::Certified {
        bail!(
            "capsule {} derives its writer keys: one writer cannot be revoked (rotate the application key)",
            meta.name()
        );
    }
    let app = owner.app(meta.meta.app_index)?;
    let coordinator = meta.meta.policy.coordinator;
    let mut author = author_at(&meta, &app, coordinator, None, &replica)?;
    let intro = introduce(&mut author, &meta, &records)?;
    records.extend(intro);
    let from_epoch = from_epoch.unwrap_or(author.epoch() + 1);
    let from_seq = match from_seq.as_deref() {
        None => replica.heads().get(&writer).map_or(0, |h| h.seq + 1),
        Some("none") => psl_capsule::certs::ANY_SEQ,
        Some(s) => s.parse().with_context(|| format!("--from-seq {s:?}: a number or `none`"))?,
    };
    let revocation = Revocation::issue(&app, meta.name(), 0, writer, from_epoch, from_seq)?;
    let rec = author.write_certs(vec![KeyStatement::Revoke(revocation)]).context("sealing the Cert record")?;
    records.push(rec.clone());
    write_atomic(&capsule, &file::encode(&meta, &records), 0o644)?;
    if json {
        println!(
            "{}",
            json!({ "hash": rec.hash().to_hex(), "writer": writer, "from_epoch": from_epoch, "from_seq": from_seq })
        );
    } else {
        println!("writer {writer} revoked from epoch {from_epoch} and seq {from_seq} (record {})", rec.hash());
    }
    Ok(0)
}

/// `psl capsule merge`: the union of two verified replicas of one capsule, written to `out`.
fn merge(a: &Path, b: &Path, out: &Path, json: bool) -> Result<i32> {
    let (ma, ra, _) = load_verified(a, None)?;
    let (mb, rb, _) = load_verified(b, None)?;
    if ma.name() != mb.name() {
        bail!(
            "{} holds capsule {} but {} holds capsule {}: only replicas of one capsule merge",
            a.display(),
            ma.name(),
            b.display(),
            mb.name()
        );
    }
    let v = Verifier::new(ma.clone(), None);
    v.learn_statements(ra.iter().chain(&rb));
    let mut rep = Replica::new(ma.name());
    for r in ra.into_iter().chain(rb) {
        rep.insert(v.verify(r).map_err(|e| anyhow!("{e}"))?)?;
    }
    let problems = rep.check();
    let recs: Vec<Record> = rep.in_chain_order().map(|r| (**r).clone()).collect();
    write_atomic(out, &file::encode(&ma, &recs), 0o644)?;
    if json {
        println!(
            "{}",
            json!({ "records": recs.len(), "problems": problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(), "file": out })
        );
    } else {
        println!("merged {} records into {}", recs.len(), out.display());
        for p in &problems {
            println!("warning: {p}");
        }
    }
    Ok(if problems.is_empty() { 0 } else { 1 })
}

/// `psl capsule prove`: builds, checks and prints (or writes) a membership proof of `record`.
fn prove(capsule: &Path, record: &str, head: Option<String>, out: Option<&Path>, json: bool) -> Result<i32> {
    let (meta, _, replica) = load_verified(capsule, None)?;
    let target = parse_hash(&replica, record)?;
    let head = head.map(|h| parse_hash(&replica, &h)).transpose()?;
    let proof = MembershipProof::build(&meta, &replica, target, head)?;
    let outcome = proof.verify(Some(meta.name()))?;
    let bytes = proof.encode();
    if let Some(p) = out {
        write_atomic(p, &bytes, 0o644)?;
    }
    if json {
        println!(
            "{}",
            json!({
                "capsule": meta.name().to_string(),
                "target": outcome.target.hash.to_hex(),
                "target_writer": outcome.target.writer,
                "target_seq": outcome.target.seq,
                "head": outcome.head.hash.to_hex(),
                "head_kind": outcome.head_kind.name(),
                "steps": proof.steps.len(),
                "proof": hex::encode(&bytes),
            })
        );
    } else {
        println!("record {} (writer {}, seq {})", outcome.target.hash, outcome.target.writer, outcome.target.seq);
        println!(
            "is reached from {} {} (writer {}, seq {}) in {} step(s); proof of {} bytes checks out",
            outcome.head_kind.name(),
            outcome.head.hash,
            outcome.head.writer,
            outcome.head.seq,
            proof.steps.len() - 1,
            bytes.len()
        );
        match out {
            Some(p) => println!("written to {}", p.display()),
            None => println!("{}", hex::encode(&bytes)),
        }
    }
    Ok(0)
}

/// `psl capsule check-proof`: checks a binary membership proof with public keys only.
fn check_proof(proof: &Path, name: Option<String>, json: bool) -> Result<i32> {
    let bytes = std::fs::read(proof).with_context(|| format!("reading {}", proof.display()))?;
    let expected = name
        .map(|n| {
            Hash256::from_hex(&n).map(psl_capsule::CapsuleName).ok_or_else(|| anyhow!("--name must be 64 hex digits"))
        })
        .transpose()?;
    let result = MembershipProof::decode(&bytes).and_then(|p| p.verify(expected));
    match result {
        Ok(o) => {
            print_proof_ok(&o, expected.is_none(), json);
            Ok(0)
        }
        Err(e) => {
            if json {
                println!("{}", json!({ "ok": false, "error": e.to_string() }));
            } else {
                println!("proof FAILED: {e}");
            }
            Ok(1)
        }
    }
}

/// Prints a proof that checked out: what it proves and who vouches for it (with a note when
/// no `--name` was given: `unnamed`).
fn print_proof_ok(o: &psl_capsule::ProofOutcome, unnamed: bool, json: bool) {
    if json {
        println!(
            "{}",
            json!({
                "ok": true,
                "capsule": o.capsule.to_string(),
                "target": o.target.hash.to_hex(),
                "target_writer": o.target.writer,
                "target_seq": o.target.seq,
                // The target's writer and seq, under their older names.
                "writer": o.target.writer,
                "seq": o.target.seq,
                "head": o.head.hash.to_hex(),
                "head_writer": o.head.writer,
                "head_seq": o.head.seq,
                "head_kind": o.head_kind.name(),
            })
        );
    } else {
        println!(
            "proof OK: record {} (writer {}, seq {}) is in capsule {}",
            o.target.hash, o.target.writer, o.target.seq, o.capsule
        );
        // Who vouches for it: the head's signer.
        let by = if o.head_kind == Kind::Sync { "a coordinator's SYNC" } else { "its writer's own chain" };
        println!(
            "as fixed by head {} {} (writer {}, seq {}): {by}",
            o.head_kind.name(),
            o.head.hash,
            o.head.writer,
            o.head.seq
        );
        if unnamed {
            println!("note: no --name given; the proof is only as good as the capsule name you compare it with");
        }
    }
}

/// `psl capsule export`: writes a store directory's replica (read-only) to a capsule file.
fn export(store: &Path, out: &Path, json: bool) -> Result<i32> {
    // Read-only: exporting changes nothing, and works on a running server's store (the
    // records indexed at open, a consistent prefix of its log).
    let (s, report) = psl_store::DiskStore::open_readonly(store, None)?;
    if report.is_damaged() {
        eprintln!("warning: store {} is damaged: {report}", store.display());
    }
    let bytes = s.export()?;
    write_atomic(out, &bytes, 0o644)?;
    if json {
        println!("{}", json!({ "records": s.len(), "capsule": s.name().to_string(), "file": out }));
    } else {
        println!("exported {} records of capsule {} to {}", s.len(), s.name(), out.display());
    }
    Ok(0)
}

/// `psl capsule import`: verifies a capsule file and appends its records to a store directory.
fn import(capsule: &Path, into: &Path, json: bool) -> Result<i32> {
    let bytes = std::fs::read(capsule).with_context(|| format!("reading {}", capsule.display()))?;
    let (s, outcome) = psl_store::import_into(into, &bytes, None)?;
    if json {
        println!(
            "{}",
            json!({ "appended": outcome.appended, "duplicates": outcome.duplicates, "records": s.len(), "capsule": s.name().to_string() })
        );
    } else {
        println!(
            "imported {} new records ({} already present) into {}; it holds {} records of capsule {}",
            outcome.appended,
            outcome.duplicates,
            into.display(),
            s.len(),
            s.name()
        );
    }
    Ok(0)
}

/// Reads a capsule file, verifying every record (and decrypting with the owner's key when given).
/// Refuses a file with any problem: nothing is ever built on an unverified record.
fn load_verified(path: &Path, owner: Option<&psl_crypto::OwnerKey>) -> Result<(SignedMetadata, Vec<Record>, Replica)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", path.display()))?;
    let key = owner.map(|o| data_key_for(o, &f.metadata)).transpose()?;
    let audit = audit_file(&bytes, key);
    if let Some(p) = audit.problems.first() {
        bail!("{} does not verify ({} problems; see `psl capsule verify`): {p}", path.display(), audit.problems.len());
    }
    let replica = audit.replica.expect("metadata verified, so the audit built a replica");
    Ok((f.metadata, f.records, replica))
}

fn author_at(
    meta: &SignedMetadata,
    app: &psl_crypto::AppKey,
    writer: u32,
    cert: Option<WriterCert>,
    replica: &Replica,
) -> Result<Author> {
    let mut a = match cert {
        Some(c) => {
            if meta.meta.policy.writer_keys != WriterKeys::Certified {
                bail!("--cert: capsule {} derives its writer keys and takes no certificates", meta.name());
            }
            if c.writer != writer {
                bail!("--cert: the certificate is for writer {}, not {writer}", c.writer);
            }
            Author::with_certified_keys(meta, app.writer_hardened(writer)?, c, app.data_key()).map_err(|_| {
                anyhow!("--cert: not a certificate of this capsule's application key for writer {writer}'s key")
            })?
        }
        None => Author::new(meta, app, writer)?,
    };
    if let Some(h) = replica.heads().get(&writer) {
        a.resume(h);
    }
    a.observe(replica.max_lamport());
    if let Some(s) = replica.latest_sync() {
        a.enter_epoch(s.link(), s.header().epoch);
    }
    Ok(a)
}

/// In a capsule that certifies writers, the Cert record that introduces `author` (its own
/// certificate) when `records` hold no certificate of it yet; nothing otherwise.
fn introduce(author: &mut Author, meta: &SignedMetadata, records: &[Record]) -> Result<Vec<Record>> {
    let Some(cert) = author.cert() else { return Ok(Vec::new()) };
    let v = Verifier::new(meta.clone(), None);
    v.learn_statements(records);
    let revoked = v
        .revocations()
        .into_iter()
        .find(|r| r.writer == cert.writer && r.key_gen == cert.key_gen && r.refuses(author.epoch(), author.next_seq()));
    if let Some(r) = revoked {
        bail!(
            "writer {} is revoked from epoch {} and seq {}; its next record would be epoch {}, seq {}",
            r.writer,
            r.from_epoch,
            r.from_seq,
            author.epoch(),
            author.next_seq()
        );
    }
    if v.writer_certs().iter().any(|c| c.writer == cert.writer && c.key_gen == cert.key_gen) {
        return Ok(Vec::new());
    }
    let rec = author.write_own_cert().expect("a certified author").context("sealing the Cert record")?;
    Ok(vec![rec])
}

/// Reads a certificate file written by `psl keys cert`.
pub fn read_cert(path: &Path) -> Result<WriterCert> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    WriterCert::decode(&bytes).with_context(|| format!("{} is not a writer certificate", path.display()))
}

fn parse_hash(replica: &Replica, s: &str) -> Result<Hash256> {
    if let Some(h) = Hash256::from_hex(s) {
        return Ok(h);
    }
    // Accept a unique hex prefix, as people copy the short form from `show`.
    let s = s.to_ascii_lowercase();
    let mut m = replica.iter().map(|r| r.hash()).filter(|h| h.to_hex().starts_with(&s));
    match (m.next(), m.next()) {
        (Some(h), None) if s.len() >= 4 => Ok(h),
        (Some(_), Some(_)) => bail!("record prefix {s} is ambiguous"),
        _ => bail!("no record {s} in this capsule"),
    }
}

fn verify(path: &Path, key: Option<&Path>, json: bool) -> Result<i32> {
    if path.is_dir() {
        return verify_store(path, key, json);
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let data_key: Option<DataKey> = match key {
        Some(k) => {
            let owner = read_owner_key(k)?;
            let meta = CapsuleFile::parse(&bytes).ok().map(|f| f.metadata).or_else(|| file::scan(&bytes).metadata.ok());
            match meta {
                Some(m) => Some(data_key_for(&owner, &m)?),
                None => None,
            }
        }
        None => None,
    };
    let audit = audit_file(&bytes, data_key);
    let summary = audit.replica.as_ref().map(|r| {
        let syncs = r.iter().filter(|x| x.header().kind == Kind::Sync).count();
        (r.len(), r.writers().len(), syncs)
    });
    if json {
        println!(
            "{}",
            json!({
                "ok": audit.ok(),
                "capsule": audit.metadata.as_ref().map(|m| m.name().to_string()),
                "records": audit.records_total,
                "records_verified": audit.records_verified,
                "writers": summary.map(|s| s.1),
                "syncs": summary.map(|s| s.2),
                "decrypted": audit.opened,
                "links_to_revoked": audit.links_to_revoked,
                "problems": audit.problems,
            })
        );
    } else if audit.ok() {
        let (n, w, s) = summary.unwrap_or_default();
        println!(
            "OK: capsule {}: {n} records from {w} writers, {s} SYNC record(s); every signature, hash, chain and link checks out{}{}",
            audit.metadata.as_ref().map(|m| m.name().to_string()).unwrap_or_default(),
            match audit.links_to_revoked {
                0 => String::new(),
                n => format!(" ({n} links name a record a revocation refuses, rightly absent)"),
            },
            if audit.opened { ", and every body decrypts" } else { " (bodies not decrypted: no --key)" }
        );
    } else {
        for p in &audit.problems {
            println!("FAILED: {p}");
        }
        println!("{} problems in {}", audit.problems.len(), path.display());
    }
    Ok(if audit.ok() { 0 } else { 1 })
}

fn verify_store(dir: &Path, key: Option<&Path>, json: bool) -> Result<i32> {
    let data_key = match key {
        Some(k) => {
            let owner = read_owner_key(k)?;
            let meta = psl_store::read_metadata(dir)?;
            Some(data_key_for(&owner, &meta)?)
        }
        None => None,
    };
    let (store, open) = psl_store::DiskStore::open_readonly(dir, data_key)?;
    let report = store.check()?;
    // A running server holds the store: the check covers the log as it was at open, and a
    // torn tail there is the frame it was writing, not damage (what it appends since is not
    // covered). Otherwise every finding, a torn tail included, fails the verification.
    let live = store.held_by_writer();
    let (open_problems, problems) =
        if live { (Vec::new(), report.damage()) } else { (open.problems(), report.problems()) };
    let ok = open_problems.is_empty() && problems.is_empty();
    let note = live.then(|| {
        format!(
            "the store is held by a running server: verified the {} bytes of records.log present when the check \
             began ({} appended since are not covered; `psl capsule-server check --read ADDR` checks through the server)",
            report.checked_bytes, report.appended_bytes
        )
    });
    if json {
        println!(
            "{}",
            json!({ "ok": ok, "capsule": store.name().to_string(), "records": store.len(), "open": open.to_string(), "problems": problems, "live": live, "note": note })
        );
    } else if ok {
        println!(
            "OK: store {}: capsule {}, {} records; every frame, signature, hash and chain checks out",
            dir.display(),
            store.name(),
            store.len()
        );
        if let Some(n) = &note {
            println!("note: {n}");
        }
    } else {
        let problems = if problems.is_empty() { open_problems } else { problems };
        for p in &problems {
            println!("FAILED: {p}");
        }
        if let Some(n) = &note {
            println!("note: {n}");
        }
        println!("{} problems in store {}", problems.len(), dir.display());
    }
    Ok(if ok { 0 } else { 1 })
}

/// `psl capsule show`: the capsule's metadata and key statements, then every record's header,
/// check status and (with the key) decrypted body; as a table or as one JSON object.
fn show(path: &Path, key: Option<&Path>, json: bool) -> Result<i32> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", path.display()))?;
    let data_key = key.map(|k| read_owner_key(k).and_then(|o| data_key_for(&o, &f.metadata))).transpose()?;
    let v = Verifier::new(f.metadata.clone(), data_key);
    let refused = learn_all_statements(&v, &f.records);
    let statements = Statements { certs: v.writer_certs(), revocations: v.revocations(), refused };
    let mut rows = Vec::new();
    if !json {
        print_show_header(&f.metadata, &statements);
    }
    for (i, r) in f.records.iter().enumerate() {
        let (status, ops) = check_record(&v, r);
        if json {
            rows.push(record_json(i, r, status, ops));
        } else {
            print_record(i, r, &status, ops);
        }
    }
    if json {
        print_show_json(&f.metadata, &statements, rows);
    }
    Ok(0)
}

/// The key statements `show` found: certificates, revocations, and those it refused.
struct Statements {
    certs: Vec<WriterCert>,
    revocations: Vec<Revocation>,
    refused: Vec<(Hash256, psl_capsule::CertError)>,
}

/// Learns the key statements in `records` (again after their rotations, with the key); returns
/// those refused.
fn learn_all_statements(v: &Verifier, records: &[Record]) -> Vec<(Hash256, psl_capsule::CertError)> {
    let mut refused = v.learn_statements(records);
    if !refused.is_empty() && v.can_open() {
        // A later generation's certificates verify once its rotation certificate (in a ROTATE
        // record, which the key opens) is known: as the audit does, learn those, then again.
        for r in records.iter().filter(|r| r.header().kind == Kind::Control) {
            if let Ok(o) = v.verify_open(r.clone()) {
                if let Body::Control { code: psl_capsule::ControlCode::Rotate, payload } = &o.body {
                    if let Ok(cert) = psl_capsule::RotationCert::decode(payload) {
                        let _ = v.install_rotation(&cert, None);
                    }
                }
            }
        }
        refused = v.learn_statements(records);
    }
    refused
}

/// `show`'s text header: the metadata, the key statements, and the records table's heading.
fn print_show_header(meta: &SignedMetadata, st: &Statements) {
    let m = &meta.meta;
    println!("capsule {}", meta.name());
    println!(
        "  label {:?}, owner {}, application index {}, created {} ms",
        m.label, m.owner, m.app_index, m.created_ms
    );
    println!(
        "  coordinator writer {}, {} writer keys, limits {:?}",
        m.policy.coordinator,
        m.policy.writer_keys.name(),
        m.policy.limits
    );
    for c in &st.certs {
        println!("  certificate: writer {} (key generation {}) key {} {}", c.writer, c.key_gen, c.key, epochs(c));
    }
    for r in &st.revocations {
        println!(
            "  revocation: writer {} (key generation {}) from epoch {}{}",
            r.writer,
            r.key_gen,
            r.from_epoch,
            seq_bound(r.from_seq)
        );
    }
    for (hash, e) in &st.refused {
        println!("  refused statement in record {}: {e}", hash.short());
    }
    println!(
        "{:>4}  {:<8}  {:<8}  {:>10}  {:>6}  {:>8}  {:>5}  {:>6}",
        "#", "hash", "kind", "writer", "seq", "lamport", "epoch", "bytes"
    );
}

/// Checks one record (and opens it when the key is known): its status, and its body described.
fn check_record(v: &Verifier, r: &Record) -> (String, Option<Vec<String>>) {
    let checked = if v.can_open() {
        v.verify_open(r.clone()).map(|o| Some(o.split().1))
    } else {
        v.verify(r.clone()).map(|_| None)
    };
    let (status, body) = match checked {
        Ok(b) => ("ok".to_string(), b),
        Err(e) => (format!("FAILED {} check", e.reason.name()), None),
    };
    (status, body.as_ref().map(describe_body))
}

/// Record `i` as a row of `show --json`.
fn record_json(i: usize, r: &Record, status: String, ops: Option<Vec<String>>) -> serde_json::Value {
    let h = r.header();
    json!({
        "index": i, "hash": r.hash().to_hex(), "kind": h.kind.name(), "writer": h.writer, "seq": h.seq,
        "lamport": h.lamport, "epoch": h.epoch, "prev": h.prev.to_hex(),
        "links": h.links.iter().map(|l| json!({"writer": l.writer, "seq": l.seq, "hash": l.hash.to_hex()})).collect::<Vec<_>>(),
        "bytes": r.bytes().len(), "status": status, "body": ops,
    })
}

/// Record `i` as a row of `show`'s table, with its links and body lines below it.
fn print_record(i: usize, r: &Record, status: &str, ops: Option<Vec<String>>) {
    let h = r.header();
    println!(
        "{i:>4}  {:<8}  {:<8}  {:>10}  {:>6}  {:>8}  {:>5}  {:>6}  {status}",
        r.hash().short(),
        h.kind.name(),
        h.writer,
        h.seq,
        h.lamport,
        h.epoch,
        r.bytes().len()
    );
    for l in &h.links {
        println!("        -> writer {} seq {} {}", l.writer, l.seq, l.hash.short());
    }
    if let Some(lines) = ops {
        for line in lines {
            println!("        {line}");
        }
    }
}

/// `show --json`: the metadata, the key statements and the record rows as one object.
fn print_show_json(meta: &SignedMetadata, st: &Statements, rows: Vec<serde_json::Value>) {
    let m = &meta.meta;
    println!(
        "{}",
        json!({
            "capsule": meta.name().to_string(), "label": m.label, "owner": m.owner.to_string(),
            "app_index": m.app_index, "writer_keys": m.policy.writer_keys.name(),
            "certificates": st.certs.iter().map(|c| json!({
                "writer": c.writer, "key_gen": c.key_gen, "key": c.key.to_string(),
                "valid_from_epoch": c.valid_from_epoch,
                "valid_until_epoch": (c.valid_until_epoch != OPEN_ENDED).then_some(c.valid_until_epoch),
            })).collect::<Vec<_>>(),
            "revocations": st.revocations.iter().map(|r| json!({
                "writer": r.writer, "key_gen": r.key_gen, "from_epoch": r.from_epoch,
                "from_seq": (r.from_seq != psl_capsule::certs::ANY_SEQ).then_some(r.from_seq),
            })).collect::<Vec<_>>(),
            "refused_statements": st.refused.iter().map(|(h, e)| json!({ "record": h.to_hex(), "error": e.to_string() })).collect::<Vec<_>>(),
            "records": rows,
        })
    );
}

fn describe_body(b: &Body) -> Vec<String> {
    match b {
        Body::Atomic(ops) => std::iter::once(format!("atomic batch of {} ops:", ops.len()))
            .chain(describe_body(&Body::Data(ops.clone())))
            .collect(),
        Body::Data(ops) => ops
            .iter()
            .map(|o| match &o.action {
                Action::Put(v) => format!("@{} put {} = {}", o.lamport, show_bytes(&o.key), show_bytes(v)),
                Action::Delete => format!("@{} del {}", o.lamport, show_bytes(&o.key)),
            })
            .collect(),
        Body::Sync { app_key_fp } => vec![format!("sync, application key {}", app_key_fp.short())],
        Body::Control { code, payload } => vec![format!("control {code:?}, {} payload bytes", payload.len())],
        Body::DbBlock(x) => vec![format!("db-block, {} bytes", x.len())],
        Body::DbIndex(x) => vec![format!("db-index, {} bytes", x.len())],
        Body::Certs(list) => list
            .iter()
            .map(|s| match s {
                KeyStatement::Cert(c) => {
                    format!("certifies writer {} (key generation {}) {}", c.writer, c.key_gen, epochs(c))
                }
                KeyStatement::Revoke(r) => format!(
                    "revokes writer {} (key generation {}) from epoch {}{}",
                    r.writer,
                    r.key_gen,
                    r.from_epoch,
                    seq_bound(r.from_seq)
                ),
            })
            .collect(),
    }
}

fn seq_bound(from_seq: u64) -> String {
    if from_seq == psl_capsule::certs::ANY_SEQ {
        String::new()
    } else {
        format!(" and seq {from_seq}")
    }
}

fn epochs(c: &WriterCert) -> String {
    if c.valid_until_epoch == OPEN_ENDED {
        format!("from epoch {}", c.valid_from_epoch)
    } else {
        format!("for epochs {}..{}", c.valid_from_epoch, c.valid_until_epoch)
    }
}

//! `psl capsuledb`: run the CapsuleDB role, or read its history.
//!
//! - `psl capsuledb --capsule F --owner K --router ADDR --store DIR [--store DIR2 ...]`: joins the
//!   fabric as a receive-only node, applies every write to the LSM tree, stores blocks and
//!   indexes as signed, encrypted records in every `--store` directory (reads verify and fall
//!   back to the next directory), answers workers' reads and publishes its frontier. Restarts
//!   from the newest index recorded in the stores. Prints `ready writer=W index=N`; workers
//!   pass `--capsuledb W` (and `--memtable-keys-max`) to `psl node`.
//! - `psl capsuledb snapshots --capsule F --owner K --store DIR`: lists every kept index.
//! - `psl capsuledb get KEY --at N ...`: reads KEY as index N had it (newest without `--at`).

use crate::util::{read_owner_key, show_bytes};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use psl_capsule::{Author, CapsuleFile, SignedMetadata, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, DirStore};
use psl_crypto::AppKey;
use psl_node::{Node, NodeKeys, NodeOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CapsuleDbArgs {
    #[command(subcommand)]
    pub cmd: Option<CapsuleDbCmd>,
    #[command(flatten)]
    pub open: OpenArgs,
    /// Router to attach to.
    #[arg(long)]
    pub router: Option<SocketAddr>,
    /// Node id of the role (1 to 32766); its writer index is `id << 16 | 15`.
    #[arg(long, default_value_t = 30_000)]
    pub id: u32,
    /// Memtable entries before a freeze into a level-0 block.
    #[arg(long, default_value_t = 4096)]
    pub memtable_entries: usize,
    /// Level-0 blocks before they merge into level 1.
    #[arg(long, default_value_t = 4)]
    pub l0_blocks: usize,
    /// Size ratio between levels.
    #[arg(long, default_value_t = 10)]
    pub fanout: usize,
    /// Entries per compacted block (a point read fetches one block per level).
    #[arg(long, default_value_t = 256)]
    pub block_entries: usize,
    /// Decoded blocks cached.
    #[arg(long, default_value_t = 1024)]
    pub cache_blocks: usize,
}

#[derive(Args, Debug, Clone)]
pub struct OpenArgs {
    /// The capsule file that names the capsule.
    #[arg(long, global = true)]
    pub capsule: Option<PathBuf>,
    /// Owner key file (the data key and CapsuleDB's signing key are derived from it).
    #[arg(long, global = true)]
    pub owner: Option<PathBuf>,
    /// Store directory of block and index records (repeat for copies).
    #[arg(long, global = true)]
    pub store: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum CapsuleDbCmd {
    /// List the kept indexes (snapshots), newest first.
    Snapshots {
        #[arg(long)]
        json: bool,
    },
    /// Read KEY, as of index `--at` (the newest stored index without it).
    Get {
        key: String,
        #[arg(long)]
        at: Option<u64>,
    },
}

/// CapsuleDB's writer index for role node `id`.
pub fn db_writer(id: u32) -> Result<u32> {
    psl_scl::writer_index(id, 0, 15).with_context(|| format!("CapsuleDB id {id} is out of range (1 to 32766)"))
}

fn load(o: &OpenArgs) -> Result<(SignedMetadata, AppKey, Vec<Arc<DirStore>>)> {
    let (Some(capsule), Some(owner)) = (&o.capsule, &o.owner) else {
        bail!("psl capsuledb needs --capsule and --owner");
    };
    if o.store.is_empty() {
        bail!("psl capsuledb needs at least one --store directory");
    }
    let bytes = std::fs::read(capsule).with_context(|| format!("reading {}", capsule.display()))?;
    let f = CapsuleFile::parse(&bytes).with_context(|| format!("{}", capsule.display()))?;
    let owner_key = read_owner_key(owner)?;
    if owner_key.public() != f.metadata.meta.owner {
        bail!("{} is not the owner key of capsule {}", owner.display(), f.metadata.name());
    }
    let app = owner_key.app(f.metadata.meta.app_index)?;
    let mut stores = Vec::new();
    for d in &o.store {
        stores.push(DirStore::open(d).with_context(|| format!("opening store {}", d.display()))?);
    }
    Ok((f.metadata, app, stores))
}

/// Opens the database from the newest index any store records (the highest index that
/// verifies), or `None` if no store records one.
fn open_newest(
    config: Config,
    meta: &SignedMetadata,
    app: &AppKey,
    writer: u32,
    stores: &[Arc<DirStore>],
) -> Result<Option<CapsuleDb>> {
    let dyn_stores: Vec<Arc<dyn BlockStore>> = stores.iter().map(|s| s.clone() as Arc<dyn BlockStore>).collect();
    let mut best: Option<CapsuleDb> = None;
    let mut last_err = None;
    for s in stores {
        let Some(h) = s.newest()? else { continue };
        let author = Author::new(meta, app, writer)?.with_salt_seed(rand::random());
        let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
        match CapsuleDb::open(config, dyn_stores.clone(), verifier, author, h) {
            Ok(db) if best.as_ref().is_none_or(|b| db.index_seq() > b.index_seq()) => best = Some(db),
            Ok(_) => {}
            Err(e) => last_err = Some(e),
        }
    }
    match (best, last_err) {
        (Some(db), _) => Ok(Some(db)),
        (None, Some(e)) => Err(e).context("no recorded index could be read from any store"),
        (None, None) => Ok(None),
    }
}

pub fn run(a: CapsuleDbArgs) -> Result<i32> {
    let config = Config {
        memtable_entries_max: a.memtable_entries,
        l0_blocks_max: a.l0_blocks,
        fanout: a.fanout,
        block_entries_max: a.block_entries,
        cache_blocks_max: a.cache_blocks,
        drop_tombstones: false,
    };
    let writer = db_writer(a.id)?;
    match a.cmd {
        Some(CapsuleDbCmd::Snapshots { json }) => {
            let (meta, app, stores) = load(&a.open)?;
            let Some(mut db) = open_newest(config, &meta, &app, writer, &stores)? else {
                bail!("no index recorded in the store(s): has `psl capsuledb` run on them?");
            };
            let snaps = db.snapshots()?;
            if json {
                println!("{}", serde_json::json!({"newest": db.index_seq(), "snapshots": snaps}));
            } else {
                for s in snaps {
                    println!("{s}");
                }
            }
            Ok(0)
        }
        Some(CapsuleDbCmd::Get { key, at }) => {
            let (meta, app, stores) = load(&a.open)?;
            let Some(mut db) = open_newest(config, &meta, &app, writer, &stores)? else {
                bail!("no index recorded in the store(s): has `psl capsuledb` run on them?");
            };
            let seq = at.unwrap_or(db.index_seq());
            match db.get_cell_at(seq, key.as_bytes())? {
                Some((v, Some(val))) => {
                    println!("{} (lamport {}, writer {})", show_bytes(&val), v.lamport, v.writer);
                    Ok(0)
                }
                Some((v, None)) => {
                    println!("(deleted at lamport {}, writer {})", v.lamport, v.writer);
                    Ok(1)
                }
                None => {
                    println!("(not found in index {seq})");
                    Ok(1)
                }
            }
        }
        None => run_role(a, config, writer),
    }
}

fn run_role(a: CapsuleDbArgs, config: Config, writer: u32) -> Result<i32> {
    let Some(router) = a.router else { bail!("psl capsuledb needs --router (or a subcommand)") };
    let (meta, app, stores) = load(&a.open)?;
    let db = match open_newest(config, &meta, &app, writer, &stores)? {
        Some(db) => db,
        None => {
            let author = Author::new(&meta, &app, writer)?.with_salt_seed(rand::random());
            let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
            let dyn_stores: Vec<Arc<dyn BlockStore>> =
                stores.iter().map(|s| s.clone() as Arc<dyn BlockStore>).collect();
            CapsuleDb::create(config, dyn_stores, verifier, author)?
        }
    };
    let start_seq = db.index_seq();
    let opts = NodeOptions {
        node_id: a.id,
        incarnation: rand::random::<u32>() % (1 << 12),
        writers: 0,
        memtable_keys_max: Some(config.memtable_entries_max.max(1024)),
        capsuledb_role: Some(65_536),
        ..NodeOptions::default()
    };
    let keys = NodeKeys::derive(&meta, &app, &opts)?;
    let node = Node::start(keys, crate::roles::fabric(router)?, opts)?;
    let role_keys = RoleKeys { writer, signing: app.writer(writer)?, data_key: app.data_key() };
    drop(app);
    let role = Role::start(node, db, role_keys, stores, RoleOptions::default())?;
    // Tests and scripts read this line.
    println!("ready writer={writer} index={start_seq}");
    use std::io::Write;
    std::io::stdout().flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(5));
        let s = role.stats();
        tracing::info!(
            applied = s.applied.load(std::sync::atomic::Ordering::Relaxed),
            answers = s.answers.load(std::sync::atomic::Ordering::Relaxed),
            errors = s.errors.load(std::sync::atomic::Ordering::Relaxed),
            index = role.db().lock().index_seq(),
            "capsuledb"
        );
    }
}

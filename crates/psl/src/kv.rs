//! `psl kv`: the client side of a node's control interface. Every command but `stats` is
//! signed with the operator's control key (`--control-key`, or `PSL_CONTROL_KEY`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use psl_node::control::ControlClient;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct KvArgs {
    /// The operator's control key file (`control.key`, secret; default: the environment's
    /// PSL_CONTROL_KEY): signs the commands.
    #[arg(long, global = true, value_name = "FILE")]
    pub control_key: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: KvCmd,
}

#[derive(Subcommand)]
pub enum KvCmd {
    /// Put KEY=VALUE (repeatable) through a node.
    Put {
        #[arg(long)]
        node: SocketAddr,
        #[arg(value_name = "KEY=VALUE", required = true)]
        pairs: Vec<String>,
    },
    /// Read a key from a node's memtable.
    Get {
        #[arg(long)]
        node: SocketAddr,
        key: String,
    },
    /// Delete keys.
    Del {
        #[arg(long)]
        node: SocketAddr,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Wait until the node's writes so far are covered by a SYNC it verified.
    Sync {
        #[arg(long)]
        node: SocketAddr,
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// Instead: wait until every earlier write of the node is on f+1 capsule servers' disks.
        #[arg(long)]
        durable: bool,
    },
    /// The node's counters (JSON).
    Stats {
        #[arg(long)]
        node: SocketAddr,
    },
    /// The node's memtable (JSON).
    Dump {
        #[arg(long)]
        node: SocketAddr,
    },
    /// Revoke one writer of a certified capsule through a node or KV coordinator: the
    /// revocation is signed here, with the owner key (the operator's machine:
    /// `psl-operator/kv-owner.key`), and handed over signed (`REVOKE_SIGNED`); the role checks
    /// it against the capsule, announces it and, a coordinator, carries it into the log. How to
    /// revoke through a coordinator that got its keys from the leader (`--kv-leader`), which
    /// holds no application key and so cannot sign `REVOKE` itself.
    Revoke {
        /// The node's or coordinator's control address.
        #[arg(long)]
        node: SocketAddr,
        /// The capsule file (its public metadata).
        #[arg(long)]
        capsule: PathBuf,
        /// The capsule's owner key file (secret; stays on this machine).
        #[arg(long)]
        owner: PathBuf,
        /// The writer index to revoke.
        writer: u32,
        /// First epoch refused (default: the role's epoch + 2, from `REVOKE_BOUNDS`).
        #[arg(long)]
        from_epoch: Option<u64>,
        /// First seq of the writer's chain refused (default: the next the role expects of it).
        #[arg(long, conflicts_with = "any_seq")]
        from_seq: Option<u64>,
        /// No seq bound (only the epoch bound).
        #[arg(long)]
        any_seq: bool,
    },
    /// Send one control line (e.g. `REVOKE 7`) and print the answer; exit 1 on `ERROR`.
    Call {
        #[arg(long)]
        node: SocketAddr,
        #[arg(required = true, value_name = "WORD")]
        line: Vec<String>,
    },
}

fn connect(addr: SocketAddr, key: Option<&Arc<psl_crypto::SigningKey>>) -> Result<ControlClient> {
    let t = Duration::from_secs(5);
    match key {
        Some(k) => ControlClient::connect_as(addr, t, k.clone()),
        None => ControlClient::connect(addr, t),
    }
    .with_context(|| format!("connecting to node {addr}"))
}

fn expect_ok(r: String) -> Result<()> {
    if r == "OK" {
        Ok(())
    } else {
        bail!("{r}")
    }
}

pub fn run(args: KvArgs) -> Result<i32> {
    let path =
        args.control_key.or_else(|| std::env::var_os("PSL_CONTROL_KEY").filter(|v| !v.is_empty()).map(PathBuf::from));
    let key = path.as_deref().map(crate::util::read_control_key).transpose()?;
    let client = |addr: SocketAddr| connect(addr, key.as_ref());
    match args.cmd {
        KvCmd::Put { node, pairs } => {
            let mut c = client(node)?;
            for p in pairs {
                let (k, v) = p.split_once('=').with_context(|| format!("{p:?}: expected KEY=VALUE"))?;
                if k.contains(' ') {
                    bail!("keys cannot contain spaces: {k:?}");
                }
                expect_ok(c.call(&format!("PUT {k} {v}"))?)?;
            }
        }
        KvCmd::Get { node, key } => {
            let r = client(node)?.call(&format!("GET {key}"))?;
            match r.strip_prefix("VALUE ") {
                Some(v) => println!("{v}"),
                None if r == "NOT_FOUND" => {
                    eprintln!("{key}: not found");
                    return Ok(1);
                }
                // An error (CapsuleDB did not answer, a coordinator keeps no values) is not an
                // absent key.
                None => bail!("get {key}: {}", r.strip_prefix("ERROR ").unwrap_or(&r)),
            }
        }
        KvCmd::Del { node, keys } => {
            let mut c = client(node)?;
            for k in keys {
                expect_ok(c.call(&format!("DEL {k}"))?)?;
            }
        }
        KvCmd::Sync { node, timeout_ms, durable } => {
            let cmd = if durable { "SYNC_DURABLE" } else { "SYNC" };
            expect_ok(client(node)?.call(&format!("{cmd} {timeout_ms}"))?)?
        }
        KvCmd::Stats { node } => println!("{}", client(node)?.call("STATS")?),
        KvCmd::Dump { node } => println!("{}", client(node)?.call("DUMP")?),
        KvCmd::Revoke { node, capsule, owner, writer, from_epoch, from_seq, any_seq } => {
            let meta = crate::roles::read_metadata(&capsule)?;
            if meta.meta.policy.writer_keys != psl_capsule::WriterKeys::Certified {
                bail!(
                    "capsule {} derives its writer keys: one writer cannot be revoked (rotate the application key)",
                    meta.name()
                );
            }
            let ok = crate::util::read_owner_key(&owner)?;
            if ok.public() != meta.meta.owner {
                bail!("{} is not the owner key of capsule {}", owner.display(), meta.name());
            }
            let app = ok.app(meta.meta.app_index)?;
            drop(ok);
            let mut c = client(node)?;
            let (from_epoch, from_seq) = match (from_epoch, from_seq, any_seq) {
                (Some(e), Some(q), _) => (e, q),
                (Some(e), None, true) => (e, psl_capsule::certs::ANY_SEQ),
                (e, q, any) => {
                    let r = c.call(&format!("REVOKE_BOUNDS {writer}"))?;
                    let (de, dq) = parse_bounds(&r, writer)?;
                    (e.unwrap_or(de), if any { psl_capsule::certs::ANY_SEQ } else { q.unwrap_or(dq) })
                }
            };
            let r = psl_capsule::Revocation::issue(&app, meta.name(), 0, writer, from_epoch, from_seq)?;
            drop(app);
            let answer = c.call(&format!("REVOKE_SIGNED {}", hex::encode(r.encode())))?;
            println!("{answer}");
            if !answer.starts_with("REVOKED ") {
                return Ok(1);
            }
        }
        KvCmd::Call { node, line } => {
            let r = client(node)?.call(&line.join(" "))?;
            println!("{r}");
            if r.starts_with("ERROR") {
                return Ok(1);
            }
        }
    }
    Ok(0)
}

/// `BOUNDS <writer> <from_epoch> <from_seq>` (a role's answer to `REVOKE_BOUNDS`).
fn parse_bounds(r: &str, writer: u32) -> Result<(u64, u64)> {
    let parts: Vec<&str> = r.split_ascii_whitespace().collect();
    match parts[..] {
        ["BOUNDS", w, e, q] if w.parse::<u32>().ok() == Some(writer) => Ok((
            e.parse().with_context(|| format!("epoch in {r:?}"))?,
            q.parse().with_context(|| format!("seq in {r:?}"))?,
        )),
        _ => bail!("the role answered REVOKE_BOUNDS with {r:?}"),
    }
}

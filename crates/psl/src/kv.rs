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

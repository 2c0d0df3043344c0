//! `psl kv`: the client side of a node's control interface.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use psl_node::control::ControlClient;
use std::net::SocketAddr;
use std::time::Duration;

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
}

fn client(addr: SocketAddr) -> Result<ControlClient> {
    ControlClient::connect(addr, Duration::from_secs(5)).with_context(|| format!("connecting to node {addr}"))
}

fn expect_ok(r: String) -> Result<()> {
    if r == "OK" {
        Ok(())
    } else {
        bail!("{r}")
    }
}

pub fn run(cmd: KvCmd) -> Result<i32> {
    match cmd {
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
    }
    Ok(0)
}

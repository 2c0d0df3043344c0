//! `psl keys`: owner key files.

use crate::util::{read_owner_key, write_atomic};
use anyhow::{bail, Result};
use clap::Subcommand;
use psl_crypto::OwnerKey;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum KeysCmd {
    /// Create a new owner master key (secret; written with mode 0600) and print its public key.
    New {
        #[arg(long)]
        out: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print the owner public key, and with --app the application's extended public key.
    Pub {
        key: PathBuf,
        /// Application index (hardened child of the owner key).
        #[arg(long)]
        app: Option<u32>,
        /// Also print the public key of this writer of the application (needs --app).
        #[arg(long, requires = "app")]
        writer: Option<u32>,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: KeysCmd) -> Result<i32> {
    match cmd {
        KeysCmd::New { out, force, json } => {
            if out.exists() && !force {
                bail!("{} exists; pass --force to overwrite it", out.display());
            }
            let key = OwnerKey::generate();
            write_atomic(&out, key.to_file_string().as_bytes(), 0o600)?;
            if json {
                println!("{}", serde_json::json!({ "owner_public_key": key.public().to_string(), "file": out }));
            } else {
                println!("owner public key: {}", key.public());
                println!("secret key written to {} (mode 0600)", out.display());
            }
        }
        KeysCmd::Pub { key, app, writer, json } => {
            let key = read_owner_key(&key)?;
            let mut out = serde_json::json!({ "owner_public_key": key.public().to_string() });
            if let Some(a) = app {
                let ak = key.app(a)?;
                out["app_index"] = a.into();
                out["app_public_key"] = ak.public().to_string().into();
                out["app_key_fingerprint"] = ak.public().fingerprint().to_hex().into();
                out["data_key_fingerprint"] = ak.data_key().fingerprint().to_hex().into();
                if let Some(w) = writer {
                    out["writer"] = w.into();
                    out["writer_public_key"] = ak.public().writer(w)?.to_string().into();
                }
            }
            if json {
                println!("{out}");
            } else {
                for (k, v) in out.as_object().expect("built as an object") {
                    println!("{k}: {}", v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
                }
            }
        }
    }
    Ok(0)
}

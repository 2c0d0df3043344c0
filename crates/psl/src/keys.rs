//! `psl keys`: owner key files.

use crate::util::{read_owner_key, write_atomic};
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use psl_crypto::OwnerKey;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum KeysCmd {
    /// Create a new owner master key (secret; written with mode 0600) and print its public key.
    New {
        #[arg(long)]
        out: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the owner public key, and with --app the application's extended public key.
    Pub {
        key: PathBuf,
        /// Application index (hardened child of the owner key).
        #[arg(long)]
        app: Option<u32>,
        /// Also print the public keys of this writer of the application (needs --app): the
        /// derived key (capsules with derived writer keys) and the hardened one (certified).
        #[arg(long, requires = "app")]
        writer: Option<u32>,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Create the operator's control key pair: OUT (secret, mode 0600; keep it on the
    /// operator's machine, for `psl kv --control-key`) and OUT with extension `.pub` (for the
    /// roles' `--control-pub`). An existing OUT is kept.
    Control {
        #[arg(long, default_value = "control.key")]
        out: PathBuf,
    },
    /// Make capsule server ID's own ack-signing key file (secret, mode 0600: for that server's
    /// host only) and, in a capsule that certifies writers, its certificate (public), for
    /// `psl capsule-server --ack-key KEY --cert CERT`: the server then never sees the owner key.
    Server {
        /// The owner key file.
        key: PathBuf,
        /// The capsule file (names the capsule and the application).
        #[arg(long)]
        capsule: PathBuf,
        #[arg(long)]
        id: u32,
        /// The ack key file to write.
        #[arg(long)]
        out: PathBuf,
        /// The certificate file to write (certified capsules).
        #[arg(long)]
        cert: Option<PathBuf>,
    },
    /// Issue a writer certificate offline: the application key of CAPSULE's owner signs writer
    /// WRITER's hardened public key, for `psl capsule append --writer WRITER --cert FILE`.
    Cert {
        /// The owner key file.
        key: PathBuf,
        /// The capsule file (names the capsule and the application).
        #[arg(long)]
        capsule: PathBuf,
        #[arg(long)]
        writer: u32,
        /// First epoch the certificate covers.
        #[arg(long, default_value_t = 0)]
        from_epoch: u64,
        /// First epoch it no longer covers (default: no end).
        #[arg(long)]
        until_epoch: Option<u64>,
        #[arg(long)]
        out: PathBuf,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Issue a client credential for the HTTPS API (docs/client.md): a fresh client key and a
    /// certificate by which CAPSULE's owner lets it read, write and/or run. OUT (JSON, secret,
    /// mode 0600) is what `psl_client.Client(credential=OUT)` reads.
    Client {
        /// The owner key file.
        #[arg(long)]
        owner: PathBuf,
        /// The capsule file (names the capsule the credential is for).
        #[arg(long)]
        capsule: PathBuf,
        /// What the client may do: a comma-separated subset of read, write, run.
        #[arg(long, default_value = "read")]
        can: String,
        /// Days until it expires (default: no end).
        #[arg(long)]
        days: Option<u64>,
        /// The credential file to write.
        #[arg(long)]
        out: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
}

pub fn run(cmd: KeysCmd) -> Result<i32> {
    match cmd {
        KeysCmd::New { out, force, json } => new_key(&out, force, json)?,
        KeysCmd::Pub { key, app, writer, json } => print_public(&key, app, writer, json)?,
        KeysCmd::Control { out } => control_keys(&out)?,
        KeysCmd::Server { key, capsule, id, out, cert } => server_credentials(&key, &capsule, id, &out, cert)?,
        KeysCmd::Cert { key, capsule, writer, from_epoch, until_epoch, out, json } => {
            issue_cert(CertRequest { key, capsule, writer, from_epoch, until_epoch, out, json })?
        }
        KeysCmd::Client { owner, capsule, can, days, out, force } => {
            client_credential(&owner, &capsule, &can, days, &out, force)?
        }
    }
    Ok(0)
}

/// `psl keys new`: generates an owner key, writes it to `out` and prints its public key.
fn new_key(out: &Path, force: bool, json: bool) -> Result<()> {
    if out.exists() && !force {
        bail!("{} exists; pass --force to overwrite it", out.display());
    }
    let key = OwnerKey::generate();
    write_atomic(out, key.to_file_string().as_bytes(), 0o600)?;
    if json {
        println!("{}", serde_json::json!({ "owner_public_key": key.public().to_string(), "file": out }));
    } else {
        println!("owner public key: {}", key.public());
        println!("secret key written to {} (mode 0600)", out.display());
    }
    Ok(())
}

/// `psl keys pub`: prints the owner public key and, if asked, an application's and a writer's.
fn print_public(key: &Path, app: Option<u32>, writer: Option<u32>, json: bool) -> Result<()> {
    let key = read_owner_key(key)?;
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
            out["writer_public_key_hardened"] = ak.writer_hardened(w)?.verifying_key().to_string().into();
        }
    }
    if json {
        println!("{out}");
    } else {
        for (k, v) in out.as_object().expect("built as an object") {
            println!("{k}: {}", v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
        }
    }
    Ok(())
}

/// `psl keys control`: makes (or keeps) the operator's control key pair and prints its public key.
fn control_keys(out: &Path) -> Result<()> {
    let public = out.with_extension("pub");
    if public == out {
        bail!("{}: name the secret key file something other than *.pub", out.display());
    }
    let made = crate::util::write_control_keys(out, &public)?;
    let k = crate::util::read_control_pub(&public)?;
    println!("operator control public key: {k}");
    if made {
        println!("secret key written to {} (mode 0600); public key to {}", out.display(), public.display());
    } else {
        println!("{} exists: kept; public key in {}", out.display(), public.display());
    }
    Ok(())
}

/// `psl keys server`: writes capsule server `id`'s ack key and, in certified capsules, its certificate.
fn server_credentials(key: &Path, capsule: &Path, id: u32, out: &Path, cert: Option<PathBuf>) -> Result<()> {
    let owner = read_owner_key(key)?;
    let meta = crate::roles::read_metadata(capsule)?;
    if owner.public() != meta.meta.owner {
        bail!("the key file is not the owner key of capsule {}", meta.name());
    }
    let app = owner.app(meta.meta.app_index)?;
    let cert_path = cert.unwrap_or_else(|| out.with_extension("cert"));
    let certified = crate::roles::write_server_credentials(&meta, &app, id, out, &cert_path)?;
    println!("capsule server {id}'s ack key written to {} (mode 0600: copy it to its host only)", out.display());
    if certified {
        println!("its certificate (public) written to {}", cert_path.display());
    }
    Ok(())
}

/// `psl keys client`: a fresh client key and its owner-signed certificate, as one JSON file.
fn client_credential(key: &Path, capsule: &Path, can: &str, days: Option<u64>, out: &Path, force: bool) -> Result<()> {
    if out.exists() && !force {
        bail!("{} exists; pass --force to overwrite it", out.display());
    }
    let owner = read_owner_key(key)?;
    let meta = crate::roles::read_metadata(capsule)?;
    if owner.public() != meta.meta.owner {
        bail!("{} is not the owner key of capsule {}", key.display(), meta.name());
    }
    let can = psl_capsule::Permissions::parse(can).map_err(|e| anyhow::anyhow!("--can: {e}"))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    let expires = match days {
        None => psl_capsule::client::NO_EXPIRY,
        Some(d) => now.saturating_add(d.saturating_mul(86_400_000)),
    };
    let client = psl_crypto::SigningKey::generate();
    let cert =
        psl_capsule::ClientCert::issue(&owner.signing_key(), meta.name(), client.verifying_key(), can, now, expires);
    // The public fields through serde; the secret key is spliced into the text, so no copy
    // of it is left behind unzeroized (a `serde_json::Value` would hold one).
    let public = serde_json::json!({
        "version": 1,
        "capsule": hex::encode(meta.name().0 .0),
        "can": can.names(),
        "expires_ms": (expires != psl_capsule::client::NO_EXPIRY).then_some(expires),
        "public": hex::encode(client.verifying_key().to_bytes()),
        "cert": hex::encode(cert.encode()),
    })
    .to_string();
    let secret = zeroize::Zeroizing::new(hex::encode(*client.expose_secret_bytes()));
    let mut file = zeroize::Zeroizing::new(String::with_capacity(public.len() + 80));
    file.push_str(&public[..public.len() - 1]); // without the closing brace
    file.push_str(",\"key\":\"");
    file.push_str(&secret);
    file.push_str("\"}");
    write_atomic(out, file.as_bytes(), 0o600)?;
    println!(
        "client credential for capsule {} ({}) written to {} (mode 0600: it is the client's secret)",
        meta.name(),
        can.names().join(","),
        out.display()
    );
    Ok(())
}

/// The arguments of `psl keys cert`.
struct CertRequest {
    key: PathBuf,
    capsule: PathBuf,
    writer: u32,
    from_epoch: u64,
    until_epoch: Option<u64>,
    out: PathBuf,
    json: bool,
}

/// `psl keys cert`: signs a writer certificate with the capsule owner's application key.
fn issue_cert(r: CertRequest) -> Result<()> {
    let CertRequest { key, capsule, writer, from_epoch, until_epoch, out, json } = r;
    let owner = read_owner_key(&key)?;
    let bytes = std::fs::read(&capsule).with_context(|| format!("reading {}", capsule.display()))?;
    let meta = psl_capsule::CapsuleFile::parse(&bytes).with_context(|| format!("{}", capsule.display()))?.metadata;
    if owner.public() != meta.meta.owner {
        bail!("the key file is not the owner key of capsule {}", meta.name());
    }
    if meta.meta.policy.writer_keys != psl_capsule::WriterKeys::Certified {
        bail!("capsule {} derives its writer keys; it takes no certificates", meta.name());
    }
    let app = owner.app(meta.meta.app_index)?;
    let until = until_epoch.unwrap_or(psl_capsule::certs::OPEN_ENDED);
    let wkey = app.writer_hardened(writer)?.verifying_key();
    let cert = psl_capsule::WriterCert::sign(&app, meta.name(), 0, writer, wkey, from_epoch, until);
    cert.check(meta.name(), &meta.meta.app.point())?;
    write_atomic(&out, &cert.encode(), 0o644)?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "capsule": meta.name().to_string(), "writer": writer, "key": wkey.to_string(), "from_epoch": from_epoch, "until_epoch": until_epoch, "file": out })
        );
    } else {
        println!("certificate of writer {writer} (key {wkey}) in capsule {} written to {}", meta.name(), out.display());
    }
    Ok(())
}

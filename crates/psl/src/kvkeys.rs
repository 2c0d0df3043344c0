//! Where a KV role that needs the KV capsule's secrets (a front end, a KV coordinator,
//! CapsuleDB, `psl node`) gets them: `--owner FILE` (development: the owner key on this
//! host's disk) or `--kv-leader ADDR` (a deployment: the role attests to the leader under the
//! policy and the leader seals the capsule's application key to the role's attested channel;
//! it stays in memory, and a restarted role attests again). docs/protocol/faas.md §KV keys.

use anyhow::{bail, Context, Result};
use clap::Args;
use psl_capsule::SignedMetadata;
use psl_crypto::AppKey;
use psl_faas::leader::KvRole;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `--kv-leader ADDR --kv-attest-policy FILE` (with `--attest ...`): the KV keys from the
/// leader instead of an owner key file.
#[derive(Args, Debug, Clone, Default)]
pub struct KvLeaderArgs {
    /// The leader (`psl leader --kv-owner`) that hands this role the KV capsule's keys after
    /// attesting it (needs --attest and --kv-attest-policy); instead of --owner. Nothing
    /// secret is written to disk: a restart attests again.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "owner")]
    pub kv_leader: Option<SocketAddr>,
    /// With --kv-leader: the attestation policy (TOML) the leader's report is checked against
    /// (the deployment's policy).
    #[arg(long, value_name = "FILE", requires = "kv_leader")]
    pub kv_attest_policy: Option<PathBuf>,
    /// With --kv-leader: how long to keep trying to reach the leader (it may be starting).
    #[arg(long, default_value_t = 120_000, value_name = "MS")]
    pub kv_leader_timeout_ms: u64,
}

/// The KV capsule's application key for `role` `id`: from `owner` (the key file) or from the
/// leader (`kv`, attesting with `attest`). Checks it is the key of the capsule `meta` names.
pub fn app_key(
    meta: &SignedMetadata,
    owner: Option<&Path>,
    kv: &KvLeaderArgs,
    attest: &crate::attest::AttestArgs,
    role: KvRole,
    id: u32,
) -> Result<AppKey> {
    match (owner, kv.kv_leader) {
        (Some(owner), None) => {
            let ok = crate::util::read_owner_key(owner)?;
            if ok.public() != meta.meta.owner {
                bail!("{} is not the owner key of capsule {}", owner.display(), meta.name());
            }
            Ok(ok.app(meta.meta.app_index)?)
        }
        (None, Some(leader)) => {
            let what = format!("KV {} {id}", role.name());
            let policy = kv.kv_attest_policy.as_ref().context("--kv-leader needs --kv-attest-policy")?;
            let verifier = crate::attest::load_policy(policy, &what)?;
            let attester = attest
                .open(&what, || crate::faas_roles::measurement(attest.sim_binary_hash.as_deref()))?
                .with_context(|| {
                    format!("--kv-leader needs --attest sim|sgx|tdx|snp|auto ({what} attests to the leader)")
                })?;
            let app = psl_faas::net::kvkeys::fetch_kv_keys_retrying(
                leader,
                &*attester,
                &verifier,
                role,
                id,
                meta,
                Duration::from_millis(kv.kv_leader_timeout_ms),
            )
            .with_context(|| format!("{what}: getting the KV keys from the leader {leader}"))?;
            tracing::info!(%leader, "{what}: KV keys received from the leader (attested; kept in memory only)");
            Ok(app)
        }
        (None, None) => bail!("give --owner FILE or --kv-leader ADDR (with --attest and --kv-attest-policy)"),
        (Some(_), Some(_)) => bail!("--owner and --kv-leader exclude each other"),
    }
}

//! Where a KV role that needs the KV capsule's secrets (a front end, a KV coordinator,
//! CapsuleDB, `psl node`) gets them: `--owner FILE` (development: the owner key on this
//! host's disk, from which it derives what it needs, as before) or `--kv-leader ADDR` (a
//! deployment: the role names the writers it will sign with, attests to the leader under the
//! policy, and the leader seals it the capsule's data key and exactly those writers' keys and
//! certificates, never the application key; they stay in memory, and a restarted role
//! attests again). Either way the role holds a [`KvKeys`], a `psl_node::KeySource` the code
//! after loading works from. docs/protocol/faas.md §KV keys.

use anyhow::{bail, Context, Result};
use clap::Args;
use psl_capsule::{SignedMetadata, WriterCert};
use psl_crypto::{AppKey, DataKey, SigningKey};
use psl_faas::kvgrant::KvRoleKeys;
use psl_faas::leader::KvRole;
use psl_node::{KeySource, NodeError};
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

/// A KV role's keys: the application key (`--owner`, development) or what the leader granted
/// it (`--kv-leader`: the data key and its own writers' keys and certificates).
pub enum KvKeys {
    Owner(AppKey),
    Leader(KvRoleKeys),
}

impl std::fmt::Debug for KvKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvKeys::Owner(_) => write!(f, "KvKeys::Owner"),
            KvKeys::Leader(k) => write!(f, "KvKeys::Leader({k:?})"),
        }
    }
}

impl KeySource for KvKeys {
    fn data_key(&self) -> DataKey {
        match self {
            KvKeys::Owner(app) => app.data_key(),
            KvKeys::Leader(k) => k.data_key(),
        }
    }

    fn writer_credentials(&self, meta: &SignedMetadata, w: u32) -> Result<(SigningKey, Option<WriterCert>), NodeError> {
        match self {
            KvKeys::Owner(app) => app.writer_credentials(meta, w),
            KvKeys::Leader(k) => k.writer_credentials(meta, w),
        }
    }
}

impl KvKeys {
    /// The application key, held only on the development path (`--owner`: what signs a
    /// coordinator's `REVOKE`s there), dropping the rest.
    pub fn into_app(self) -> Option<AppKey> {
        match self {
            KvKeys::Owner(app) => Some(app),
            KvKeys::Leader(_) => None,
        }
    }
}

/// The KV capsule's keys for `role` `id`, which signs as `writers`: from `owner` (the key file:
/// the application key, checked against the capsule `meta` names) or from the leader (`kv`,
/// attesting with `attest`: the data key and exactly `writers`' keys and certificates).
pub fn kv_keys(
    meta: &SignedMetadata,
    owner: Option<&Path>,
    kv: &KvLeaderArgs,
    attest: &crate::attest::AttestArgs,
    role: KvRole,
    id: u32,
    writers: &[u32],
) -> Result<KvKeys> {
    match (owner, kv.kv_leader) {
        (Some(owner), None) => {
            let ok = crate::util::read_owner_key(owner)?;
            if ok.public() != meta.meta.owner {
                bail!("{} is not the owner key of capsule {}", owner.display(), meta.name());
            }
            Ok(KvKeys::Owner(ok.app(meta.meta.app_index)?))
        }
        (None, Some(leader)) => {
            let what = format!("KV {} {id}", role.name());
            let policy = kv.kv_attest_policy.as_ref().context("--kv-leader needs --kv-attest-policy")?;
            let verifier = crate::attest::load_policy(policy, &what)?;
            let attester =
                attest.open(&what, || crate::attest::measurement(attest.sim_binary_hash.as_deref()))?.with_context(
                    || format!("--kv-leader needs --attest sim|sgx|tdx|snp|auto ({what} attests to the leader)"),
                )?;
            let keys = psl_faas::net::kvkeys::fetch_kv_keys_retrying(
                leader,
                &*attester,
                &verifier,
                role,
                id,
                writers,
                meta,
                Duration::from_millis(kv.kv_leader_timeout_ms),
            )
            .with_context(|| format!("{what}: getting the KV keys from the leader {leader}"))?;
            tracing::info!(
                %leader,
                ?writers,
                "{what}: KV keys received from the leader (attested; the data key and these writers only; kept in memory)"
            );
            Ok(KvKeys::Leader(keys))
        }
        (None, None) => bail!("give --owner FILE or --kv-leader ADDR (with --attest and --kv-attest-policy)"),
        (Some(_), Some(_)) => bail!("--owner and --kv-leader exclude each other"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule_with, Limits, WriterKeys};
    use psl_crypto::OwnerKey;
    use psl_node::{NodeKeys, NodeOptions};

    /// The same node options give the same keys from the owner key and from the leader's
    /// grant of exactly the writers `NodeKeys::writers_for` names; a grant for other writers
    /// (another incarnation) cannot start the node.
    #[test]
    fn kv_keys_from_the_leader_give_the_same_node_keys_as_the_owner_key() {
        let owner = OwnerKey::generate();
        let meta = new_capsule_with(&owner, 2, "kvkeys", 1, Limits::default(), WriterKeys::Certified).unwrap();
        let app = owner.app(2).unwrap();
        let opts = NodeOptions { node_id: 7, incarnation: 3, writers: 3, ..NodeOptions::default() };
        let want = NodeKeys::writers_for(&meta, &opts).unwrap();
        let bundle = psl_faas::kvgrant::kv_bundle(&meta, &app, &want).unwrap();
        let granted = KvKeys::Leader(psl_faas::kvgrant::parse_kv_bundle(&bundle, &want, &meta).unwrap());
        let a = NodeKeys::from_source(&meta, &KvKeys::Owner(owner.app(2).unwrap()), &opts).unwrap();
        let b = NodeKeys::from_source(&meta, &granted, &opts).unwrap();
        let pubs = |k: &NodeKeys| k.writers.iter().map(|(w, s)| (*w, s.verifying_key())).collect::<Vec<_>>();
        assert_eq!(pubs(&a), pubs(&b));
        assert_eq!(a.certs, b.certs);
        assert_eq!(a.data_key.expose_bytes(), b.data_key.expose_bytes());
        assert!(granted.into_app().is_none(), "a grant holds no application key");
        let later = NodeOptions { incarnation: 4, ..opts };
        let bundle = psl_faas::kvgrant::kv_bundle(&meta, &app, &want).unwrap();
        let granted = KvKeys::Leader(psl_faas::kvgrant::parse_kv_bundle(&bundle, &want, &meta).unwrap());
        assert!(NodeKeys::from_source(&meta, &granted, &later).is_err());
    }
}

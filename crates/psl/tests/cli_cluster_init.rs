//! `psl up --config F --init` as an attacker who copies what every host shares sees it: the
//! shared directory holds no secret key of the KV capsule (not the owner key, not the
//! application key, not the data key, in any encoding), each KV capsule server gets only its
//! own ack key in its own host's directory, and a capsule server started from those files
//! refuses a key that is not its own.

use std::path::{Path, PathBuf};
use std::process::Command;

const CONFIG: &str = r#"[cluster]
dir = "state"
shared = "shared"

[[host]]
name = "a"
address = "127.0.0.1"
router = true
leader = true
scheduler = true
kv_servers = [0]
kv_coordinators = [0]
memcached = [1]

[[host]]
name = "b"
address = "127.0.0.2"
kv_servers = [1]
capsuledb = true

[[host]]
name = "c"
address = "127.0.0.3"
kv_servers = [2]
workers = [1]
"#;

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The KV capsule's secrets as an attacker would grep for them: raw bytes and lower- and
/// upper-case hex.
fn needles(owner_file: &Path, capsule: &Path) -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(owner_file).unwrap();
    let owner = psl_crypto::OwnerKey::from_file_string(&text).unwrap();
    let meta = psl_capsule::CapsuleFile::parse(&std::fs::read(capsule).unwrap()).unwrap().metadata;
    let app = owner.app(meta.meta.app_index).unwrap();
    let body = text.lines().nth(1).unwrap().trim().to_string();
    let raw_owner = hex::decode(&body).unwrap();
    let data = app.data_key().expose_bytes().to_vec();
    let app_secret = app.signing_key().expose_secret_bytes().to_vec();
    let mut v = Vec::new();
    for (what, raw) in [("owner key", raw_owner), ("data key", data), ("application key", app_secret)] {
        v.push((format!("{what} (hex)"), hex::encode(&raw).into_bytes()));
        v.push((format!("{what} (HEX)"), hex::encode_upper(&raw).into_bytes()));
        // The secret scalar alone (the owner key's first 32 bytes) counts too.
        v.push((format!("{what} (first half, hex)"), hex::encode(&raw[..16]).into_bytes()));
        v.push((format!("{what} (raw)"), raw));
    }
    v
}

fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn init_shares_no_secret_key_and_gives_capsule_servers_only_their_ack_keys() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::write(d.join("cluster.toml"), CONFIG).unwrap();
    let init = || {
        let o = Command::new(env!("CARGO_BIN_EXE_psl"))
            .args(["up", "--config", "cluster.toml", "--init"])
            .current_dir(d)
            .output()
            .unwrap();
        assert!(o.status.success(), "--init: {}", String::from_utf8_lossy(&o.stderr));
    };
    init();
    // Wherever --init put the owner key, find it: the attack is finding it in shared/.
    let owner_file = [d.join("psl-operator/kv-owner.key"), d.join("shared/kv-owner.key")]
        .into_iter()
        .find(|p| p.exists())
        .expect("--init made the KV owner key");
    let capsule = d.join("shared/kv.capsule");
    let secrets = needles(&owner_file, &capsule);
    let shared = files(&d.join("shared"));
    assert!(!shared.is_empty());
    for f in &shared {
        let bytes = std::fs::read(f).unwrap();
        for (what, n) in &secrets {
            assert!(!holds(&bytes, n), "{} holds the KV {what}: every host gets it", f.display());
        }
    }
    // The owner key stays in the operator's directory, readable by the operator only.
    assert_eq!(owner_file, d.join("psl-operator/kv-owner.key"));
    assert_eq!(std::fs::metadata(&owner_file).unwrap().permissions().mode() & 0o777, 0o600);

    // Each capsule server: its own ack key (0600) in its own host's directory, its certificate
    // (public) in shared/; no other host's directory holds that key.
    let meta = psl_capsule::CapsuleFile::parse(&std::fs::read(&capsule).unwrap()).unwrap().metadata;
    for (host, id) in [("a", 0u32), ("b", 1), ("c", 2)] {
        let key = d.join(format!("state/{host}/kv-server{id}.ack-key"));
        let mode = std::fs::metadata(&key).unwrap_or_else(|_| panic!("{} made", key.display())).permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        let cert =
            psl_capsule::WriterCert::decode(&std::fs::read(d.join(format!("shared/kv-server{id}.cert"))).unwrap())
                .unwrap();
        cert.check(meta.name(), &meta.meta.app.point()).unwrap();
        assert_eq!(Some(cert.writer), psl_scl::server_writer(id));
        for other in ["a", "b", "c"].into_iter().filter(|o| *o != host) {
            assert!(!d.join(format!("state/{other}/kv-server{id}.ack-key")).exists());
        }
    }
    // The owner key only on the leader's host (a), for `psl leader --kv-owner`: the front ends,
    // KV coordinators and CapsuleDB get their keys from the leader after attestation. Host b
    // (CapsuleDB) and host c (capsule server only) hold no KV secret.
    let k = d.join("state/a/kv-owner.key");
    assert_eq!(std::fs::metadata(&k).unwrap().permissions().mode() & 0o777, 0o600, "{}", k.display());
    for host in ["b", "c"] {
        for f in &files(&d.join(format!("state/{host}"))) {
            let bytes = std::fs::read(f).unwrap();
            for (what, n) in &secrets {
                assert!(!holds(&bytes, n), "{} (not the leader's host) holds the KV {what}", f.display());
            }
        }
    }
    // A copy an older `--init` left on a host that does not run the leader is removed.
    std::fs::copy(&k, d.join("state/b/kv-owner.key")).unwrap();
    init();
    assert!(!d.join("state/b/kv-owner.key").exists(), "the old copy on host b is still there");
    assert!(k.exists());

    // The shard map (sharding.md §3): one shard, the KV capsule, served by the front end of
    // the file (host a's, at its peer port 7961), signed by the owner in a capsule of its own,
    // which the shared directory holds and `psl shard show` verifies.
    let show = || -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_psl"))
            .args(["shard", "show", "--map", "shared/kv-map.capsule", "--owner", "psl-operator/kv-owner.key", "--json"])
            .current_dir(d)
            .output()
            .unwrap();
        assert!(o.status.success(), "shard show: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let map = show();
    assert_eq!(map["map_version"], 1, "{map}");
    assert_eq!(map["shards"][0]["capsule"], meta.name().0.to_hex(), "{map}");
    assert_eq!(map["shards"][0]["front_ends"], serde_json::json!(["127.0.0.1:7961"]), "{map}");
    assert_eq!(map["routes"], serde_json::json!([{"first": 0, "last": u64::MAX, "shard": 0}]), "{map}");
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["shard", "which", "--map", "shared/kv-map.capsule", "--owner", "psl-operator/kv-owner.key", "--json"])
        .args(["--", "user:1", "{user42}.cart"])
        .current_dir(d)
        .output()
        .unwrap();
    let which: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(which["keys"][1]["point"], psl_scl::shard::point(b"user42"), "{which}");
    assert_eq!(which["keys"][0]["capsule"], map["shards"][0]["capsule"], "{which}");

    // Running it again keeps every key, and the map (nothing in it changed).
    let before = std::fs::read(d.join("state/c/kv-server2.ack-key")).unwrap();
    init();
    assert_eq!(std::fs::read(d.join("state/c/kv-server2.ack-key")).unwrap(), before);
    assert_eq!(show()["map_version"], 1);

    // A capsule server given another server's ack key refuses to start (before any network).
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["capsule-server", "--capsule", "shared/kv.capsule", "--ack-key", "state/c/kv-server2.ack-key"])
        .args(["--cert", "shared/kv-server2.cert", "--fabric", "psl://127.0.0.1:9", "--dir", "srv", "--id", "1"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("server 1"), "{err}");
    // And so does one whose certificate is not its key's.
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["capsule-server", "--capsule", "shared/kv.capsule", "--ack-key", "state/c/kv-server2.ack-key"])
        .args(["--cert", "shared/kv-server1.cert", "--fabric", "psl://127.0.0.1:9", "--dir", "srv", "--id", "2"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(!o.status.success(), "a certificate of another key was accepted");
}

/// A cluster made before this change has the owner key in shared/: `--init` moves it to the
/// operator's directory.
#[test]
fn init_moves_an_owner_key_out_of_an_old_shared_directory() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::write(d.join("cluster.toml"), CONFIG).unwrap();
    std::fs::create_dir_all(d.join("shared")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["keys", "new", "--out", "shared/kv-owner.key"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success());
    let old = std::fs::read(d.join("shared/kv-owner.key")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["up", "--config", "cluster.toml", "--init"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "--init: {}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.join("shared/kv-owner.key").exists(), "the owner key is still shared");
    assert_eq!(std::fs::read(d.join("psl-operator/kv-owner.key")).unwrap(), old);
}

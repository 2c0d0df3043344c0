//! SecureCached on the KV deployment of `psl up --kv`, and its memory limit backed by CapsuleDB.
//!
//! - `psl up --kv --memcached 3` (its coordinator, capsule servers, CapsuleDB and three front
//!   ends in one peer group, with home failover); two more front ends join with `psl memcached --cluster DIR` alone
//!   (fresh node ids drawn from DIR): sets through one are read through another, and two
//!   concurrent `cas` with one unique, through a joined front end and a group member, give
//!   exactly one STORED (the joined one forwards to the key's home); an item written before
//!   they joined reads through CapsuleDB with its unique.
//! - A front end with a 1 MiB memory limit and CapsuleDB (embedded `--capsuledb`, and a joined
//!   one in the cluster) writes several times more than fits and reads every item back with its
//!   value, flags and CAS unique, while `stats evictions` counts the local evictions; without
//!   CapsuleDB the same workload loses items (evicted = miss), so the check can fail.
//!
//! Every wait is bounded; every process is killed when the test ends (`psl up`'s children die
//! with it).

use std::net::SocketAddr;
use std::path::Path;

mod common;
use common::eventually;
use common::mc::{cas_race, Client};
use common::{start, Proc};

/// A value of `len` bytes that differs per key.
fn value_of(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| b'a' + ((i * 7 + j) % 26) as u8).collect()
}

/// Writes `n` items of 1000 bytes (flags = i) through `c`, each followed by `gets` to learn its
/// unique; then reads every one back and requires the same value, flags and unique. Returns
/// how many were missing on the read back (0 with CapsuleDB).
fn write_many_then_read_back(c: &mut Client, prefix: &str, n: usize) -> usize {
    let mut uniques = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("{prefix}{i}");
        assert_eq!(c.set(&key, i as u32, &value_of(i, 1000)), "STORED", "{key}");
        let (data, flags, unique) = c.gets(&key).expect("just written");
        assert_eq!((data, flags), (value_of(i, 1000), i as u32));
        uniques.push(unique);
    }
    let mut missing = 0;
    for (i, unique) in uniques.iter().enumerate() {
        let key = format!("{prefix}{i}");
        match c.gets(&key) {
            Some((data, flags, u)) => {
                assert_eq!(data, value_of(i, 1000), "{key}: value");
                assert_eq!(flags, i as u32, "{key}: flags");
                assert_eq!(u, *unique, "{key}: CAS unique changed across the eviction");
            }
            None => missing += 1,
        }
    }
    missing
}

fn cluster_kv(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("cluster.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["kv"].clone()
}

#[test]
fn front_ends_joining_psl_up_kv_by_its_dir_share_items_and_cas_arbitration() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    #[rustfmt::skip]
    let args = ["up", "--kv", "--memcached", "3", "--workers", "1", "--servers", "0", "--dir", "up", "--kv-memory-mb", "1",
                "--kv-writers", "2", "--kv-flush-us", "1000", "--kv-flow-window-records", "256"];
    let _up: Proc = start(d, &args, "up");
    let kv = cluster_kv(&d.join("up"));
    let group: Vec<SocketAddr> =
        kv["front_ends"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(group.len(), 3);
    assert_eq!(kv["peers"].as_array().unwrap().len(), 3);
    // Three front ends fail homes over; the record says so for the ones that join.
    assert_eq!(kv["home_lease_ms"], 1000);
    assert!(kv["coordinator_control"].is_string() && kv["capsuledb_control"].is_string(), "{kv}");
    // The KV owner key is readable by its owner only.
    use std::os::unix::fs::PermissionsExt;
    let owner = kv["owner"].as_str().unwrap();
    assert_eq!(std::fs::metadata(owner).unwrap().permissions().mode() & 0o777, 0o600);
    // The capsule servers are started keyless: no owner key on their command lines, only their
    // own ack keys (0600).
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("up/cluster.json")).unwrap()).unwrap();
    let servers: Vec<u64> = file["pids"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p[0].as_str().unwrap().starts_with("kv capsule server"))
        .map(|p| p[1].as_u64().unwrap())
        .collect();
    assert_eq!(servers.len(), 3, "{}", file["pids"]);
    for pid in servers {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into()).collect();
        assert!(!args.iter().any(|a| a == "--owner" || a == owner), "a capsule server got the owner key: {args:?}");
        let i = args.iter().position(|a| a == "--ack-key").expect("its own ack key");
        assert_eq!(std::fs::metadata(&args[i + 1]).unwrap().permissions().mode() & 0o777, 0o600);
    }

    // The shard map names this KV capsule and the group's peer addresses (sharding.md §3).
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(["shard", "show", "--json", "--owner", owner, "--map", kv["map"].as_str().expect("the map capsule")])
        .output()
        .unwrap();
    assert!(o.status.success(), "shard show: {}", String::from_utf8_lossy(&o.stderr));
    let map: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(map["shards"][0]["front_ends"], kv["peers"], "{map}");
    assert_eq!(map["map_version"], kv["map_version"], "{map}");

    // Written before anyone joins: a joined node never received it, CapsuleDB did.
    let mut g0 = Client::connect(group[0]);
    // The group's front ends run with the writers and flow window `psl up` was given.
    assert_eq!(g0.stat("psl_writers"), 2);
    assert_eq!(g0.stat("psl_flow_window_records"), 256);
    assert_eq!(g0.stat("psl_flow_window_ops"), psl_node::flow::WINDOW_OPS_DEFAULT as u64);
    assert_eq!(g0.set("early", 7, b"before"), "STORED");
    let early = g0.gets("early").unwrap();

    // Two front ends join by the deployment's directory alone, each with a fresh node id.
    let join = |extra: &[&str]| {
        let mut args =
            vec!["memcached", "--listen", "127.0.0.1:0", "--cluster", "up", "--writers", "1", "--verifiers", "1"];
        args.extend_from_slice(extra);
        start(d, &args, "listening")
    };
    let j1 = join(&["--memory-mb", "1"]);
    let j2 = join(&[]);
    let next_id = std::fs::read_to_string(d.join("up/kv/joined/next-id")).unwrap();
    assert_eq!(next_id.trim(), "1002", "two joins drew ids 1000 and 1001");
    let (mut c1, mut c2) = (Client::connect(j1.addr()), Client::connect(j2.addr()));
    assert_eq!(c2.gets("early"), Some(early), "an item older than the join reads through CapsuleDB, same unique");

    // Set through one joined front end, read through the other and through the group.
    assert_eq!(c1.set("shared", 42, b"hello"), "STORED");
    eventually("the other joined front end sees the set", || c2.gets("shared").is_some());
    eventually("a group front end sees the set", || g0.gets("shared").is_some());
    let (data, flags, unique) = c2.gets("shared").unwrap();
    assert_eq!((data.as_slice(), flags), (&b"hello"[..], 42));
    assert_eq!(g0.gets("shared").unwrap().2, unique, "one version, one unique everywhere");
    assert_eq!(g0.set("back", 1, b"x"), "STORED");
    eventually("a joined front end sees a group member's set", || c1.gets("back").is_some());

    // Two concurrent cas with one unique, through a joined front end and a group member:
    // exactly one STORED, whichever member is the key's home.
    let g1 = group[1];
    for round in 0..16 {
        let key = format!("race{round}");
        assert_eq!(c2.set(&key, 0, b"0"), "STORED");
        let unique = c2.gets(&key).unwrap().2;
        eventually("the group member holds the version", || {
            Client::connect(g1).gets(&key).map(|x| x.2) == Some(unique)
        });
        let replies = cas_race([(j2.addr(), "J"), (g1, "G")], &key, unique);
        assert_eq!(replies, vec!["EXISTS".to_string(), "STORED".to_string()], "round {round}");
    }
    assert!(c2.stat("forwarded") >= 16, "a joined front end forwards every conditional command");
    // Every front end reports what crossing the fabric cost it (`psl bench cluster` reads
    // these); this light load lost nothing on a full queue.
    for c in [&mut c1, &mut c2] {
        let _ = (c.stat("psl_repair_requests_sent"), c.stat("psl_repair_records_sent"));
        assert_eq!((c.stat("psl_inbound_dropped"), c.stat("psl_outbound_dropped")), (0, 0));
    }

    // The joined front end with CapsuleDB and a 1 MiB limit loses nothing by evicting.
    assert_eq!(write_many_then_read_back(&mut c1, "big", 2500), 0);
    assert!(c1.stat("evictions") > 0, "the limit evicted local copies");
}

#[test]
fn a_front_end_with_capsuledb_over_its_memory_limit_reads_every_item_back() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let n = 3000; // about 3.2 MB of items against a 1 MiB limit
    let backed = start(
        d,
        &["memcached", "--listen", "127.0.0.1:0", "--memory-mb", "1", "--capsuledb", "--writers", "1"],
        "listening",
    );
    let mut c = Client::connect(backed.addr());
    assert_eq!(write_many_then_read_back(&mut c, "k", n), 0, "every item reads back through CapsuleDB");
    // Read everything again at once (each key re-read within a second of its last read): the
    // copies fetched back from CapsuleDB are accounted again and evicted again, so the node's
    // memtable holds what the limit accounts for (about 950 items, plus as many pinned at most).
    for i in 0..n {
        assert_eq!(c.gets(&format!("k{i}")).map(|x| x.1), Some(i as u32));
    }
    let (held, items) = (c.stat("psl_memtable_entries"), c.stat("curr_items"));
    assert!(items < 2000, "{items} items accounted: about the limit's 950 plus as many pinned at most");
    assert!(
        held <= items + 16,
        "the node holds {held} entries but accounts for {items}: fetched copies escaped the limit"
    );
    let evictions = c.stat("evictions");
    assert!(evictions >= (n as u64) / 2, "evictions {evictions}: the limit holds about a third of the items");
    let bytes = c.stat("bytes");
    assert!(bytes <= 2 << 20, "accounted bytes {bytes}: at most the limit plus pinned copies (another limit)");
    // A key never written is still a miss (CapsuleDB answers "never written").
    assert!(c.gets("never-written").is_none());
    drop(backed);

    // The control: without CapsuleDB the same workload loses evicted items from this view.
    let plain = start(d, &["memcached", "--listen", "127.0.0.1:0", "--memory-mb", "1", "--writers", "1"], "listening");
    let mut c = Client::connect(plain.addr());
    let missing = write_many_then_read_back(&mut c, "k", n);
    assert!(missing > n / 2, "without CapsuleDB evicted items miss ({missing} of {n})");
    assert!(c.stat("evictions") >= missing as u64);
}

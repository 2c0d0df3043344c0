//! `psl up --kv --shards 2`: a key space of two shards, each its own capsule with its own
//! capsule server, CapsuleDB, coordinator and front end (docs/protocol/sharding.md). Every key
//! is stored by its shard's front end only, whichever front end the client asked; reads,
//! `gets`/`cas` and multi-key `get`s work through either; each front end says which shard it
//! serves under which map, as the verified map capsule (`psl shard show|which`) does.
//!
//! Every wait is bounded; every process is killed when the test ends (`psl up`'s children die
//! with it).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

mod common;
use common::mc::Client;
use common::start;

fn psl_json(d: &Path, args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_psl")).args(args).current_dir(d).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn two_shards_each_store_their_own_keys_and_every_front_end_serves_every_key() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    #[rustfmt::skip]
    let args = ["up", "--kv", "--shards", "2", "--memcached", "1", "--workers", "1", "--servers", "0", "--kv-servers", "1",
                "--dir", "up", "--kv-memory-mb", "8"];
    let _up = start(d, &args, "up");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("up/cluster.json")).unwrap()).unwrap();
    let kv = &file["kv"];
    let fronts: Vec<SocketAddr> =
        kv["shard_front_ends"].as_array().unwrap().iter().map(|s| s[0].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(fronts.len(), 2, "{kv}");
    // Each shard's roles are processes of their own.
    let names: Vec<&str> = file["pids"].as_array().unwrap().iter().map(|p| p[0].as_str().unwrap()).collect();
    for n in ["kv capsule server 0", "kv shard 1 capsule server 0", "kv shard 1 coordinator", "kv shard 1 capsuledb"] {
        assert!(names.contains(&n), "no {n:?} in {names:?}");
    }

    // The map: two shards, two capsules, each half of the point space.
    let (owner, map) = (kv["owner"].as_str().unwrap(), kv["map"].as_str().unwrap());
    let shown = psl_json(d, &["shard", "show", "--map", map, "--owner", owner, "--json"]);
    assert_eq!(shown["shards"].as_array().unwrap().len(), 2, "{shown}");
    assert_ne!(shown["shards"][0]["capsule"], shown["shards"][1]["capsule"]);
    assert_eq!(shown["routes"][1]["first"], 1u64 << 63, "{shown}");
    let shard1 = psl_capsule::CapsuleFile::parse(&std::fs::read(d.join("up/kv/shard1/kv.capsule")).unwrap()).unwrap();
    assert_eq!(shown["shards"][1]["capsule"], shard1.metadata.name().0.to_hex());

    let keys: Vec<String> = (0..40).map(|i| format!("user:{i}")).collect();
    let mut which = vec!["shard", "which", "--map", map, "--owner", owner, "--json", "--"];
    which.extend(keys.iter().map(String::as_str));
    let which = psl_json(d, &which);
    let shard_of: Vec<u64> = which["keys"].as_array().unwrap().iter().map(|k| k["shard"].as_u64().unwrap()).collect();
    let per_shard = [shard_of.iter().filter(|s| **s == 0).count(), shard_of.iter().filter(|s| **s == 1).count()];
    assert!(per_shard[0] > 0 && per_shard[1] > 0, "40 keys fall in both halves: {per_shard:?}");

    let mut c = [Client::connect(fronts[0]), Client::connect(fronts[1])];
    for (i, s) in [0u64, 1].iter().enumerate() {
        assert_eq!(c[i].stat("psl_shard"), *s);
        assert_eq!(c[i].stat("psl_shards"), 2);
        assert_eq!(c[i].stat("psl_shard_map_version"), shown["map_version"].as_u64().unwrap());
    }
    // Half the keys set through each front end, whatever their shard.
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(c[i % 2].set(k, i as u32, format!("v{i}").as_bytes()), "STORED", "{k}");
    }
    // Every key reads back through both front ends.
    for (i, k) in keys.iter().enumerate() {
        for cl in c.iter_mut() {
            let (data, flags, _) = cl.gets(k).unwrap_or_else(|| panic!("{k} missing"));
            assert_eq!((data, flags), (format!("v{i}").into_bytes(), i as u32), "{k}");
        }
    }
    // Each shard's front end stores exactly its shard's keys (its local items).
    for s in 0..2 {
        assert_eq!(c[s].stat("curr_items"), per_shard[s] as u64, "shard {s}'s front end holds only its keys");
    }
    assert!(c[0].stat("shard_forwarded") > 0 && c[1].stat("shard_served") > 0);

    // A multi-key get across both shards, in one request: every value, one END.
    c[0].w.write_all_str(&format!("get {} {} nothing\r\n", keys[0], keys[1]));
    let mut got = Vec::new();
    loop {
        let l = c[0].line();
        if l == "END" {
            break;
        }
        got.push(l);
    }
    assert_eq!(got.iter().filter(|l| l.starts_with("VALUE")).count(), 2, "{got:?}");
    // gets through one shard's front end, cas through the other's: the key's shard decides,
    // exactly once.
    let k = &keys[shard_of.iter().position(|s| *s == 1).unwrap()];
    let (_, _, unique) = c[0].gets(k).unwrap();
    assert_eq!(c[1].call(&format!("cas {k} 0 0 1 {unique}\r\nx\r\n")), "STORED");
    assert_eq!(c[0].call(&format!("cas {k} 0 0 1 {unique}\r\ny\r\n")), "EXISTS");

    // A newer map (here: each shard also lists a front end that is down, first) reaches the
    // running front ends, which verify it and route by it; a dead address is skipped for the
    // shard's live one.
    let owner_key = psl::util::read_owner_key(Path::new(owner)).unwrap();
    let kv0 =
        psl_capsule::CapsuleFile::parse(&std::fs::read(d.join("up/kv/kv.capsule")).unwrap()).unwrap().metadata.name();
    let mut next = psl::shard::read(Path::new(map), &owner_key, Some(&kv0)).unwrap().unwrap().map;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    for s in next.shards.iter_mut() {
        s.front_ends.insert(0, dead.clone());
    }
    let (published, written) = psl::shard::publish(Path::new(map), &owner_key, &kv0, next).unwrap();
    assert!(written);
    let v = published.map.map_version;
    common::eventually("both front ends route by the new map", || {
        c.iter_mut().all(|cl| cl.stat("psl_shard_map_version") == v)
    });
    for (i, k) in keys.iter().enumerate().take(10) {
        assert!(c[1 - i % 2].gets(k).is_some(), "{k} under map version {v}");
    }

    // Started again with one shard, the store would route shard 1's keys to shard 0's
    // capsule, where they are not: `psl up` refuses, before any KV role starts.
    drop(c);
    drop(_up);
    let mut again: Vec<&str> = args.to_vec();
    again[3] = "1";
    let mut child = Command::new(env!("CARGO_BIN_EXE_psl"))
        .args(&again)
        .current_dir(d)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("psl up --shards 1 on a store of 2 shards is still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("holds 2 shard(s)"), "{err}");
}

/// `write_all` of a string on the client's socket.
trait WriteStr {
    fn write_all_str(&mut self, s: &str);
}

impl WriteStr for std::net::TcpStream {
    fn write_all_str(&mut self, s: &str) {
        use std::io::Write;
        self.write_all(s.as_bytes()).unwrap();
    }
}

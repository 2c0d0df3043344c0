//! A key space of two shards (two capsules, one front end each, peer channels on loopback):
//! every command on a key of the other shard runs there, whole, and answers exactly as if the
//! client had sent it there; a front end refuses a command its own map puts in another shard
//! rather than forwarding it again; an unreachable shard is a `SERVER_ERROR` naming it.

use psl_crypto::DataKey;
use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::peer::{PeerClient, PeerConfig, PeerKey, PeerServer};
use psl_memcached::session::Session;
use psl_memcached::shards::Shards;
use psl_memcached::store::{FrontEnd, Lookup};
use psl_scl::shard::{Route, Shard, ShardMap};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn run(fe: &FrontEnd, s: &mut Session, bytes: &[u8]) -> String {
    s.input().extend_from_slice(bytes);
    s.process(fe);
    let out = String::from_utf8_lossy(s.output()).to_string();
    let n = s.output().len();
    s.consume_output(n);
    out
}

/// A key of `shard` under `map`, with prefix `p`.
fn key_in(map: &ShardMap, shard: u16, p: &str) -> String {
    (0..).map(|i| format!("{p}{i}")).find(|k| map.shard_of(k.as_bytes()) == shard).unwrap()
}

#[test]
fn commands_on_the_other_shards_keys_run_there_and_answer_as_there() {
    let (d0, d1) =
        (Embedded::start(&EmbeddedOptions::default()).unwrap(), Embedded::start(&EmbeddedOptions::default()).unwrap());
    let (fe0, fe1): (Arc<FrontEnd>, Arc<FrontEnd>) = (d0.front_ends[0].clone(), d1.front_ends[0].clone());
    let key = PeerKey::derive(&DataKey::from_bytes(&[9; 32]));
    let s0 = PeerServer::start(&fe0, TcpListener::bind("127.0.0.1:0").unwrap(), key.clone()).unwrap();
    let s1 = PeerServer::start(&fe1, TcpListener::bind("127.0.0.1:0").unwrap(), key.clone()).unwrap();
    let map = ShardMap {
        map_version: 1,
        shards: vec![
            Shard { capsule: d0.meta.name().0 .0, front_ends: vec![s0.addr().to_string()] },
            Shard { capsule: d1.meta.name().0 .0, front_ends: vec![s1.addr().to_string()] },
        ],
        routes: vec![Route { first: 0, shard: 0 }, Route { first: 1 << 63, shard: 1 }],
        moves: vec![],
    };
    let cfg = PeerConfig { timeout: Duration::from_millis(500) };
    fe0.serve_shard(Shards::new(map.clone(), &d0.meta.name().0 .0, key.clone(), cfg).unwrap());
    fe1.serve_shard(Shards::new(map.clone(), &d1.meta.name().0 .0, key.clone(), cfg).unwrap());
    let (k0, k1, n1) = (key_in(&map, 0, "a"), key_in(&map, 1, "b"), key_in(&map, 1, "n"));
    let mut c = Session::new();

    // A set of shard 1's key through shard 0's front end is stored in shard 1 only.
    assert_eq!(
        run(&fe0, &mut c, format!("set {k1} 5 0 2\r\nhi\r\nset {k0} 6 0 2\r\nyo\r\n").as_bytes()),
        "STORED\r\nSTORED\r\n"
    );
    assert!(matches!(fe1.lookup(k1.as_bytes()), Lookup::Hit { .. }));
    assert!(matches!(fe0.lookup(k1.as_bytes()), Lookup::Miss), "shard 0's store holds no key of shard 1");
    assert!(matches!(fe1.lookup(k0.as_bytes()), Lookup::Miss));

    // A get of keys of both shards: every value, one END.
    assert_eq!(
        run(&fe0, &mut c, format!("get {k0} {k1} missing\r\n").as_bytes()),
        format!("VALUE {k0} 6 2\r\nyo\r\nVALUE {k1} 5 2\r\nhi\r\nEND\r\n")
    );
    // gets, then cas with that unique, through either front end: shard 1 arbitrates.
    let out = run(&fe1, &mut c, format!("gets {k1}\r\n").as_bytes());
    let unique: u64 = out.lines().next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(
        run(&fe0, &mut c, format!("gets {k1}\r\n").as_bytes()),
        out,
        "the same unique from either shard's front end"
    );
    assert_eq!(run(&fe0, &mut c, format!("cas {k1} 0 0 3 {unique}\r\nnew\r\n").as_bytes()), "STORED\r\n");
    assert_eq!(run(&fe0, &mut c, format!("cas {k1} 0 0 3 {unique}\r\nold\r\n").as_bytes()), "EXISTS\r\n");
    // Counters, meta commands, noreply and touch go the same way.
    assert_eq!(run(&fe0, &mut c, format!("set {n1} 0 0 1 noreply\r\n5\r\nincr {n1} 3\r\n").as_bytes()), "8\r\n");
    assert_eq!(run(&fe0, &mut c, format!("mg {n1} v\r\n").as_bytes()), "VA 1\r\n8\r\n");
    assert_eq!(
        run(&fe0, &mut c, format!("touch {k1} 100\r\ngat 200 {k1}\r\n").as_bytes()),
        format!("TOUCHED\r\nVALUE {k1} 0 3\r\nnew\r\nEND\r\n")
    );
    assert_eq!(run(&fe0, &mut c, format!("delete {n1}\r\nget {n1}\r\n").as_bytes()), "DELETED\r\nEND\r\n");
    assert!(fe0.stats.shard_forwarded.load(std::sync::atomic::Ordering::Relaxed) >= 10);
    // flush_all through either front end flushes every shard's items.
    assert_eq!(run(&fe1, &mut c, b"flush_all\r\n"), "OK\r\n");
    assert_eq!(run(&fe0, &mut c, format!("get {k0} {k1}\r\n").as_bytes()), "END\r\n");
    assert_eq!(run(&fe1, &mut c, format!("get {k0} {k1}\r\n").as_bytes()), "END\r\n");
    assert_eq!(
        run(&fe0, &mut c, format!("set {k1} 0 0 3\r\nnew\r\nset {k0} 6 0 2\r\nyo\r\n").as_bytes()),
        "STORED\r\nSTORED\r\n"
    );

    // A prefix scan through either front end pages through both shards' keys in key order.
    let mut want: Vec<String> = (0..12).map(|i| format!("s:{i:02}")).collect();
    for (i, k) in want.iter().enumerate() {
        assert_eq!(run(&fe0, &mut c, format!("set {k} 0 0 1\r\n{}\r\n", i % 10).as_bytes()), "STORED\r\n");
    }
    assert!(
        want.iter().any(|k| map.shard_of(k.as_bytes()) == 0) && want.iter().any(|k| map.shard_of(k.as_bytes()) == 1)
    );
    for fe in [&fe0, &fe1] {
        let (mut got, mut after) = (Vec::new(), None::<Vec<u8>>);
        loop {
            let (items, more) = fe.scan_shards(b"s:", after.as_deref(), 5).unwrap();
            assert!(items.len() <= 5);
            got.extend(items.iter().map(|(k, _)| String::from_utf8(k.clone()).unwrap()));
            after = items.last().map(|(k, _)| k.clone());
            if !more {
                break;
            }
        }
        assert_eq!(got, want);
    }
    want.clear();

    // Two maps that disagree do not bounce a command: shard 1's front end refuses a command
    // on shard 0's key (as a front end whose map is behind would send it) and stores nothing.
    let raw = PeerClient::new(s1.addr(), key.clone(), cfg);
    let reply = raw.call_command(format!("set {k0} 0 0 1\r\nx\r\n").as_bytes()).unwrap();
    assert!(String::from_utf8_lossy(&reply).starts_with("SERVER_ERROR key of shard 0"), "{reply:?}");
    assert!(matches!(fe1.lookup(k0.as_bytes()), Lookup::Miss));
    let reply = raw.call_command(format!("get {k1} {k0}\r\n").as_bytes()).unwrap();
    assert!(String::from_utf8_lossy(&reply).starts_with("SERVER_ERROR key of shard 0"), "{reply:?}");
    // Not one complete request: refused.
    let reply = raw.call_command(format!("set {k1} 0 0 9\r\nshort").as_bytes()).unwrap();
    assert!(String::from_utf8_lossy(&reply).starts_with("CLIENT_ERROR"), "{reply:?}");
    // Only holders of the peer key get a command run: another key gets no answer.
    let stranger = PeerClient::new(s1.addr(), PeerKey::derive(&DataKey::from_bytes(&[1; 32])), cfg);
    assert!(stranger.call_command(format!("delete {k1}\r\n").as_bytes()).is_err());
    assert!(matches!(fe1.lookup(k1.as_bytes()), Lookup::Hit { .. }));

    // Shard 1 down (its front end and its peer server gone): its keys fail with an error
    // naming it, within the peer timeout; shard 0's keys are served as before.
    drop((s1, fe1, d1));
    let t = Instant::now();
    let out = run(&fe0, &mut c, format!("get {k0} {k1}\r\n").as_bytes());
    assert!(out.starts_with(&format!("VALUE {k0} 6 2\r\nyo\r\nSERVER_ERROR shard 1")), "{out}");
    assert!(!out.contains("END"), "a get that fails at a key ends there, as memcached's does: {out}");
    assert!(run(&fe0, &mut c, format!("set {k1} 0 0 1\r\nz\r\n").as_bytes()).starts_with("SERVER_ERROR shard 1"));
    assert!(t.elapsed() < Duration::from_secs(5), "bounded by the peer timeout: {:?}", t.elapsed());
    assert_eq!(run(&fe0, &mut c, format!("get {k0}\r\n").as_bytes()), format!("VALUE {k0} 6 2\r\nyo\r\nEND\r\n"));
    assert!(fe0.scan_shards(b"s:", None, 5).unwrap_err().contains("shard 1"));
    assert!(fe0.stats.shard_forward_failures.load(std::sync::atomic::Ordering::Relaxed) >= 2);
}

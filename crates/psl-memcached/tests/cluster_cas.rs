//! Two front ends on two nodes in one process (in-process hub): replication through SCL and
//! CAS arbitration by each key's home front end.

mod common;
use common::{start_with, Client};
use psl_memcached::{Config, ServerConfig};
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[test]
fn a_set_through_one_front_end_is_visible_through_the_other_after_sync() {
    let srv = start_with(2, Config::default(), ServerConfig::default());
    let (a, b) = (srv.servers[0].addr(), srv.servers[1].addr());
    let mut ca = Client::connect(a);
    let mut cb = Client::connect(b);
    ca.expect("set shared 42 0 5\r\nhello\r\n", "STORED\r\n");
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    cb.expect("get shared\r\n", "VALUE shared 42 5\r\nhello\r\nEND\r\n");
    // The CAS unique comes from the record version: the same through both front ends.
    assert_eq!(ca.gets("shared").unwrap().2, cb.gets("shared").unwrap().2);
    // A delete replicates too.
    cb.expect("delete shared\r\n", "DELETED\r\n");
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    ca.expect("get shared\r\n", "END\r\n");
}

#[test]
fn of_two_concurrent_cas_with_one_unique_exactly_one_is_stored() {
    let srv = start_with(2, Config::default(), ServerConfig::default());
    let (a, b) = (srv.servers[0].addr(), srv.servers[1].addr());
    let mut setup = Client::connect(a);
    for round in 0..20 {
        let key = format!("race{round}");
        setup.expect(&format!("set {key} 0 0 1\r\n0\r\n"), "STORED\r\n");
        for fe in &srv.deployment.front_ends {
            fe.node().sync(Duration::from_secs(20)).unwrap();
        }
        let unique = setup.gets(&key).unwrap().2;
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = [(a, "A"), (b, "B")]
            .into_iter()
            .map(|(addr, v)| {
                let (barrier, key) = (barrier.clone(), key.clone());
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    barrier.wait();
                    c.call(&format!("cas {key} 0 0 1 {unique}\r\n{v}\r\n"))
                })
            })
            .collect();
        let mut replies: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        replies.sort();
        assert_eq!(replies, vec!["EXISTS".to_string(), "STORED".to_string()], "round {round}");
    }
    let forwarded: u64 =
        srv.deployment.front_ends.iter().map(|fe| fe.stats.forwarded.load(std::sync::atomic::Ordering::Relaxed)).sum();
    assert!(forwarded >= 20, "each round forwards one cas to the other front end ({forwarded})");
}

#[test]
fn concurrent_incr_through_both_front_ends_loses_no_update() {
    let srv = start_with(2, Config::default(), ServerConfig::default());
    let addrs = [srv.servers[0].addr(), srv.servers[1].addr()];
    Client::connect(addrs[0]).expect("set ctr 0 0 1\r\n0\r\n", "STORED\r\n");
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let addr = addrs[i % 2];
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..250 {
                    let r = c.call("incr ctr 1\r\n");
                    assert!(r.parse::<u64>().is_ok(), "{r}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for fe in &srv.deployment.front_ends {
        fe.node().sync(Duration::from_secs(20)).unwrap();
    }
    for addr in addrs {
        Client::connect(addr).expect("get ctr\r\n", "VALUE ctr 0 4\r\n1000\r\nEND\r\n");
    }
}

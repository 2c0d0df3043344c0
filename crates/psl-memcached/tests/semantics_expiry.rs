//! Expiry (relative, absolute, negative), flush_all with a delay, and LRU eviction of local
//! copies under a memory limit.

mod common;
use common::{start, start_with, Client};
use psl_memcached::store::unix_now;
use psl_memcached::{Config, ServerConfig};
use std::time::Duration;

#[test]
fn relative_absolute_and_negative_expiry() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    let now = unix_now();
    c.expect("set rel 0 1 1\r\nr\r\n", "STORED\r\n");
    c.expect("set neg 0 -1 1\r\nn\r\nget neg\r\n", "STORED\r\nEND\r\n");
    c.expect(&format!("set past 0 {} 1\r\np\r\nget past\r\n", now - 10), "STORED\r\nEND\r\n");
    c.expect(&format!("set fut 0 {} 1\r\nf\r\nget fut\r\n", now + 3600), "STORED\r\nVALUE fut 0 1\r\nf\r\nEND\r\n");
    c.expect("set keep 0 0 1\r\nk\r\n", "STORED\r\n");
    c.expect("set touched 0 1 1\r\nt\r\ntouch touched 100\r\n", "STORED\r\nTOUCHED\r\n");
    c.expect("get rel\r\n", "VALUE rel 0 1\r\nr\r\nEND\r\n");
    std::thread::sleep(Duration::from_millis(2100));
    c.expect("get rel keep touched\r\n", "VALUE keep 0 1\r\nk\r\nVALUE touched 0 1\r\nt\r\nEND\r\n");
    // An expired key can be added again; incr on it misses.
    c.expect("incr rel 1\r\n", "NOT_FOUND\r\n");
    c.expect("add rel 0 0 1\r\n2\r\nget rel\r\n", "STORED\r\nVALUE rel 0 1\r\n2\r\nEND\r\n");
    c.expect("touch keep -1\r\nget keep\r\n", "TOUCHED\r\nEND\r\n");
    assert!(c.stat("get_expired") >= 2);
}

#[test]
fn flush_all_with_a_delay() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    c.expect("set old 0 0 1\r\no\r\n", "STORED\r\n");
    c.expect("flush_all 2\r\n", "OK\r\n");
    c.expect("get old\r\n", "VALUE old 0 1\r\no\r\nEND\r\n");
    std::thread::sleep(Duration::from_millis(3100));
    c.expect("get old\r\n", "END\r\n");
    c.expect("set new 0 0 1\r\nn\r\nget new\r\n", "STORED\r\nVALUE new 0 1\r\nn\r\nEND\r\n");
    // An immediate flush stays in force when a later delayed one is scheduled.
    c.expect("flush_all\r\nflush_all 100\r\nget new\r\n", "OK\r\nOK\r\nEND\r\n");
    assert!(c.stat("get_flushed") >= 2);
}

#[test]
fn lru_evicts_local_copies_over_the_memory_limit() {
    let cfg = Config { memory_limit: 256 * 1024, ..Config::default() };
    let srv = start_with(1, cfg, ServerConfig::default());
    let mut c = Client::connect(srv.addr());
    let v = "x".repeat(1000);
    for i in 0..2000 {
        c.expect(&format!("set k{i} 0 0 1000\r\n{v}\r\n"), "STORED\r\n");
        if i % 50 == 0 {
            // Keep k0 hot: it must survive.
            c.send(b"get k0\r\n");
            assert_eq!(c.line(), "VALUE k0 0 1000");
            c.bytes(1002);
            assert_eq!(c.line(), "END");
        }
    }
    let evictions = c.stat("evictions");
    assert!(evictions > 1000, "evictions {evictions}");
    assert!(c.stat("bytes") <= 256 * 1024 + 4096);
    c.expect("get k1\r\n", "END\r\n");
    c.send(b"get k1999\r\n");
    assert_eq!(c.line(), "VALUE k1999 0 1000");
    c.bytes(1002);
    assert_eq!(c.line(), "END");
    // A rewrite of an evicted key is visible again.
    c.expect("set k1 0 0 1\r\n1\r\nget k1\r\n", "STORED\r\nVALUE k1 0 1\r\n1\r\nEND\r\n");
}

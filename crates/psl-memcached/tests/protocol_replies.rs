//! The text and meta protocol over a real socket: every error reply, pipelining, noreply,
//! storage, CAS, incr/decr and meta commands, byte for byte as memcached 1.6 answers.

mod common;
use common::{start, Client};

#[test]
fn error_replies_are_exact_and_the_connection_survives() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    c.expect("bogus\r\n", "ERROR\r\n");
    c.expect("\r\n", "ERROR\r\n");
    c.expect("GET a\r\n", "ERROR\r\n");
    c.expect("get\r\n", "ERROR\r\n");
    c.expect("set a 0 0\r\n", "ERROR\r\n");
    c.expect("set a 0 0 abc\r\n", "CLIENT_ERROR bad command line format\r\n");
    c.expect("set a 0 0 -1\r\n", "CLIENT_ERROR bad command line format\r\n");
    c.expect("set a x 0 1\r\n", "CLIENT_ERROR bad command line format\r\n");
    c.expect("x\r\n", "ERROR\r\n");
    let long = "k".repeat(251);
    c.expect(&format!("get {long}\r\n"), "CLIENT_ERROR bad command line format\r\n");
    c.expect(&format!("set {long} 0 0 1\r\n"), "CLIENT_ERROR bad command line format\r\n");
    c.expect("x\r\n", "ERROR\r\n");
    // A 250-byte key is fine.
    let ok = "k".repeat(250);
    c.expect(&format!("set {ok} 0 0 1\r\nx\r\n"), "STORED\r\n");
    // Bad data chunk: the block is consumed with its two trailing bytes.
    c.expect("set a 0 0 2\r\nhiXY\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\n");
    // Too large: the data is swallowed, the next command works.
    let big = vec![b'x'; (1 << 20) + 1];
    let mut req = b"set big 0 0 1048577\r\n".to_vec();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\nget big\r\n");
    c.send(&req);
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache");
    assert_eq!(c.line(), "END");
    c.expect(
        "set n 0 0 2\r\nab\r\nincr n 1\r\n",
        "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    );
    c.expect("incr n abc\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n");
    c.expect("incr n -1\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n");
    c.expect("touch n abc\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    c.expect("gat abc n\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    c.expect("flush_all abc\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    c.expect("delete n 5\r\n", "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n");
    c.expect("verbosity\r\n", "ERROR\r\n");
    c.expect("mg\r\n", "ERROR\r\n");
    c.expect("mg a zz\r\n", "CLIENT_ERROR invalid flag\r\n");
    c.expect("mg a Tabc\r\n", "CLIENT_ERROR bad token in command line format\r\n");
    c.expect("ms a 2 MZ\r\nhi\r\n", "CLIENT_ERROR invalid mode for ms M token\r\n");
    c.expect("ms a S2\r\n", "CLIENT_ERROR bad command line format\r\n");
    c.expect("version\r\n", "VERSION 1.6.21\r\n");
    // A neighbour connection is unaffected by all this.
    let mut d = Client::connect(srv.addr());
    d.expect("set z 1 0 1\r\nz\r\nget z\r\n", "STORED\r\nVALUE z 1 1\r\nz\r\nEND\r\n");
    // A line over the limit closes only that connection.
    c.send(&vec![b'a'; 70 * 1024]);
    assert_eq!(c.line(), "CLIENT_ERROR line too long");
    assert!(c.closed());
    d.expect("get z\r\n", "VALUE z 1 1\r\nz\r\nEND\r\n");
}

#[test]
fn storage_retrieval_cas_and_arithmetic() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    c.expect("set a 5 0 2\r\nhi\r\n", "STORED\r\n");
    c.expect("get a b\r\n", "VALUE a 5 2\r\nhi\r\nEND\r\n");
    c.expect("add a 0 0 1\r\nx\r\n", "NOT_STORED\r\n");
    c.expect("add b 3 0 1\r\nx\r\n", "STORED\r\n");
    c.expect("replace c 0 0 1\r\nx\r\n", "NOT_STORED\r\n");
    c.expect("replace b 4 0 1\r\ny\r\n", "STORED\r\n");
    c.expect("append a 9 0 2\r\n!!\r\n", "STORED\r\n");
    c.expect("prepend a 9 0 2\r\n<<\r\n", "STORED\r\n");
    c.expect("append zz 0 0 1\r\nx\r\n", "NOT_STORED\r\n");
    c.expect("get a b\r\n", "VALUE a 5 6\r\n<<hi!!\r\nVALUE b 4 1\r\ny\r\nEND\r\n");
    // gets / cas
    let (_, _, u) = c.gets("a").unwrap();
    assert_ne!(u, 0);
    c.expect(&format!("cas a 1 0 1 {}\r\nX\r\n", u.wrapping_add(1)), "EXISTS\r\n");
    c.expect(&format!("cas a 1 0 1 {u}\r\nX\r\n"), "STORED\r\n");
    c.expect(&format!("cas a 1 0 1 {u}\r\nY\r\n"), "EXISTS\r\n");
    c.expect("cas nope 0 0 1 5\r\nx\r\n", "NOT_FOUND\r\n");
    let (f, d, u2) = c.gets("a").unwrap();
    assert_eq!((f, d.as_slice()), (1, &b"X"[..]));
    assert_ne!(u, u2);
    // The same unique reads back until the item changes.
    assert_eq!(c.gets("a").unwrap().2, u2);
    // incr / decr: 64-bit unsigned, wrap on incr, floor at 0 on decr.
    c.expect("set n 0 0 2\r\n10\r\n", "STORED\r\n");
    c.expect("incr n 5\r\n", "15\r\n");
    c.expect("decr n 100\r\n", "0\r\n");
    c.expect("incr n 18446744073709551615\r\n", "18446744073709551615\r\n");
    c.expect("incr n 2\r\n", "1\r\n");
    c.expect("incr missing 1\r\n", "NOT_FOUND\r\n");
    c.expect("decr missing 1\r\n", "NOT_FOUND\r\n");
    c.expect("get n\r\n", "VALUE n 0 1\r\n1\r\nEND\r\n");
    // delete, touch
    c.expect("delete n\r\n", "DELETED\r\n");
    c.expect("delete n\r\n", "NOT_FOUND\r\n");
    c.expect("delete b 0\r\n", "DELETED\r\n");
    c.expect("touch a 100\r\n", "TOUCHED\r\n");
    c.expect("touch n 100\r\n", "NOT_FOUND\r\n");
    c.send(b"gats 100 a n\r\n");
    let l = c.line();
    assert!(l.starts_with("VALUE a 1 1 "), "{l}");
    assert_eq!(c.line(), "X");
    assert_eq!(c.line(), "END");
    c.expect("verbosity 1\r\n", "OK\r\n");
    c.expect("flush_all\r\n", "OK\r\n");
    c.expect("get a\r\n", "END\r\n");
    c.expect("set a 0 0 1\r\nq\r\nget a\r\n", "STORED\r\nVALUE a 0 1\r\nq\r\nEND\r\n");
    for s in [
        "cmd_get",
        "cmd_set",
        "get_hits",
        "get_misses",
        "curr_items",
        "total_items",
        "bytes",
        "limit_maxbytes",
        "evictions",
        "curr_connections",
        "total_connections",
        "uptime",
        "cas_hits",
        "cas_badval",
        "cas_misses",
        "incr_hits",
        "incr_misses",
        "decr_hits",
        "decr_misses",
        "delete_hits",
        "delete_misses",
        "touch_hits",
        "threads",
        "pid",
        "time",
    ] {
        c.stat(s);
    }
    assert!(c.stat("cas_hits") >= 1 && c.stat("cas_badval") >= 2 && c.stat("cas_misses") >= 1);
    assert!(c.stat("get_hits") >= 3);
    c.expect("quit\r\n", "");
    assert!(c.closed());
}

#[test]
fn noreply_suppresses_every_reply() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    c.send(
        b"set a 0 0 1 noreply\r\n1\r\nadd a 0 0 1 noreply\r\nx\r\nreplace a 0 0 1 noreply\r\n2\r\n\
append a 0 0 1 noreply\r\n3\r\nprepend a 0 0 1 noreply\r\n4\r\nincr a 10 noreply\r\ndecr a 1 noreply\r\n\
touch a 0 noreply\r\ncas a 0 0 1 1 noreply\r\nx\r\ndelete zz noreply\r\nincr zz 1 noreply\r\n\
verbosity 1 noreply\r\nflush_all 0 noreply\r\nset b 0 0 1 noreply\r\nb\r\nmn\r\n",
    );
    assert_eq!(c.line(), "MN");
    c.expect("get b\r\n", "VALUE b 0 1\r\nb\r\nEND\r\n");
    c.send(b"set a 0 0 2 noreply\r\n42\r\nincr a 1 noreply\r\nget a\r\n");
    assert_eq!(c.line(), "VALUE a 0 2");
    assert_eq!(c.line(), "43");
    assert_eq!(c.line(), "END");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    let mut req = Vec::new();
    let mut expect = String::new();
    for i in 0..2000 {
        req.extend_from_slice(
            format!("set k{i} {i} 0 {}\r\nv{i}\r\nget k{i}\r\nbogus\r\n", format!("v{i}").len()).as_bytes(),
        );
        expect.push_str(&format!("STORED\r\nVALUE k{i} {i} {}\r\nv{i}\r\nEND\r\nERROR\r\n", format!("v{i}").len()));
    }
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    req.extend_from_slice(format!("get {}\r\nmn\r\n", keys.join(" ")).as_bytes());
    for i in 0..100 {
        expect.push_str(&format!("VALUE k{i} {i} {}\r\nv{i}\r\n", format!("v{i}").len()));
    }
    expect.push_str("END\r\nMN\r\n");
    // Send in odd-sized pieces from another thread while this one reads.
    let mut w = c.w.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        use std::io::Write;
        for chunk in req.chunks(777) {
            w.write_all(chunk).unwrap();
        }
    });
    let got = c.bytes(expect.len());
    t.join().unwrap();
    assert!(got == expect.as_bytes(), "pipelined replies differ");
}

#[test]
fn meta_commands() {
    let srv = start();
    let mut c = Client::connect(srv.addr());
    c.expect("mn\r\n", "MN\r\n");
    c.expect("ms mk 2 T0 F7\r\nhi\r\n", "HD\r\n");
    c.send(b"mg mk v f t s k\r\n");
    assert_eq!(c.line(), "VA 2 f7 t-1 s2 kmk");
    assert_eq!(c.line(), "hi");
    c.expect("mg missing v\r\n", "EN\r\n");
    c.expect("mg missing v k O55\r\n", "EN kmissing O55\r\n");
    c.expect("mg missing v q\r\nmg mk\r\nmg mk O123 k q\r\nmn\r\n", "HD\r\nHD O123 kmk\r\nMN\r\n");
    // CAS via meta, matching the text protocol's unique.
    c.send(b"mg mk c\r\n");
    let l = c.line();
    let cas: u64 = l.strip_prefix("HD c").unwrap().parse().unwrap();
    assert_eq!(c.gets("mk").unwrap().2, cas);
    c.expect(&format!("ms mk 2 C{}\r\nno\r\n", cas + 1), "EX\r\n");
    c.send(format!("ms mk 2 C{cas} c\r\nok\r\n").as_bytes());
    let l = c.line();
    let new: u64 = l.strip_prefix("HD c").unwrap().parse().unwrap();
    assert_ne!(new, cas);
    assert_eq!(c.gets("mk").unwrap().2, new);
    c.expect("ms nope 1 C5\r\nx\r\n", "NF\r\n");
    // Modes.
    c.expect("ms mk 2 MA\r\nxx\r\n", "HD\r\n");
    c.send(b"mg mk v\r\n");
    assert_eq!(c.line(), "VA 4");
    assert_eq!(c.line(), "okxx");
    c.expect(
        "ms mk 1 MP\r\n<\r\nms nope 2 MR\r\nxx\r\nms mk 2 ME\r\nxx\r\nms new 2 ME k O1\r\nxx\r\n",
        "HD\r\nNS\r\nNS\r\nHD knew O1\r\n",
    );
    c.expect("ms mk 2 q\r\nhi\r\nmn\r\n", "MN\r\n");
    c.expect("ms mk 2 MS T-1\r\nhi\r\nmg mk v\r\n", "HD\r\nEN\r\n");
    // Touch and vivify through mg.
    c.expect("ms t 1 T100\r\nx\r\n", "HD\r\n");
    c.send(b"mg t T1000 t v\r\n");
    let l = c.line();
    assert!(l == "VA 1 t1000" || l == "VA 1 t999", "{l}");
    assert_eq!(c.line(), "x");
    c.send(b"mg viv N30 v t\r\n");
    let l = c.line();
    assert!(l == "VA 0 t30 W" || l == "VA 0 t29 W", "{l}");
    assert_eq!(c.line(), "");
    // md
    c.expect("md t q\r\nmd t\r\nmd t q\r\nmn\r\n", "NF\r\nNF\r\nMN\r\n");
    c.expect("ms d 1\r\nx\r\nmd d C1 k\r\nmd d O7\r\n", "HD\r\nEX kd\r\nHD O7\r\n");
    // ma
    c.expect("ma cnt\r\nma cnt q\r\nmn\r\n", "NF\r\nNF\r\nMN\r\n");
    c.expect("ma cnt N0 J10 v\r\n", "VA 2\r\n10\r\n");
    c.expect("ma cnt v\r\n", "VA 2\r\n11\r\n");
    c.expect("ma cnt MD D20 v\r\n", "VA 1\r\n0\r\n");
    c.expect("ma cnt M+ D5\r\n", "HD\r\n");
    c.send(b"ma cnt v t c k\r\n");
    let l = c.line();
    assert!(l.starts_with("VA 1 t-1 c") && l.ends_with(" kcnt"), "{l}");
    assert_eq!(c.line(), "6");
    c.expect("ms s 1\r\nx\r\nma s\r\n", "HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
    c.expect("ma cnt q v\r\nmn\r\nget cnt\r\n", "MN\r\nVALUE cnt 0 1\r\n7\r\nEND\r\n");
}

//! The control interface refuses every command that signs, revokes or returns plaintext unless
//! it carries a signature by the operator's control key over this session's nonce, the next
//! counter and the command line; and it closes a connection that stays idle.

use psl_capsule::{new_capsule, Limits};
use psl_crypto::OwnerKey;
use psl_fabric::{FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A node on an in-process hub, its control interface on loopback with a revoker that counts
/// the revocations it is asked to sign (and signs none).
struct Fixture {
    addr: SocketAddr,
    signed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

fn node() -> Arc<Node> {
    let owner = OwnerKey::from_seed(&[9; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "control-auth", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let opts = NodeOptions { node_id: 1, writers: 1, ..NodeOptions::default() };
    let keys = NodeKeys::derive(&meta, &app, &opts).unwrap();
    Arc::new(Node::start(keys, Arc::new(hub.endpoint("node1")), opts).unwrap())
}

fn counting_revoker(signed: Arc<AtomicUsize>) -> psl_node::control::Revoker {
    Arc::new(move |_w, _from, _seq| {
        signed.fetch_add(1, Ordering::SeqCst);
        Err("test revoker: signed nothing".into())
    })
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

fn raw_call(s: &mut TcpStream, r: &mut BufReader<TcpStream>, line: &str) -> String {
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut out = String::new();
    r.read_line(&mut out).unwrap();
    out.trim_end().to_string()
}

fn raw(addr: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

#[test]
fn an_unauthenticated_revoke_is_refused_and_signs_nothing() {
    let node = node();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let signed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (n, st, rv) = (node.clone(), stop.clone(), counting_revoker(signed.clone()));
    let server = std::thread::spawn(move || psl_node::control::serve_with(n, listener, st, Some(rv)));
    let f = Fixture { addr, signed, stop, server: Some(server) };

    let (mut s, mut r) = raw(f.addr);
    for cmd in ["REVOKE 5 10 0", "PUT k v", "GET k", "DUMP", "DEL k", "SYNC 10", "PUT_DURABLE k v", "DIGEST"] {
        let a = raw_call(&mut s, &mut r, cmd);
        assert!(a.starts_with("ERROR unauthenticated"), "{cmd}: {a}");
    }
    assert_eq!(f.signed.load(Ordering::SeqCst), 0, "the revoker was asked to sign");
    assert_eq!(node.get(b"k"), None, "an unauthenticated PUT wrote");
    // Counters stay readable without a key (psl status).
    assert!(raw_call(&mut s, &mut r, "STATS").starts_with('{'));
}

fn operator() -> Arc<psl_crypto::SigningKey> {
    Arc::new(psl_node::control::operator_key_from_text(&"11".repeat(32)).unwrap())
}

fn serve_opts(idle_ms: u64) -> (Fixture, Arc<Node>) {
    let node = node();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let signed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let opts = psl_node::control::ControlOptions {
        operator: Some(operator().verifying_key()),
        revoker: Some(counting_revoker(signed.clone())),
        idle_ms,
    };
    let (n, st) = (node.clone(), stop.clone());
    let server = std::thread::spawn(move || psl_node::control::serve_opts(n, listener, st, opts));
    (Fixture { addr, signed, stop, server: Some(server) }, node)
}

/// `HELLO`'s nonce on a raw connection.
fn hello(s: &mut TcpStream, r: &mut BufReader<TcpStream>) -> [u8; 32] {
    let h = raw_call(s, r, "HELLO");
    let hex_nonce = h.strip_prefix("HELLO psl-control/1 ").unwrap_or_else(|| panic!("greeting {h}"));
    let mut nonce = [0u8; 32];
    hex::decode_to_slice(hex_nonce, &mut nonce).unwrap();
    nonce
}

fn signed_line(key: &psl_crypto::SigningKey, nonce: &[u8; 32], n: u64, cmd: &str) -> String {
    let sig = key.sign(&psl_node::control::command_digest(nonce, n, cmd.as_bytes()));
    format!("AUTH {n} {} {cmd}", hex::encode(sig.0))
}

/// The connection is closed: a read returns end of file (or a reset).
fn closed(r: &mut BufReader<TcpStream>) -> bool {
    let mut rest = String::new();
    matches!(r.read_line(&mut rest), Ok(0) | Err(_))
}

#[test]
fn an_operator_signed_revoke_is_carried_out_and_plain_commands_work() {
    let (f, node) = serve_opts(30_000);
    let mut c = psl_node::control::ControlClient::connect_as(f.addr, Duration::from_secs(5), operator()).unwrap();
    assert_eq!(c.call("PUT k v").unwrap(), "OK");
    assert_eq!(c.call("GET k").unwrap(), "VALUE v");
    let r = c.pipeline(&["PUT a 1".into(), "PUT b 2".into(), "GET a".into()]).unwrap();
    assert_eq!(r, ["OK", "OK", "VALUE 1"]);
    assert!(c.metrics().unwrap().contains("psl_"), "signed METRICS answers");
    assert_eq!(c.call("REVOKE 5 10 0").unwrap(), "ERROR test revoker: signed nothing");
    assert_eq!(f.signed.load(Ordering::SeqCst), 1, "the authenticated REVOKE reached the revoker");
    assert_eq!(node.get(b"k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_replayed_or_foreign_signed_revoke_is_refused() {
    let (f, node) = serve_opts(30_000);
    let key = operator();

    // A command signed for one connection, replayed on the same one and on another.
    let (mut s, mut r) = raw(f.addr);
    let nonce = hello(&mut s, &mut r);
    let put = signed_line(&key, &nonce, 0, "PUT x 1");
    assert_eq!(raw_call(&mut s, &mut r, &put), "OK");
    let a = raw_call(&mut s, &mut r, &put);
    assert!(a.starts_with("ERROR unauthenticated"), "same-connection replay: {a}");
    assert!(closed(&mut r), "a refused AUTH closes the connection");
    let revoke = {
        let (mut s, mut r) = raw(f.addr);
        let nonce = hello(&mut s, &mut r);
        signed_line(&key, &nonce, 0, "REVOKE 5 10 0")
    };
    let (mut s, mut r) = raw(f.addr);
    let _ = hello(&mut s, &mut r);
    let a = raw_call(&mut s, &mut r, &revoke);
    assert!(a.starts_with("ERROR unauthenticated"), "other-connection replay: {a}");

    // Signed by another key, or for another command, or with a skipped number.
    let other = psl_node::control::operator_key_from_text(&"22".repeat(32)).unwrap();
    let (mut s, mut r) = raw(f.addr);
    let nonce = hello(&mut s, &mut r);
    let a = raw_call(&mut s, &mut r, &signed_line(&other, &nonce, 0, "REVOKE 5 10 0"));
    assert!(a.starts_with("ERROR unauthenticated"), "foreign key: {a}");
    let (mut s, mut r) = raw(f.addr);
    let nonce = hello(&mut s, &mut r);
    let swapped = signed_line(&key, &nonce, 0, "GET x").replace(" GET x", " REVOKE 5 10 0");
    let a = raw_call(&mut s, &mut r, &swapped);
    assert!(a.starts_with("ERROR unauthenticated"), "signature of another command: {a}");
    let (mut s, mut r) = raw(f.addr);
    let nonce = hello(&mut s, &mut r);
    let a = raw_call(&mut s, &mut r, &signed_line(&key, &nonce, 1, "REVOKE 5 10 0"));
    assert!(a.starts_with("ERROR unauthenticated"), "skipped number: {a}");
    // And no AUTH at all, with an operator key configured.
    let (mut s, mut r) = raw(f.addr);
    let a = raw_call(&mut s, &mut r, "REVOKE 5 10 0");
    assert!(a.starts_with("ERROR unauthenticated"), "plain: {a}");

    assert_eq!(f.signed.load(Ordering::SeqCst), 0, "a refused REVOKE reached the revoker");
    assert_eq!(node.get(b"x").as_deref(), Some(&b"1"[..]), "only the one genuine PUT ran");
}

#[test]
fn an_idle_control_connection_is_closed() {
    let (f, _node) = serve_opts(300);
    let (mut s, mut r) = raw(f.addr);
    assert!(raw_call(&mut s, &mut r, "STATS").starts_with('{'));
    let t = std::time::Instant::now();
    let mut line = String::new();
    let _ = r.read_line(&mut line);
    assert!(line.starts_with("ERROR idle"), "{line:?}");
    assert!(closed(&mut r), "closed after the idle limit");
    assert!(t.elapsed() < Duration::from_secs(5), "closed within the limit, not the client's timeout");
    // A half-sent line counts as idle too.
    let (mut s, mut r) = raw(f.addr);
    s.write_all(b"STA").unwrap();
    let mut line = String::new();
    let _ = r.read_line(&mut line);
    assert!(line.starts_with("ERROR idle"), "{line:?}");
}

/// A role without the application key (a KV coordinator whose keys came from the leader):
/// `REVOKE` says how to revoke instead; `REVOKE_BOUNDS` gives the defaults; `REVOKE_SIGNED`
/// takes a revocation the application key signed elsewhere, only inside `AUTH`, only for this
/// capsule and under its application key, and never panics on bad bytes.
#[test]
fn a_revocation_signed_elsewhere_is_checked_before_it_is_announced() {
    use psl_capsule::{new_capsule_with, Revocation, WriterKeys};
    let owner = OwnerKey::from_seed(&[8; 32]).unwrap();
    let meta = new_capsule_with(&owner, 1, "revoke-signed", 0, Limits::default(), WriterKeys::Certified).unwrap();
    let app = owner.app(1).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let opts = NodeOptions { node_id: 1, writers: 1, ..NodeOptions::default() };
    let node = Arc::new(
        Node::start(NodeKeys::derive(&meta, &app, &opts).unwrap(), Arc::new(hub.endpoint("n1")), opts).unwrap(),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let copts = psl_node::control::ControlOptions {
        operator: Some(operator().verifying_key()),
        revoker: None,
        idle_ms: 30_000,
    };
    let (n, st) = (node.clone(), stop.clone());
    let server = std::thread::spawn(move || psl_node::control::serve_opts(n, listener, st, copts));
    let f = Fixture { addr, signed: Arc::new(AtomicUsize::new(0)), stop, server: Some(server) };

    let w = psl_scl::writer_index(2, 0, 0).unwrap();
    let good = Revocation::issue(&app, meta.name(), 0, w, 10, 3).unwrap();
    // Unsigned: refused before anything is looked at.
    let (mut s, mut r) = raw(f.addr);
    for cmd in [format!("REVOKE_SIGNED {}", hex::encode(good.encode())), format!("REVOKE_BOUNDS {w}")] {
        let a = raw_call(&mut s, &mut r, &cmd);
        assert!(a.starts_with("ERROR unauthenticated"), "{cmd}: {a}");
    }
    let mut c = psl_node::control::ControlClient::connect_as(f.addr, Duration::from_secs(5), operator()).unwrap();
    // No application key here: REVOKE says what to do instead.
    let a = c.call(&format!("REVOKE {w}")).unwrap();
    assert!(a.starts_with("ERROR") && a.contains("psl kv revoke") && a.contains("REVOKE_SIGNED"), "{a}");
    let a = c.call(&format!("REVOKE_BOUNDS {w}")).unwrap();
    assert!(a.starts_with(&format!("BOUNDS {w} ")), "{a}");
    // Malformed: not hex, the wrong length, cut, a byte changed.
    let bytes = good.encode();
    let mut changed = bytes.clone();
    changed[40] ^= 1;
    for bad in [
        "zz".to_string(),
        String::new(),
        hex::encode(&bytes[..bytes.len() - 1]),
        format!("{}00", hex::encode(&bytes)),
        "g".repeat(2 * bytes.len()),
        hex::encode(&changed),
        hex::encode(vec![0u8; bytes.len()]),
    ] {
        let a = c.call(&format!("REVOKE_SIGNED {bad}")).unwrap();
        assert!(a.starts_with("ERROR"), "{bad}: {a}");
    }
    // Signed by another application key, or for another capsule.
    let thief = owner.app(2).unwrap();
    let other = new_capsule_with(&owner, 2, "other", 0, Limits::default(), WriterKeys::Certified).unwrap();
    for r in [
        Revocation::issue(&thief, meta.name(), 0, w, 10, 3).unwrap(),
        Revocation::issue(&thief, other.name(), 0, w, 10, 3).unwrap(),
    ] {
        let a = c.call(&format!("REVOKE_SIGNED {}", hex::encode(r.encode()))).unwrap();
        assert!(a.starts_with("ERROR revocation refused"), "{a}");
    }
    // The genuine one is taken.
    let a = c.call(&format!("REVOKE_SIGNED {}", hex::encode(good.encode()))).unwrap();
    assert_eq!(a, format!("REVOKED {w} FROM 10 SEQ 3"));
}

//! The NATS backend over TLS, as an operated NATS deployment requires it: a `nats-server` with a
//! certificate from a test CA (made here with the `openssl` command); an endpoint given the CA
//! (`--nats-tls-ca`) connects and delivers, one given another CA or none (the system's roots do
//! not know the test CA) is refused. (Credentials files are NATS JWTs of an operator's account;
//! the test only checks that a missing one is named: `nats_delivery.rs`.)
//! Needs Debian's nats-server and openssl (scripts/install-nats-test-deps.sh).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use psl_fabric::natsd::free_port;
use psl_fabric::{Fabric, FabricError, Interest, NatsConfig, NatsEndpoint};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`NAME-ca.pem`) and, if `server`, a certificate for 127.0.0.1 signed by it.
fn ca(dir: &Path, name: &str, server: bool) {
    let (key, pem) = (format!("{name}-ca.key"), format!("{name}-ca.pem"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
        ],
    );
    if server {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        );
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                &pem,
                "-CAkey",
                &key,
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, listen: SocketAddr) -> Server {
    let conf = format!(
        "listen: \"{listen}\"\nserver_name: tls1\ntls {{\n  cert_file: \"server.pem\"\n  key_file: \"server.key\"\n  timeout: 2\n}}\n"
    );
    std::fs::write(dir.join("nats.conf"), conf).unwrap();
    let log = std::fs::File::create(dir.join("nats.log")).unwrap();
    let child = Command::new("nats-server")
        .args(["-c", "nats.conf"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("nats-server starts (scripts/install-nats-test-deps.sh)");
    let s = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(listen).is_err() {
        assert!(
            Instant::now() < deadline,
            "nats-server did not listen: {}",
            std::fs::read_to_string(dir.join("nats.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

fn cfg(name: &str, ca: Option<&Path>) -> NatsConfig {
    NatsConfig {
        name: name.into(),
        tls_ca: ca.map(Path::to_path_buf),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    }
}

#[test]
fn tls_with_the_right_ca_delivers_and_anything_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    ca(dir.path(), "good", true);
    ca(dir.path(), "other", false);
    let listen = free_port(LO).unwrap();
    let _server = start(dir.path(), listen);
    let url = vec![format!("nats://{listen}")];
    let cap = [9u8; 32];

    let good = dir.path().join("good-ca.pem");
    let rx = NatsEndpoint::connect(&url, &Interest::observer(cap), cfg("rx", Some(&good))).expect("TLS with the CA");
    let tx = NatsEndpoint::connect(&url, &Interest::default(), cfg("tx", Some(&good))).expect("TLS with the CA");
    assert!(rx.wait_connected(Duration::from_secs(5)) && tx.wait_connected(Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(200));
    let mut m = vec![1u8, 1];
    m.extend_from_slice(&cap);
    m.extend_from_slice(b"sealed record bytes");
    tx.publish(Bytes::from(m.clone())).unwrap();
    let got = rx.recv_timeout(Duration::from_secs(5)).unwrap().expect("delivered over TLS");
    assert_eq!(&got[..], &m[..]);

    // A CA that did not sign the server's certificate: refused, with a typed error.
    let other = dir.path().join("other-ca.pem");
    let e = NatsEndpoint::connect(&url, &Interest::default(), cfg("wrong-ca", Some(&other)));
    assert!(matches!(e, Err(FabricError::Nats { .. })), "a server certificate from another CA must be refused");

    // No CA: the server requires TLS and the system's roots do not know its CA.
    let e = NatsEndpoint::connect(&url, &Interest::default(), cfg("no-tls", None));
    assert!(matches!(e, Err(FabricError::Nats { .. })), "a client without the CA must not connect");

    // A CA file that does not exist: named in the error.
    let e = NatsEndpoint::connect(&url, &Interest::default(), cfg("no-ca", Some(&dir.path().join("missing.pem"))))
        .err()
        .expect("no CA file");
    assert!(e.to_string().contains("missing.pem"), "{e}");
}

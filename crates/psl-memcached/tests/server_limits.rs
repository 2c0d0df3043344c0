//! The server's bounds: thousands of concurrent connections, the connection limit, the idle
//! timeout, and TLS.

mod common;
use common::{start_with, Client};
use psl_memcached::{Config, ServerConfig};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[test]
fn thousands_of_concurrent_connections() {
    let srv = start_with(1, Config::default(), ServerConfig::default());
    let addr = srv.addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let mut conns = Vec::new();
        for _ in 0..3000 {
            conns.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let tasks: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                tokio::spawn(async move {
                    let (r, mut w) = s.into_split();
                    let mut r = BufReader::new(r);
                    let v = format!("v{i}");
                    w.write_all(format!("set c{i} 0 0 {}\r\n{v}\r\nget c{i}\r\n", v.len()).as_bytes()).await.unwrap();
                    let expect = format!("STORED\r\nVALUE c{i} 0 {}\r\n{v}\r\nEND\r\n", v.len());
                    let mut got = vec![0; expect.len()];
                    r.read_exact(&mut got).await.unwrap();
                    assert_eq!(got, expect.as_bytes());
                    (r, w)
                })
            })
            .collect();
        let mut held = Vec::new();
        for t in tasks {
            held.push(t.await.unwrap());
        }
        // All still open at once.
        let mut c = Client::connect(addr);
        assert!(c.stat("curr_connections") >= 3001);
        drop(held);
    });
}

#[test]
fn a_client_that_does_not_read_blocks_no_one_and_later_gets_every_reply() {
    let srv = start_with(1, Config::default(), ServerConfig { threads: 1, ..ServerConfig::default() });
    let mut a = Client::connect(srv.addr());
    let v = vec![b'x'; 500_000];
    a.send(format!("set big 7 0 {}\r\n", v.len()).as_bytes());
    a.send(&v);
    a.send(b"\r\n");
    assert_eq!(a.line(), "STORED");
    // 40 gets (20 MB of replies) and a multi-get, pipelined and not read: far more than the
    // socket buffers hold, so the server's writes block midway.
    for _ in 0..40 {
        a.send(b"get big\r\n");
    }
    a.send(b"get big big big\r\nversion\r\n");
    std::thread::sleep(Duration::from_millis(300));
    // The same (single) event loop still serves everyone else.
    let mut b = Client::connect(srv.addr());
    b.expect("version\r\n", "VERSION 1.6.21\r\n");
    // Then every reply comes, whole and in order.
    for i in 0..43 {
        assert_eq!(a.line(), "VALUE big 7 500000", "value {i}");
        assert_eq!(a.bytes(v.len() + 2), [&v[..], b"\r\n"].concat());
        if i < 40 || i == 42 {
            assert_eq!(a.line(), "END");
        }
    }
    assert_eq!(a.line(), "VERSION 1.6.21");
}

#[test]
fn connection_limit_and_idle_timeout() {
    let scfg =
        ServerConfig { max_connections: 2, idle_timeout: Some(Duration::from_millis(400)), ..ServerConfig::default() };
    let srv = start_with(1, Config::default(), scfg);
    let mut a = Client::connect(srv.addr());
    let mut b = Client::connect(srv.addr());
    a.expect("version\r\n", "VERSION 1.6.21\r\n");
    b.expect("version\r\n", "VERSION 1.6.21\r\n");
    let mut c = Client::connect(srv.addr());
    assert_eq!(c.line(), "SERVER_ERROR too many open connections");
    assert!(c.closed());
    // A connection that keeps talking is not idle: requests 150 ms apart for three timeouts.
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(150));
        a.expect("version\r\n", "VERSION 1.6.21\r\n");
    }
    // Idle connections are closed; then there is room again.
    assert!(a.closed());
    assert!(b.closed());
    std::thread::sleep(Duration::from_millis(100));
    let mut d = Client::connect(srv.addr());
    d.expect("version\r\n", "VERSION 1.6.21\r\n");
    assert!(d.stat("idle_kicks") >= 2);
}

#[test]
fn tls_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let ok = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl command line tool is needed to make a test certificate");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let acceptor = psl_memcached::tls_acceptor(&cert, &key).unwrap();
    let srv = start_with(1, Config::default(), ServerConfig { tls: Some(acceptor), ..ServerConfig::default() });
    let addr = srv.addr();

    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&cert).unwrap()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
        let (r, mut w) = tokio::io::split(tls);
        let mut r = BufReader::new(r);
        w.write_all(b"set t 3 0 6\r\nsecret\r\nget t\r\n").await.unwrap();
        let mut lines = Vec::new();
        for _ in 0..4 {
            let mut l = String::new();
            r.read_line(&mut l).await.unwrap();
            lines.push(l);
        }
        assert_eq!(lines.concat(), "STORED\r\nVALUE t 3 6\r\nsecret\r\nEND\r\n");
    });
    // A plaintext client gets nothing useful from a TLS port.
    let mut plain = Client::connect(addr);
    plain.send(b"get t\r\n");
    assert!(plain.closed());
}

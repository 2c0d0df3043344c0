//! A TCP proxy between one process and the router, which the nemesis can cut and heal: the
//! process's fabric link, and nothing else (its control, read and memcached ports stay up).
//! Cutting closes every proxied connection and refuses new ones (the process's endpoint keeps
//! reconnecting with backoff, as after any broken link); healing lets it reconnect. A proxy
//! without an upstream is a black hole: it accepts and discards, so a process attached to it
//! hears nothing from the fabric (the fresh nodes that check recovery use one, so that what
//! they hold comes from the servers alone).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// A proxy to `upstream` (`None`: a black hole) on a free loopback port.
    pub fn spawn(upstream: Option<SocketAddr>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (cut, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c2, s2, k2) = (cut.clone(), stop.clone(), conns.clone());
        std::thread::Builder::new().name("chaos-proxy".into()).spawn(move || {
            while !s2.load(Ordering::Acquire) {
                let s = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                };
                if c2.load(Ordering::Acquire) {
                    let _ = s.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = s.set_nonblocking(false);
                let _ = s.set_nodelay(true);
                match upstream {
                    None => {
                        // Hold it open and discard what arrives.
                        if let Ok(r) = s.try_clone() {
                            lock(&k2).push(s);
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut { r }, &mut std::io::sink());
                            });
                        }
                    }
                    Some(up) => {
                        let Ok(u) = TcpStream::connect_timeout(&up, Duration::from_secs(1)) else {
                            let _ = s.shutdown(Shutdown::Both);
                            continue;
                        };
                        let _ = u.set_nodelay(true);
                        let clones = (s.try_clone(), u.try_clone(), s.try_clone(), u.try_clone());
                        let (Ok(s_read), Ok(u_read), Ok(s_keep), Ok(u_keep)) = clones else { continue };
                        {
                            let mut g = lock(&k2);
                            g.retain(|c| c.peer_addr().is_ok());
                            g.push(s_keep);
                            g.push(u_keep);
                        }
                        std::thread::spawn(move || pump(s_read, u));
                        std::thread::spawn(move || pump(u_read, s));
                    }
                }
            }
        })?;
        Ok(Proxy { addr, cut, stop, conns })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection and refuses new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        for c in lock(&self.conns).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for c in lock(&self.conns).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies `from` into `to` until either end closes, then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_proxy_closes_and_refuses_and_a_healed_one_forwards() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let up = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in echo.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let _ = std::io::copy(&mut r, &mut { s });
                });
            }
        });
        let p = Proxy::spawn(Some(up)).unwrap();
        let talk = |p: &Proxy| -> std::io::Result<Vec<u8>> {
            let mut s = TcpStream::connect(p.addr())?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"ping")?;
            let mut b = [0u8; 4];
            s.read_exact(&mut b)?;
            Ok(b.to_vec())
        };
        assert_eq!(talk(&p).unwrap(), b"ping");
        let mut held = TcpStream::connect(p.addr()).unwrap();
        held.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        held.read_exact(&mut b).unwrap();
        p.cut();
        held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(held.read(&mut b), Ok(0) | Err(_)), "a cut closes open connections");
        assert!(talk(&p).is_err(), "a cut refuses new ones");
        p.heal();
        assert_eq!(talk(&p).unwrap(), b"ping");
    }
}

//! A minimal memcached text-protocol client for the SecureCached process tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::Duration;

pub struct Client {
    pub r: BufReader<TcpStream>,
    pub w: TcpStream,
}

impl Client {
    pub fn connect(a: SocketAddr) -> Client {
        let s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Client { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("a reply line in time");
        l.trim_end().to_string()
    }

    pub fn call(&mut self, req: &str) -> String {
        self.w.write_all(req.as_bytes()).unwrap();
        self.line()
    }

    pub fn set(&mut self, key: &str, flags: u32, data: &[u8]) -> String {
        let mut req = format!("set {key} {flags} 0 {}\r\n", data.len()).into_bytes();
        req.extend_from_slice(data);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req).unwrap();
        self.line()
    }

    /// `gets key`: Some((data, flags, unique)) or None.
    pub fn gets(&mut self, key: &str) -> Option<(Vec<u8>, u32, u64)> {
        let head = self.call(&format!("gets {key}\r\n"));
        if head == "END" {
            return None;
        }
        let p: Vec<&str> = head.split(' ').collect();
        assert_eq!(p[0], "VALUE", "gets {key}: {head}");
        let len: usize = p[3].parse().unwrap();
        let mut data = vec![0u8; len + 2];
        self.r.read_exact(&mut data).unwrap();
        data.truncate(len);
        assert_eq!(self.line(), "END");
        Some((data, p[2].parse().unwrap(), p[4].parse().unwrap()))
    }

    pub fn stat(&mut self, name: &str) -> u64 {
        self.w.write_all(b"stats\r\n").unwrap();
        let mut v = None;
        loop {
            let l = self.line();
            if l == "END" {
                break;
            }
            if let Some(x) = l.strip_prefix(&format!("STAT {name} ")) {
                v = x.parse().ok();
            }
        }
        v.unwrap_or_else(|| panic!("no stat {name}"))
    }
}

/// Two clients, released together by a barrier, each send `cas KEY 0 0 1 UNIQUE` with its own
/// one-byte value to its front end; returns the two first reply lines, sorted (a correct
/// group answers `["EXISTS", "STORED"]`).
pub fn cas_race(fronts: [(SocketAddr, &'static str); 2], key: &str, unique: u64) -> Vec<String> {
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = fronts
        .into_iter()
        .map(|(addr, v)| {
            let (barrier, key) = (barrier.clone(), key.to_string());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                barrier.wait();
                c.call(&format!("cas {key} 0 0 1 {unique}\r\n{v}\r\n"))
            })
        })
        .collect();
    let mut replies: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    replies.sort();
    replies
}

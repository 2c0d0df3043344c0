//! Shared helpers of the integration tests: an in-process deployment with a server, and a
//! small blocking client over a real socket.
#![allow(dead_code)]

use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::{Config, Server, ServerConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct Running {
    pub servers: Vec<Server>,
    pub deployment: Embedded,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.servers[0].addr()
    }
}

/// `front_ends` front ends (one group), each with its own server on 127.0.0.1.
pub fn start_with(front_ends: usize, config: Config, scfg: ServerConfig) -> Running {
    let deployment =
        Embedded::start(&EmbeddedOptions { front_ends, config, epoch_ms: 50, ..EmbeddedOptions::default() }).unwrap();
    let servers = deployment
        .front_ends
        .iter()
        .map(|fe| Server::start(fe.clone(), "127.0.0.1:0".parse().unwrap(), scfg.clone()).unwrap())
        .collect();
    Running { servers, deployment }
}

pub fn start() -> Running {
    start_with(1, Config::default(), ServerConfig::default())
}

pub struct Client {
    pub r: BufReader<TcpStream>,
    pub w: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Client { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    pub fn send(&mut self, b: &[u8]) {
        self.w.write_all(b).unwrap();
    }

    /// One reply line without `\r\n`.
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        assert!(l.ends_with("\r\n"), "line not terminated: {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    /// Exactly `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.r.read_exact(&mut v).unwrap();
        v
    }

    /// Sends `req`, then expects exactly `expect` back.
    pub fn expect(&mut self, req: &str, expect: &str) {
        self.send(req.as_bytes());
        let got = self.bytes(expect.len());
        assert_eq!(String::from_utf8_lossy(&got), expect, "request {req:?}");
    }

    /// A command whose reply is one line.
    pub fn call(&mut self, req: &str) -> String {
        self.send(req.as_bytes());
        self.line()
    }

    /// `gets key`: (flags, data, cas) or None.
    pub fn gets(&mut self, key: &str) -> Option<(u32, Vec<u8>, u64)> {
        self.send(format!("gets {key}\r\n").as_bytes());
        let l = self.line();
        if l == "END" {
            return None;
        }
        let t: Vec<&str> = l.split(' ').collect();
        assert_eq!(t[0], "VALUE", "{l}");
        let n: usize = t[3].parse().unwrap();
        let data = self.bytes(n);
        assert_eq!(self.bytes(2), b"\r\n");
        assert_eq!(self.line(), "END");
        Some((t[2].parse().unwrap(), data, t[4].parse().unwrap()))
    }

    /// True once the server closed the connection (EOF within the read timeout).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.r.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    }

    pub fn stat(&mut self, name: &str) -> u64 {
        self.send(b"stats\r\n");
        let mut v = None;
        loop {
            let l = self.line();
            if l == "END" {
                break;
            }
            let t: Vec<&str> = l.split(' ').collect();
            if t.len() == 3 && t[1] == name {
                v = t[2].parse().ok();
            }
        }
        v.unwrap_or_else(|| panic!("no stat {name}"))
    }
}

//! The client of a role's control interface (`psl_node::control`'s line protocol), every
//! command signed with the run's operator key: what the runner's clients, its finals and the
//! byzantine attacker speak to nodes and coordinators.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The operator control key of this process's runs (each run's roles get its public half,
/// `control.pub` in the run's directory).
pub(super) fn control_key() -> &'static psl_crypto::SigningKey {
    static KEY: std::sync::OnceLock<psl_crypto::SigningKey> = std::sync::OnceLock::new();
    KEY.get_or_init(psl_node::control::generate_operator_key)
}

/// A node's control interface (line protocol), with bounded waits; every command signed with
/// [`control_key`].
pub(super) struct Ctl {
    r: BufReader<TcpStream>,
    pub(super) w: TcpStream,
    nonce: [u8; psl_node::control::NONCE_BYTES],
    next: u64,
}

impl Ctl {
    pub(super) fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Ctl> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(45)))?;
        s.set_write_timeout(Some(Duration::from_secs(45)))?;
        let mut c =
            Ctl { r: BufReader::new(s.try_clone()?), w: s, nonce: [0; psl_node::control::NONCE_BYTES], next: 0 };
        c.w.write_all(b"HELLO\n")?;
        let hello = c.line()?;
        let nonce = hello.strip_prefix(&format!("HELLO {} ", psl_node::control::PROTOCOL)).unwrap_or_default();
        hex::decode_to_slice(nonce, &mut c.nonce)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("greeting {hello:?}")))?;
        Ok(c)
    }

    pub(super) fn send(&mut self, lines: &[String]) -> std::io::Result<()> {
        let mut b = Vec::new();
        for l in lines {
            let sig = control_key().sign(&psl_node::control::command_digest(&self.nonce, self.next, l.as_bytes()));
            b.extend_from_slice(format!("AUTH {} {} {l}\n", self.next, hex::encode(sig.0)).as_bytes());
            self.next += 1;
        }
        self.w.write_all(&b)
    }

    pub(super) fn line(&mut self) -> std::io::Result<String> {
        let mut s = String::new();
        if self.r.read_line(&mut s)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(s.trim_end().to_string())
    }

    pub(super) fn call(&mut self, l: &str) -> std::io::Result<String> {
        self.send(&[l.to_string()])?;
        self.line()
    }
}

//! [`Session`]: one client connection's protocol state, free of I/O.
//!
//! The runtime (the event loop of `evloop` or the tokio tasks of [`crate::server`])
//! only moves bytes: it appends what it reads to [`Session::input`], calls
//! [`Session::process`], and writes out [`Session::output`] when told to. The session parses
//! every complete request in its input and runs it against the [`FrontEnd`], in order, so
//! pipelined requests are answered in order and a pipeline of N requests costs one write.
//!
//! Bounds: the input holds at most one command line (`line_max`) plus one data block
//! (`item_size_max` + 2) beyond what has been parsed (the parser refuses longer ones), and the
//! output never grows much past [`OUT_FLUSH`]: past it `process` stops and asks for a write,
//! even in the middle of a `get` of many keys (it resumes at the next key).

use crate::exec::Flow;
use crate::proto::{parse, Command, Parsed};
use crate::shards::Shards;
use crate::stats::Stats;
use crate::store::FrontEnd;
use bytes::{Buf, BytesMut};

/// Output bytes gathered before a write even if more input is parsed.
pub const OUT_FLUSH: usize = 256 * 1024;

/// Buffer capacity at the start (input and output each; they grow as a request or reply
/// needs), and the free input space kept for a read. 4 KiB buffers measured about 2% slower
/// in the mix benchmark (two A/Bs of 7 rounds, within the noise but both the same way), so an
/// idle connection costs 32 KiB.
const BUF_INITIAL: usize = 16 * 1024;
const IN_FREE_MIN: usize = 8 * 1024;
/// An emptied input or output buffer larger than this (after a large item) is given back.
const IN_KEEP_MAX: usize = 256 * 1024;
const OUT_KEEP_MAX: usize = 4 * OUT_FLUSH;

/// Idle-timer checks per `idle_timeout`, in both runtimes: a connection not read from for
/// this many checks in a row is closed, after 1 to 1.25 timeouts of silence.
pub const IDLE_TICKS: u32 = 4;

/// The idle timer's period for `idle_timeout` (`None`: no timer).
pub fn idle_tick(idle_timeout: Option<std::time::Duration>) -> Option<std::time::Duration> {
    idle_timeout.map(|t| (t / IDLE_TICKS).max(std::time::Duration::from_millis(1)))
}

/// What the runtime does after [`Session::process`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every complete request is answered: write out the output (if any), then read more.
    NeedInput,
    /// The output passed [`OUT_FLUSH`]: write it out, then call `process` again.
    Flush,
    /// Write out the output, then close the connection (`quit`, or a fatal protocol error).
    Close,
}

/// One connection's buffers and parse state.
pub struct Session {
    input: BytesMut,
    output: Vec<u8>,
    /// Bytes of a refused data block still to be skipped as they arrive.
    swallow: usize,
    /// Keys of the `get` at the head of the input already answered (it is resumed there
    /// after a flush).
    get_done: usize,
}

impl Default for Session {
    fn default() -> Self {
        Session::new()
    }
}

impl Session {
    /// A fresh connection: empty buffers of 16 KiB capacity each, nothing pending.
    pub fn new() -> Session {
        Session {
            input: BytesMut::with_capacity(BUF_INITIAL),
            output: Vec::with_capacity(BUF_INITIAL),
            swallow: 0,
            get_done: 0,
        }
    }

    /// The input buffer, with at least a few KiB of free capacity: read into its spare
    /// capacity (`BufMut`) or append to it.
    pub fn input(&mut self) -> &mut BytesMut {
        if self.input.is_empty() && self.input.capacity() > IN_KEEP_MAX {
            self.input = BytesMut::with_capacity(BUF_INITIAL);
        }
        if self.input.capacity() - self.input.len() < IN_FREE_MIN {
            self.input.reserve(BUF_INITIAL);
        }
        &mut self.input
    }

    /// The replies not yet written.
    pub fn output(&self) -> &[u8] {
        &self.output
    }

    /// Drops the first `n` bytes of the output (they were written).
    pub fn consume_output(&mut self, n: usize) {
        if n >= self.output.len() {
            self.output.clear();
            if self.output.capacity() > OUT_KEEP_MAX {
                self.output = Vec::with_capacity(BUF_INITIAL);
            }
        } else {
            self.output.drain(..n);
        }
    }

    /// Answers every complete request in the input, in order (see [`Step`]).
    pub fn process(&mut self, fe: &FrontEnd) -> Step {
        let limits = fe.config().limits;
        let shards = fe.shards();
        loop {
            if self.output.len() >= OUT_FLUSH {
                return Step::Flush;
            }
            if self.swallow > 0 {
                let n = self.swallow.min(self.input.len());
                self.input.advance(n);
                self.swallow -= n;
                if self.swallow > 0 {
                    return Step::NeedInput;
                }
            }
            if self.input.is_empty() {
                return Step::NeedInput;
            }
            match parse(&self.input, &limits) {
                Parsed::Incomplete => return Step::NeedInput,
                Parsed::Cmd { cmd: Command::Get { keys, cas, touch }, used } => {
                    let mut complete = true;
                    for (i, k) in keys.iter().enumerate().skip(self.get_done) {
                        if self.output.len() >= OUT_FLUSH {
                            // Resume at key `i` once the output is written.
                            self.get_done = i;
                            return Step::Flush;
                        }
                        let done = match shards.as_deref().and_then(|sh| Some((sh, sh.elsewhere(k)?))) {
                            Some((sh, shard)) => forward_get_key(fe, sh, shard, k, cas, touch, &mut self.output),
                            None => fe.get_key(k, cas, touch, &mut self.output),
                        };
                        if !done {
                            complete = false;
                            break;
                        }
                    }
                    if complete {
                        self.output.extend_from_slice(b"END\r\n");
                    }
                    self.get_done = 0;
                    self.input.advance(used);
                }
                Parsed::Cmd { cmd: cmd @ Command::FlushAll { .. }, used } if shards.is_some() => {
                    // Every shard's items: the other shards' front ends flush theirs first.
                    let sh = shards.as_deref().expect("checked");
                    let mut failed = Vec::new();
                    for other in (0..sh.map().shards.len() as u16).filter(|s| *s != sh.me()) {
                        let mut reply = Vec::new();
                        let ok = forward(fe, sh, other, &self.input[..used], &mut reply);
                        let noreply = matches!(cmd, Command::FlushAll { noreply: true, .. });
                        if !ok || !(reply == b"OK\r\n" || (noreply && reply.is_empty())) {
                            failed.push(other);
                        }
                    }
                    let mut here = Vec::new();
                    fe.execute(&cmd, &mut here);
                    if failed.is_empty() {
                        self.output.extend_from_slice(&here);
                    } else {
                        let msg = format!("SERVER_ERROR flush_all flushed every shard but {failed:?}\r\n");
                        self.output.extend_from_slice(msg.as_bytes());
                    }
                    self.input.advance(used);
                }
                Parsed::Cmd { cmd, used } => {
                    if let Some((sh, shard)) = shards.as_deref().and_then(|sh| Some((sh, sh.elsewhere(cmd.key()?)?))) {
                        forward(fe, sh, shard, &self.input[..used], &mut self.output);
                        self.input.advance(used);
                        continue;
                    }
                    let flow = fe.execute(&cmd, &mut self.output);
                    self.input.advance(used);
                    if flow == Flow::Close {
                        return Step::Close;
                    }
                }
                Parsed::Error { reply, used, swallow } => {
                    self.output.extend_from_slice(reply.as_bytes());
                    self.output.extend_from_slice(b"\r\n");
                    self.input.advance(used);
                    self.swallow = swallow;
                }
                Parsed::Close { reply } => {
                    self.output.extend_from_slice(reply.as_bytes());
                    self.output.extend_from_slice(b"\r\n");
                    return Step::Close;
                }
            }
        }
    }
}

/// Sends one whole command to a front end of `shard` and appends its reply, or a
/// `SERVER_ERROR` naming the shard.
fn forward(fe: &FrontEnd, sh: &Shards, shard: u16, raw: &[u8], out: &mut Vec<u8>) -> bool {
    Stats::inc(&fe.stats.shard_forwarded);
    match sh.forward(shard, raw, out) {
        Ok(()) => true,
        Err(e) => {
            Stats::inc(&fe.stats.shard_forward_failures);
            out.extend_from_slice(b"SERVER_ERROR ");
            out.extend_from_slice(e.as_bytes());
            out.extend_from_slice(b"\r\n");
            false
        }
    }
}

/// One key of a `get`-family command whose shard is another: its `VALUE` block (if any) from
/// a front end of that shard. Returns false after an error line (the command ends there, as
/// [`FrontEnd::get_key`]'s does).
fn forward_get_key(
    fe: &FrontEnd,
    sh: &Shards,
    shard: u16,
    key: &[u8],
    cas: bool,
    touch: Option<i64>,
    out: &mut Vec<u8>,
) -> bool {
    let mut req = Vec::with_capacity(key.len() + 32);
    match touch {
        None => req.extend_from_slice(if cas { b"gets " } else { b"get " }),
        Some(t) => req.extend_from_slice(format!("{} {t} ", if cas { "gats" } else { "gat" }).as_bytes()),
    }
    req.extend_from_slice(key);
    req.extend_from_slice(b"\r\n");
    let start = out.len();
    if !forward(fe, sh, shard, &req, out) {
        return false;
    }
    if out[start..].ends_with(b"END\r\n") {
        out.truncate(out.len() - b"END\r\n".len());
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deploy::{Embedded, EmbeddedOptions};

    fn fe() -> (Embedded, std::sync::Arc<FrontEnd>) {
        let d = Embedded::start(&EmbeddedOptions::default()).unwrap();
        let fe = d.front_ends[0].clone();
        (d, fe)
    }

    fn feed(s: &mut Session, fe: &FrontEnd, bytes: &[u8]) -> (Step, String) {
        s.input().extend_from_slice(bytes);
        let step = s.process(fe);
        let out = String::from_utf8_lossy(s.output()).to_string();
        let n = s.output().len();
        s.consume_output(n);
        (step, out)
    }

    #[test]
    fn pipelined_and_split_requests_are_answered_in_order() {
        let (_d, fe) = fe();
        let mut s = Session::new();
        let (step, out) = feed(&mut s, &fe, b"set a 5 0 1\r\nx\r\nget a\r\nset b 0 0 2\r\ny");
        assert_eq!(step, Step::NeedInput);
        assert_eq!(out, "STORED\r\nVALUE a 5 1\r\nx\r\nEND\r\n");
        let (_, out) = feed(&mut s, &fe, b"z\r\nget a b\r\nbogus\r\n");
        assert_eq!(out, "STORED\r\nVALUE a 5 1\r\nx\r\nVALUE b 0 2\r\nyz\r\nEND\r\nERROR\r\n");
        let (step, out) = feed(&mut s, &fe, b"quit\r\nget a\r\n");
        assert_eq!((step, out.as_str()), (Step::Close, ""));
    }

    #[test]
    fn a_refused_data_block_is_skipped_as_it_arrives() {
        let (_d, fe) = fe();
        let mut s = Session::new();
        let big = fe.config().limits.item_size_max + 1;
        let (_, out) = feed(&mut s, &fe, format!("set k 0 0 {big}\r\n").as_bytes());
        assert_eq!(out, "SERVER_ERROR object too large for cache\r\n");
        let half = vec![b'v'; big / 2];
        assert_eq!(feed(&mut s, &fe, &half).1, "");
        let mut rest = vec![b'v'; big - half.len()];
        rest.extend_from_slice(b"\r\nversion\r\n");
        assert_eq!(feed(&mut s, &fe, &rest).1, format!("VERSION {}\r\n", crate::VERSION));
    }

    #[test]
    fn a_get_of_many_large_items_flushes_between_keys_and_resumes() {
        let (_d, fe) = fe();
        let mut s = Session::new();
        let v = vec![b'x'; 100_000];
        let mut req = Vec::new();
        for k in 0..8 {
            req.extend_from_slice(format!("set k{k} 0 0 {}\r\n", v.len()).as_bytes());
            req.extend_from_slice(&v);
            req.extend_from_slice(b"\r\n");
        }
        assert_eq!(feed(&mut s, &fe, &req).1, "STORED\r\n".repeat(8));
        s.input().extend_from_slice(b"get k0 k1 k2 k3 k4 k5 k6 k7\r\nversion\r\n");
        let mut all = Vec::new();
        let mut flushes = 0;
        loop {
            let step = s.process(&fe);
            assert!(s.output().len() < OUT_FLUSH + v.len() + 64, "output stays bounded");
            all.extend_from_slice(s.output());
            let n = s.output().len();
            s.consume_output(n);
            match step {
                Step::Flush => flushes += 1,
                Step::NeedInput => break,
                Step::Close => panic!("closed"),
            }
        }
        assert!(flushes >= 2, "{flushes} flushes");
        let text = String::from_utf8_lossy(&all);
        assert_eq!(text.matches("VALUE k").count(), 8);
        for k in 0..8 {
            assert!(text.contains(&format!("VALUE k{k} 0 100000\r\n")));
        }
        assert!(text.ends_with(&format!("END\r\nVERSION {}\r\n", crate::VERSION)));
    }
}

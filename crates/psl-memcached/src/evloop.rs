//! The plain-TCP runtime: memcached's own shape (one event loop per worker thread) on `mio`.
//!
//! Worker 0 accepts and hands connections out round-robin (itself included); each worker
//! owns its connections and drives their [`Session`]s from readiness events: read once,
//! answer every complete request, write the replies, and go back to `epoll_wait`. A request
//! therefore costs one `recv` and one `send`, and no task, waker or scheduler sits between
//! the socket and the protocol (the tokio runtime's bookkeeping was about a third of the
//! server thread's user time). TLS connections use the tokio runtime ([`crate::server`]).
//!
//! Sockets are registered edge-triggered for reads and writes. A read that fills less than
//! the buffer's free space has drained the socket, so the next arrival raises a new event; a
//! full read is followed by another. While a connection's replies cannot be written
//! (the client does not read), its input is not processed: its buffers stay bounded and the
//! kernel's receive window pushes back on the client.
//!
//! Idle timeout: every quarter of `idle_timeout` each worker scans its connections; one that
//! has not been read from for four scans in a row is closed (after 1 to 1.25 timeouts of
//! silence).
//!
//! Fairness: a connection gets at most [`READS_PER_TURN`] full reads in a row; one with input
//! left goes to the back of a ready list that the loop serves after the next (non-blocking)
//! `epoll_wait`, since an edge-triggered socket would not report that input again.

use crate::config::{ServerConfig, ServerError};
use crate::session::{idle_tick, Session, Step, IDLE_TICKS};
use crate::stats::Stats;
use crate::store::FrontEnd;
use bytes::BufMut;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAKE: Token = Token(usize::MAX);
const LISTEN: Token = Token(usize::MAX - 1);
/// Readiness events taken per `epoll_wait`.
const EVENTS_MAX: usize = 1024;
/// After an accept error (out of file descriptors, ...), accepting resumes this much later.
const ACCEPT_RETRY: Duration = Duration::from_millis(20);
/// Full reads one connection gets per turn (memcached's `reqs_per_event`): a client that keeps
/// its socket full is put back in line behind the other ready connections.
const READS_PER_TURN: u32 = 16;

/// The running workers.
pub(crate) struct Loops {
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    threads: Vec<JoinHandle<()>>,
}

impl Loops {
    /// Stops every worker (open connections are closed) and waits for them.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            let _ = w.wake();
        }
        self.join();
    }

    pub(crate) fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What a worker shares with the acceptor: connections handed to it, and its waker.
struct Inbox {
    conns: Mutex<Vec<TcpStream>>,
    waker: Arc<Waker>,
}

/// Starts `cfg.threads` workers serving `listener` (worker 0 accepts).
/// The listener comes from `mio::net::TcpListener::bind` (non-blocking, `SO_REUSEADDR`, a
/// backlog of 1024 as memcached's `-b` default).
pub(crate) fn start(fe: Arc<FrontEnd>, listener: TcpListener, cfg: ServerConfig) -> Result<Loops, ServerError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ServerError::Io { what: what.clone(), source }
    };
    let n = cfg.threads.max(1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut polls = Vec::with_capacity(n);
    let mut inboxes = Vec::with_capacity(n);
    for _ in 0..n {
        let poll = Poll::new().map_err(io("creating an event loop"))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE).map_err(io("creating a waker"))?);
        inboxes.push(Arc::new(Inbox { conns: Mutex::new(Vec::new()), waker }));
        polls.push(poll);
    }
    let mut listener = Some(listener);
    let mut threads = Vec::with_capacity(n);
    for (i, poll) in polls.into_iter().enumerate() {
        let mut w = Worker {
            me: i,
            fe: fe.clone(),
            cfg: cfg.clone(),
            poll,
            listener: if i == 0 { listener.take() } else { None },
            inboxes: inboxes.clone(),
            next: 0,
            conns: Vec::new(),
            free: Vec::new(),
            again: Vec::new(),
            stop: stop.clone(),
        };
        if let Some(l) = w.listener.as_mut() {
            w.poll.registry().register(l, LISTEN, Interest::READABLE).map_err(io("registering the listener"))?;
        }
        let name = if n == 1 { "memcached".to_string() } else { format!("memcached-{i}") };
        threads.push(std::thread::Builder::new().name(name).spawn(move || w.run()).map_err(io("spawning a worker"))?);
    }
    Ok(Loops { stop, wakers: inboxes.iter().map(|b| b.waker.clone()).collect(), threads })
}

struct Conn {
    sock: TcpStream,
    sess: Session,
    /// Reads so far, and at the last idle scan; scans in a row without a read.
    reads: u64,
    reads_at_tick: u64,
    quiet_ticks: u32,
}

struct Worker {
    me: usize,
    fe: Arc<FrontEnd>,
    cfg: ServerConfig,
    poll: Poll,
    listener: Option<TcpListener>,
    inboxes: Vec<Arc<Inbox>>,
    /// The worker the next accepted connection goes to.
    next: usize,
    /// Connections by token; `free` lists the empty slots.
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Connections whose turn ended with input left to read.
    again: Vec<usize>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_MAX);
        let tick = idle_tick(self.cfg.idle_timeout);
        let mut next_tick = tick.map(|t| Instant::now() + t);
        let mut accept_retry: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let due = [next_tick, accept_retry].into_iter().flatten().min();
            let timeout = if self.again.is_empty() {
                due.map(|d| d.saturating_duration_since(now))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("memcached event loop {}: {e}", self.me);
                    break;
                }
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKE => self.take_handed(),
                    LISTEN => {
                        if !self.accept() {
                            accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                        }
                    }
                    Token(i) => self.drive(i),
                }
            }
            for i in std::mem::take(&mut self.again) {
                self.drive(i);
            }
            if accept_retry.is_some_and(|t| Instant::now() >= t) {
                accept_retry = None;
                if !self.accept() {
                    accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                }
            }
            if let (Some(t), Some(at)) = (tick, next_tick) {
                let now = Instant::now();
                if now >= at {
                    self.idle_scan();
                    next_tick = Some(now + t);
                }
            }
        }
        // Connections handed over but not yet taken are closed (and counted) too.
        self.take_handed();
        for i in 0..self.conns.len() {
            self.close(i);
        }
    }

    /// Accepts every pending connection. Returns false after an accept error.
    fn accept(&mut self) -> bool {
        loop {
            let Some(l) = self.listener.as_ref() else { return true };
            let (mut sock, _) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    return false;
                }
            };
            let _ = sock.set_nodelay(true);
            let st = &self.fe.stats;
            if Stats::get(&st.curr_connections) as usize >= self.cfg.max_connections {
                Stats::inc(&st.rejected_connections);
                // Best effort: a fresh socket's send buffer takes the line at once.
                let _ = sock.write(b"SERVER_ERROR too many open connections\r\n");
                continue;
            }
            Stats::inc(&st.curr_connections);
            Stats::inc(&st.total_connections);
            let to = self.next;
            self.next = (self.next + 1) % self.inboxes.len();
            if to == self.me {
                self.add(sock);
            } else {
                let inbox = &self.inboxes[to];
                inbox.conns.lock().push(sock);
                let _ = inbox.waker.wake();
            }
        }
    }

    /// Registers the connections the acceptor handed to this worker.
    fn take_handed(&mut self) {
        let handed = std::mem::take(&mut *self.inboxes[self.me].conns.lock());
        for sock in handed {
            self.add(sock);
        }
    }

    fn add(&mut self, mut sock: TcpStream) {
        let i = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = self.poll.registry().register(&mut sock, Token(i), Interest::READABLE | Interest::WRITABLE) {
            tracing::warn!("registering a connection: {e}");
            self.free.push(i);
            self.fe.stats.curr_connections.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        self.conns[i] = Some(Conn { sock, sess: Session::new(), reads: 0, reads_at_tick: 0, quiet_ticks: 0 });
        // Data may have arrived before registration: edge-triggered, so look now.
        self.drive(i);
    }

    fn close(&mut self, i: usize) {
        self.again.retain(|&j| j != i);
        if let Some(mut c) = self.conns.get_mut(i).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut c.sock);
            self.free.push(i);
            self.fe.stats.curr_connections.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Reads, answers and writes on connection `i` until it would block; closes it if it
    /// is done.
    fn drive(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else { return };
        match serve(&self.fe, c) {
            Turn::Wait => {}
            Turn::Again => {
                if !self.again.contains(&i) {
                    self.again.push(i);
                }
            }
            Turn::Close => self.close(i),
        }
    }

    fn idle_scan(&mut self) {
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_mut() else { continue };
            if c.reads != c.reads_at_tick {
                (c.reads_at_tick, c.quiet_ticks) = (c.reads, 0);
                continue;
            }
            c.quiet_ticks += 1;
            if c.quiet_ticks >= IDLE_TICKS {
                Stats::inc(&self.fe.stats.idle_kicks);
                self.close(i);
            }
        }
    }
}

/// How a connection's turn ended.
enum Turn {
    /// It would block: its next event resumes it.
    Wait,
    /// Its turn is over but it has input left to read: serve it again soon.
    Again,
    Close,
}

/// Drives one connection until it would block or its turn is over.
fn serve(fe: &FrontEnd, c: &mut Conn) -> Turn {
    // Replies left from before (the socket was full): write them first.
    match write_out(fe, c) {
        Ok(true) => {}
        Ok(false) => return Turn::Wait,
        Err(_) => return Turn::Close,
    }
    let mut may_read = true;
    let mut full_reads = 0;
    loop {
        match c.sess.process(fe) {
            Step::Flush => match write_out(fe, c) {
                Ok(true) => {}
                Ok(false) => return Turn::Wait,
                Err(_) => return Turn::Close,
            },
            Step::Close => {
                let _ = write_out(fe, c);
                return Turn::Close;
            }
            Step::NeedInput => {
                match write_out(fe, c) {
                    Ok(true) => {}
                    Ok(false) => return Turn::Wait,
                    Err(_) => return Turn::Close,
                }
                if !may_read {
                    return Turn::Wait;
                }
                if full_reads >= READS_PER_TURN {
                    return Turn::Again;
                }
                let buf = c.sess.input();
                let spare = buf.capacity() - buf.len();
                match read_into(&mut c.sock, buf) {
                    Ok(0) => return Turn::Close,
                    Ok(n) => {
                        c.reads += 1;
                        Stats::add(&fe.stats.bytes_read, n as u64);
                        // A short read drained the socket: the next arrival is a new event.
                        may_read = n == spare;
                        full_reads += u32::from(may_read);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Turn::Wait,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Turn::Close,
                }
            }
        }
    }
}

/// Reads once (one `recv`) into the buffer's spare capacity.
fn read_into(sock: &mut TcpStream, buf: &mut bytes::BytesMut) -> io::Result<usize> {
    let spare = buf.chunk_mut();
    let (ptr, len) = (spare.as_mut_ptr(), spare.len());
    // SAFETY: `ptr` and `len` describe the buffer's spare capacity, memory it owns and that
    // nothing else references while `buf` is borrowed mutably here; `recv` writes at most
    // `len` bytes there (the kernel never reads it, so it need not be initialized) and
    // returns how many, or -1. `sock` is an open socket for the whole call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), ptr.cast(), len, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: `recv` initialized the first `n` (≤ `len`) bytes of the spare capacity.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

/// Writes the session's output until it is empty (`Ok(true)`) or the socket is full
/// (`Ok(false)`: the writable event resumes it).
fn write_out(fe: &FrontEnd, c: &mut Conn) -> io::Result<bool> {
    while !c.sess.output().is_empty() {
        match c.sock.write(c.sess.output()) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                Stats::add(&fe.stats.bytes_written, n as u64);
                c.sess.consume_output(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

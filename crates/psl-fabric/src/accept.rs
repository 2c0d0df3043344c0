//! Accepting TCP connections without polling: a listener loop that must also notice a stop
//! flag waits in `poll(2)` for a connection, up to a bound, instead of sleeping between
//! nonblocking `accept`s (an idle role woke 50 times a second per listener that way).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// How long a listener loop waits for a connection before it checks its stop flag again.
pub const ACCEPT_WAIT: Duration = Duration::from_millis(250);

/// The next connection on `listener` (which must be nonblocking), waiting at most `timeout`
/// for one: `Ok(None)` if none came (or a signal interrupted the wait).
pub fn accept_within(listener: &TcpListener, timeout: Duration) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    match listener.accept() {
        Ok(c) => return Ok(Some(c)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fd` is one initialised `pollfd` that outlives the call, and nfds is 1, so the
    // kernel reads and writes only that struct; its descriptor is `listener`'s, which the
    // borrow keeps open for the whole call. poll(2) has no other memory effects.
    let ready = unsafe { libc::poll(&mut fd, 1, ms) };
    if ready < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(None) } else { Err(e) };
    }
    if ready == 0 {
        return Ok(None);
    }
    match listener.accept() {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn waits_for_a_connection_and_returns_it_at_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let t = Instant::now();
        assert!(accept_within(&l, Duration::from_millis(100)).unwrap().is_none());
        assert!(t.elapsed() >= Duration::from_millis(90), "it waited, not spun");
        let addr = l.local_addr().unwrap();
        let c = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            TcpStream::connect(addr).unwrap()
        });
        let t = Instant::now();
        let got = accept_within(&l, Duration::from_secs(10)).unwrap();
        assert!(got.is_some());
        assert!(t.elapsed() < Duration::from_secs(5), "woken by the connection, not the timeout");
        c.join().unwrap();
    }
}

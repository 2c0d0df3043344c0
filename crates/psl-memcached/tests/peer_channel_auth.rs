//! The peer channel between front-end processes, over real loopback sockets: a holder of the
//! capsule's data key gets its forwarded command run at the home; anyone else (a wrong key,
//! or plain garbage) gets nothing done and the connection closed.

use psl_crypto::DataKey;
use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::peer::{PeerClient, PeerConfig, PeerKey, PeerServer};
use psl_memcached::proto::StoreMode;
use psl_memcached::store::{Lookup, Outcome, Rmw};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[test]
fn only_holders_of_the_peer_key_get_commands_run_at_the_home() {
    let d = Embedded::start(&EmbeddedOptions::default()).unwrap();
    let home = d.front_ends[0].clone();
    let key = PeerKey::derive(&DataKey::from_bytes(&[7; 32]));
    let server = PeerServer::start(&home, TcpListener::bind("127.0.0.1:0").unwrap(), key.clone()).unwrap();
    let cfg = PeerConfig { timeout: Duration::from_secs(2) };
    let add = Rmw::Store { mode: StoreMode::Add, flags: 3, exptime: 0, cas: None, data: b"v" };

    // The right key: the add runs at the home, and a second one is refused there.
    let good = PeerClient::new(server.addr(), key, cfg);
    assert!(matches!(good.call(b"k", &add), Outcome::Stored { .. }));
    assert_eq!(good.call(b"k", &add), Outcome::NotStored);
    let Lookup::Hit { cas, .. } = home.lookup(b"k") else { panic!("the add did not run at the home") };
    let touch = Rmw::Touch { exptime: Some(100), vivify: None };
    match good.call(b"k", &touch) {
        Outcome::Item { cas: kept, .. } => assert_eq!(kept, cas, "a touch keeps the unique"),
        o => panic!("touch: {o:?}"),
    }

    // A wrong key: nothing runs, the forwarder reports the home unavailable.
    let bad = PeerClient::new(server.addr(), PeerKey::derive(&DataKey::from_bytes(&[8; 32])), cfg);
    assert!(matches!(bad.call(b"other", &add), Outcome::Unavailable(_)));
    assert!(matches!(home.lookup(b"other"), Lookup::Miss));

    // Garbage after the nonce: the home closes the connection without a reply.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut nonce = [0u8; 16];
    s.read_exact(&mut nonce).unwrap();
    let mut frame = 64u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&[0xAB; 64]);
    s.write_all(&frame).unwrap();
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "no reply to a frame that does not open");

    // The right key still works after all that.
    assert!(matches!(good.call(b"k2", &add), Outcome::Stored { .. }));
}

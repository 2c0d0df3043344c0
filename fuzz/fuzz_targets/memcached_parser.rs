//! memcached protocol parser: never panics, always makes progress, never returns a command
//! that breaks the limits, and a stream parsed in one piece gives the same results as the
//! same stream whose tail arrives later (Incomplete never hides a decision).
//! Input: 1 byte of line limit (×64, at least 64), 1 byte of item limit (×16), then the stream.
//! The same bytes also feed the decoders of forwarded commands between front ends
//! (`psl_memcached::peer`), of home failover's control requests and replies, and of scans of
//! another shard: they never panic, and what they accept re-encodes to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_memcached::peer::{
    decode_ctl, decode_ctl_reply, decode_outcome, decode_request, decode_routed, decode_scan_reply,
    decode_scan_request, encode_ctl, encode_ctl_reply, encode_outcome, encode_request, encode_routed,
    encode_scan_reply, encode_scan_request,
};
use psl_memcached::proto::{parse, valid_key, Command, Limits, Parsed};

fn run(stream: &[u8], limits: &Limits) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = stream;
    let mut swallow = 0usize;
    loop {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
            if swallow > 0 {
                break;
            }
        }
        if rest.is_empty() {
            break;
        }
        match parse(rest, limits) {
            Parsed::Incomplete => {
                assert!(rest.len() < limits.line_max + limits.item_size_max + 2 + 32);
                break;
            }
            Parsed::Cmd { cmd, used } => {
                assert!(used > 0 && used <= rest.len());
                check(&cmd, limits);
                out.push(format!("{cmd:?}"));
                rest = &rest[used..];
            }
            Parsed::Error { reply, used, swallow: sw } => {
                assert!(used > 0 && used <= rest.len());
                out.push(reply.to_string());
                rest = &rest[used..];
                swallow = sw;
            }
            Parsed::Close { reply } => {
                out.push(reply.to_string());
                break;
            }
        }
    }
    out
}

fn check(cmd: &Command<'_>, l: &Limits) {
    match cmd {
        Command::Get { keys, .. } => assert!(keys.iter().all(|k| valid_key(k, l))),
        Command::Store { key, data, .. } | Command::MetaSet { key, data, .. } => {
            assert!(valid_key(key, l));
            assert!(data.len() <= l.item_size_max);
        }
        Command::Delete { key, .. }
        | Command::Arith { key, .. }
        | Command::Touch { key, .. }
        | Command::MetaGet { key, .. }
        | Command::MetaDelete { key, .. }
        | Command::MetaArith { key, .. } => assert!(valid_key(key, l)),
        _ => {}
    }
}

fn peer_codecs(data: &[u8]) {
    if let Ok((key, op)) = decode_request(data) {
        let mut again = Vec::new();
        encode_request(key, &op, &mut again);
        assert_eq!(again, data);
    }
    if let Ok(o) = decode_outcome(data) {
        let mut again = Vec::new();
        encode_outcome(&o, &mut again);
        assert_eq!(decode_outcome(&again).as_ref(), Ok(&o));
    }
    if let Ok(r) = decode_routed(data) {
        let mut again = Vec::new();
        encode_routed(&r, &mut again);
        assert_eq!(decode_routed(&again).as_ref(), Ok(&r));
    }
    // Home failover's control requests and replies: exact re-encoding.
    if let Ok(c) = decode_ctl(data) {
        let mut again = Vec::new();
        encode_ctl(&c, &mut again);
        assert_eq!(again, data);
    }
    if let Ok(r) = decode_ctl_reply(data) {
        let mut again = Vec::new();
        encode_ctl_reply(&r, &mut again);
        assert_eq!(again, data);
    }
    // Scans of another shard's front end: exact re-encoding.
    if let Ok(r) = decode_scan_request(data) {
        let mut again = Vec::new();
        encode_scan_request(&r, &mut again);
        assert_eq!(again, data);
    }
    if let Ok(r) = decode_scan_reply(data) {
        let mut again = Vec::new();
        encode_scan_reply(&r, &mut again);
        assert_eq!(again, data);
    }
}

fuzz_target!(|data: &[u8]| {
    peer_codecs(data);
    if data.len() < 2 {
        return;
    }
    let limits = Limits {
        line_max: (usize::from(data[0]) * 64).max(64),
        key_max: 250,
        item_size_max: usize::from(data[1]) * 16,
    };
    let stream = &data[2..];
    let whole = run(stream, &limits);
    // A prefix must give a prefix of the results (possibly minus the last decision).
    let cut = stream.len() / 2;
    let part = run(&stream[..cut], &limits);
    let n = part.len().saturating_sub(1);
    assert_eq!(&part[..n], &whole[..n.min(whole.len())]);
});

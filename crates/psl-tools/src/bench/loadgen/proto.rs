//! Requests and replies of the two protocols the load generator speaks, without I/O: the
//! memcached text protocol (`get`, `gets`, `set`, `cas`) and Redis's RESP2 (`GET`, `SET`,
//! `WATCH`, `MULTI`, `EXEC`). Encoders append to a buffer; [`parse_memcached`] and
//! [`parse_resp`] read one reply from the head of a buffer and say how many bytes it took, or
//! that more bytes are needed. Neither panics on any input (a property test feeds them
//! arbitrary bytes), and both bound what they accept.

use super::keys::{key_name, push_u64};

/// Longest reply line accepted (a `VALUE` line, a status, an error).
pub const LINE_BYTES_MAX: usize = 4096;
/// Largest value accepted in a reply.
pub const VALUE_BYTES_MAX: usize = 8 << 20;
/// Most elements of a RESP array.
const ARRAY_LEN_MAX: i64 = 1024;
/// Deepest nesting of RESP arrays.
const DEPTH_MAX: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// A line longer than [`LINE_BYTES_MAX`] without its end.
    LineTooLong,
    /// A reply that is neither of the protocol's shapes.
    Malformed(String),
    /// A value or array larger than the bounds.
    TooLarge,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::LineTooLong => write!(f, "reply line longer than {LINE_BYTES_MAX} bytes"),
            ParseError::Malformed(s) => write!(f, "malformed reply: {s}"),
            ParseError::TooLarge => write!(f, "reply larger than the load generator's bounds"),
        }
    }
}

/// One reply, reduced to what the load generator acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A value (memcached `VALUE`, RESP bulk string): its length and, from `gets`, its CAS unique.
    Value { len: usize, cas: Option<u64> },
    /// No such key (memcached `END` alone, RESP null bulk string).
    Miss,
    /// memcached `STORED`, RESP `+OK`.
    Stored,
    /// memcached `EXISTS` (a `cas` lost the race).
    Exists,
    /// memcached `NOT_FOUND`.
    NotFound,
    /// memcached `NOT_STORED`.
    NotStored,
    /// RESP `+QUEUED` (a command inside MULTI).
    Queued,
    /// RESP `*N` with its N elements (`EXEC` that ran: N results).
    Array(usize),
    /// RESP null array (`EXEC` aborted because a watched key changed).
    NullArray,
    /// RESP integer.
    Int(i64),
    /// Any other status line.
    Status(String),
    /// `ERROR`, `CLIENT_ERROR …`, `SERVER_ERROR …`, RESP `-…`.
    Error(String),
}

fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, ParseError> {
    match buf.windows(2).take(LINE_BYTES_MAX + 2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&buf[..i], i + 2))),
        None if buf.len() > LINE_BYTES_MAX + 1 => Err(ParseError::LineTooLong),
        None => Ok(None),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

fn num<T: std::str::FromStr>(b: Option<&[u8]>, what: &str, l: &[u8]) -> Result<T, ParseError> {
    b.and_then(|x| std::str::from_utf8(x).ok())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ParseError::Malformed(format!("{what} in {:?}", text(l))))
}

/// Appends `get KEY` (`gets` when `with_cas`).
pub fn mc_get(out: &mut Vec<u8>, key: u64, with_cas: bool) {
    out.extend_from_slice(if with_cas { b"gets " } else { b"get " });
    key_name(key, out);
    out.extend_from_slice(b"\r\n");
}

/// Appends `set KEY 0 0 LEN` and the value, or `cas … UNIQUE` when `cas` is given.
pub fn mc_store(out: &mut Vec<u8>, key: u64, value: &[u8], cas: Option<u64>) {
    out.extend_from_slice(if cas.is_some() { b"cas " } else { b"set " });
    key_name(key, out);
    out.extend_from_slice(b" 0 0 ");
    push_u64(out, value.len() as u64);
    if let Some(c) = cas {
        out.push(b' ');
        push_u64(out, c);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'$');
    push_u64(out, b.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

fn bulk_key(out: &mut Vec<u8>, key: u64) {
    let mut k = Vec::with_capacity(24);
    key_name(key, &mut k);
    bulk(out, &k);
}

/// Appends RESP `GET KEY`.
pub fn resp_get(out: &mut Vec<u8>, key: u64) {
    out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
    bulk_key(out, key);
}

/// Appends RESP `SET KEY VALUE`.
pub fn resp_set(out: &mut Vec<u8>, key: u64, value: &[u8]) {
    out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
    bulk_key(out, key);
    bulk(out, value);
}

/// Appends RESP `WATCH KEY` then `GET KEY` (the read half of a read-modify-write).
pub fn resp_watch_get(out: &mut Vec<u8>, key: u64) {
    out.extend_from_slice(b"*2\r\n$5\r\nWATCH\r\n");
    bulk_key(out, key);
    resp_get(out, key);
}

/// Appends RESP `MULTI`, `SET KEY VALUE`, `EXEC` (the write half: runs only if no other client
/// changed KEY since the WATCH).
pub fn resp_multi_set_exec(out: &mut Vec<u8>, key: u64, value: &[u8]) {
    out.extend_from_slice(b"*1\r\n$5\r\nMULTI\r\n");
    resp_set(out, key, value);
    out.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
}

/// Reads one memcached reply to a single-key `get`/`gets`, `set` or `cas` from the head of
/// `buf`: `Ok(None)` until the whole reply is there.
pub fn parse_memcached(buf: &[u8]) -> Result<Option<(Reply, usize)>, ParseError> {
    let Some((l, n)) = line(buf)? else { return Ok(None) };
    let r = match l {
        b"END" => Reply::Miss,
        b"STORED" => Reply::Stored,
        b"EXISTS" => Reply::Exists,
        b"NOT_FOUND" => Reply::NotFound,
        b"NOT_STORED" => Reply::NotStored,
        _ if l.starts_with(b"VALUE ") => {
            let mut f = l.split(|&b| b == b' ').skip(2);
            let _flags: u32 = num(f.next(), "flags", l)?;
            let len: usize = num(f.next(), "length", l)?;
            let cas: Option<u64> = match f.next() {
                Some(c) => Some(num(Some(c), "cas unique", l)?),
                None => None,
            };
            if f.next().is_some() {
                return Err(ParseError::Malformed(format!("extra fields in {:?}", text(l))));
            }
            if len > VALUE_BYTES_MAX {
                return Err(ParseError::TooLarge);
            }
            // data, CRLF, END CRLF
            let need = n + len + 2 + 5;
            if buf.len() < need {
                return Ok(None);
            }
            if &buf[n + len..n + len + 2] != b"\r\n" || &buf[n + len + 2..need] != b"END\r\n" {
                return Err(ParseError::Malformed("value not followed by CRLF END CRLF (multi-key reply?)".into()));
            }
            return Ok(Some((Reply::Value { len, cas }, need)));
        }
        _ if l == b"ERROR" || l.starts_with(b"CLIENT_ERROR") || l.starts_with(b"SERVER_ERROR") => Reply::Error(text(l)),
        _ => return Err(ParseError::Malformed(format!("unexpected line {:?}", text(l)))),
    };
    Ok(Some((r, n)))
}

/// Reads one RESP2 reply from the head of `buf`: `Ok(None)` until the whole reply is there.
pub fn parse_resp(buf: &[u8]) -> Result<Option<(Reply, usize)>, ParseError> {
    resp_at(buf, 0)
}

fn resp_at(buf: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, ParseError> {
    if depth > DEPTH_MAX {
        return Err(ParseError::TooLarge);
    }
    let Some((l, n)) = line(buf)? else { return Ok(None) };
    let Some((&kind, rest)) = l.split_first() else {
        return Err(ParseError::Malformed("empty line".into()));
    };
    let r = match kind {
        b'+' => match rest {
            b"OK" => Reply::Stored,
            b"QUEUED" => Reply::Queued,
            _ => Reply::Status(text(rest)),
        },
        b'-' => Reply::Error(text(rest)),
        b':' => Reply::Int(num(Some(rest), "integer", l)?),
        b'$' => {
            let len: i64 = num(Some(rest), "bulk length", l)?;
            if len < 0 {
                return Ok(Some((Reply::Miss, n)));
            }
            let len = len as usize;
            if len > VALUE_BYTES_MAX {
                return Err(ParseError::TooLarge);
            }
            let need = n + len + 2;
            if buf.len() < need {
                return Ok(None);
            }
            if &buf[n + len..need] != b"\r\n" {
                return Err(ParseError::Malformed("bulk string not followed by CRLF".into()));
            }
            return Ok(Some((Reply::Value { len, cas: None }, need)));
        }
        b'*' => {
            let count: i64 = num(Some(rest), "array length", l)?;
            if count < 0 {
                return Ok(Some((Reply::NullArray, n)));
            }
            if count > ARRAY_LEN_MAX {
                return Err(ParseError::TooLarge);
            }
            let mut at = n;
            for _ in 0..count {
                match resp_at(&buf[at..], depth + 1)? {
                    Some((_, used)) => at += used,
                    None => return Ok(None),
                }
            }
            return Ok(Some((Reply::Array(count as usize), at)));
        }
        _ => return Err(ParseError::Malformed(format!("unknown RESP type in {:?}", text(l)))),
    };
    Ok(Some((r, n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn memcached_replies() {
        assert_eq!(parse_memcached(b"STORED\r\n").unwrap(), Some((Reply::Stored, 8)));
        assert_eq!(parse_memcached(b"END\r\nSTORED").unwrap(), Some((Reply::Miss, 5)));
        assert_eq!(parse_memcached(b"STOR").unwrap(), None);
        let v = b"VALUE user1 0 3 77\r\nabc\r\nEND\r\n";
        assert_eq!(parse_memcached(v).unwrap(), Some((Reply::Value { len: 3, cas: Some(77) }, v.len())));
        for cut in 0..v.len() {
            assert_eq!(parse_memcached(&v[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(matches!(parse_memcached(b"SERVER_ERROR out of memory\r\n").unwrap(), Some((Reply::Error(_), _))));
        assert!(parse_memcached(b"VALUE k 0 3\r\nabcXXEND\r\n").is_err());
        assert!(parse_memcached(b"WHAT\r\n").is_err());
        assert_eq!(parse_memcached(&vec![b'x'; LINE_BYTES_MAX + 10]), Err(ParseError::LineTooLong));
    }

    #[test]
    fn resp_replies() {
        assert_eq!(parse_resp(b"+OK\r\n").unwrap(), Some((Reply::Stored, 5)));
        assert_eq!(parse_resp(b"$-1\r\n").unwrap(), Some((Reply::Miss, 5)));
        assert_eq!(parse_resp(b"$3\r\nabc\r\n").unwrap(), Some((Reply::Value { len: 3, cas: None }, 9)));
        assert_eq!(parse_resp(b"*-1\r\n").unwrap(), Some((Reply::NullArray, 5)));
        let exec = b"*1\r\n+OK\r\n";
        assert_eq!(parse_resp(exec).unwrap(), Some((Reply::Array(1), exec.len())));
        assert_eq!(parse_resp(&exec[..6]).unwrap(), None);
        assert!(matches!(parse_resp(b"-ERR wrong\r\n").unwrap(), Some((Reply::Error(_), _))));
        assert!(parse_resp(b"?\r\n").is_err());
        let deep = b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n";
        assert_eq!(parse_resp(deep), Err(ParseError::TooLarge));
    }

    #[test]
    fn requests_are_well_formed() {
        let mut o = Vec::new();
        mc_store(&mut o, 1, b"xyz", Some(5));
        let s = String::from_utf8(o).unwrap();
        assert!(s.starts_with("cas user") && s.ends_with(" 0 0 3 5\r\nxyz\r\n"), "{s}");
        let mut o = Vec::new();
        resp_multi_set_exec(&mut o, 1, b"v");
        // Four replies expected for WATCH+GET then MULTI+SET+EXEC: the encodings parse as arrays.
        let mut at = 0;
        let mut n = 0;
        while at < o.len() {
            let (r, used) = parse_resp(&o[at..]).unwrap().unwrap();
            assert!(matches!(r, Reply::Array(_)));
            at += used;
            n += 1;
        }
        assert_eq!(n, 3);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_memcached(&bytes);
            let _ = parse_resp(&bytes);
        }

        #[test]
        fn a_reply_parses_the_same_however_it_arrives(len in 0usize..300, cas in any::<u64>(), cut in 0usize..400) {
            let mut r = format!("VALUE user9 0 {len} {cas}\r\n").into_bytes();
            r.extend(std::iter::repeat_n(b'v', len));
            r.extend_from_slice(b"\r\nEND\r\n");
            let cut = cut.min(r.len());
            if cut < r.len() {
                prop_assert_eq!(parse_memcached(&r[..cut]).unwrap(), None);
            }
            prop_assert_eq!(parse_memcached(&r).unwrap(), Some((Reply::Value { len, cas: Some(cas) }, r.len())));
        }
    }
}

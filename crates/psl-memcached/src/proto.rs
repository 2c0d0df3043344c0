//! The memcached text and meta protocol parser: pure, bounded, never panics.
//!
//! [`parse`] looks at the front of a connection's input buffer and returns one of:
//! - [`Parsed::Incomplete`]: more bytes are needed (the line, or the data block of a storage
//!   command, has not fully arrived); the caller reads more, up to [`Limits::line_max`] bytes
//!   of line plus one data block of at most [`Limits::item_size_max`] bytes;
//! - [`Parsed::Cmd`]: one command, borrowing keys and data from the buffer, and how many bytes
//!   it used;
//! - [`Parsed::Error`]: the exact error reply memcached 1.6 gives, how many bytes to drop, and
//!   how many bytes of an oversized data block to skip after them (`swallow`);
//! - [`Parsed::Close`]: a line longer than the limit: reply and close the connection.
//!
//! Lines end with `\n` (a preceding `\r` is dropped), tokens are separated by spaces, command
//! names are case-sensitive, keys are 1 to 250 bytes without spaces or newlines. Numbers are
//! strict decimal: `u32` flags, `u64` deltas and CAS values, `i64` expiry times.

/// Bounds the parser enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest command line, `\r\n` included.
    pub line_max: usize,
    /// Longest key (memcached: 250).
    pub key_max: usize,
    /// Largest data block a storage command may carry.
    pub item_size_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { line_max: 64 * 1024, key_max: 250, item_size_max: 1024 * 1024 }
    }
}

/// Which storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if the key has no live item.
    Add,
    /// `replace`: store only if the key has a live item.
    Replace,
    /// `append`: add the data after a live item's data (flags and expiry kept).
    Append,
    /// `prepend`: add the data before a live item's data (flags and expiry kept).
    Prepend,
    /// `cas`: store only if the item's CAS unique is the one given.
    Cas,
}

/// A list of keys separated by spaces, as it appeared on the line (validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a>(&'a [u8]);

impl<'a> Keys<'a> {
    /// The keys in the order given (empty tokens from repeated spaces skipped).
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.split(|b| *b == b' ').filter(|t| !t.is_empty())
    }
}

/// One parsed command. Keys and data borrow the input buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `get`/`gets` (`touch: None`), `gat`/`gats` (`touch: Some(exptime)`).
    Get {
        /// The keys to read (at least one, each valid).
        keys: Keys<'a>,
        /// Return CAS uniques in the `VALUE` lines (`gets`, `gats`).
        cas: bool,
        /// The new exptime of `gat`/`gats`; `None` for `get`/`gets`.
        touch: Option<i64>,
    },
    /// `set`, `add`, `replace`, `append`, `prepend` or `cas`, with its data block.
    Store {
        /// Which storage command.
        mode: StoreMode,
        /// The item's key.
        key: &'a [u8],
        /// The client's opaque 32-bit flags.
        flags: u32,
        /// memcached exptime: 0 never, negative expired, up to 30 days relative seconds,
        /// above an absolute Unix time.
        exptime: i64,
        /// The unique to compare for `cas`; 0 for every other mode.
        cas: u64,
        /// The data block, without its trailing `\r\n`.
        data: &'a [u8],
        /// Send no reply.
        noreply: bool,
    },
    /// `delete <key> [0] [noreply]`.
    Delete {
        /// The key to delete.
        key: &'a [u8],
        /// Send no reply.
        noreply: bool,
    },
    /// `incr` or `decr <key> <delta> [noreply]`.
    Arith {
        /// `incr` when true, `decr` when false.
        incr: bool,
        /// The counter's key.
        key: &'a [u8],
        /// The amount to add or subtract.
        delta: u64,
        /// Send no reply.
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`: a new expiry, same data and CAS unique.
    Touch {
        /// The item's key.
        key: &'a [u8],
        /// The new memcached exptime.
        exptime: i64,
        /// Send no reply.
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`.
    FlushAll {
        /// Seconds (or an absolute Unix time, as an exptime) until items stored before then
        /// read as missing; 0 or less: at once.
        delay: i64,
        /// Send no reply.
        noreply: bool,
    },
    /// `stats` with its (possibly empty) argument.
    Stats {
        /// The rest of the line, trimmed: empty (general counters), `settings`, `reset`, or
        /// another group name (`items`, `slabs`, `sizes`, `conns` answer just `END`).
        arg: &'a [u8],
    },
    /// `version`: replies `VERSION` and the implemented memcached version.
    Version,
    /// `verbosity <level> [noreply]`: accepted and ignored (replies `OK`).
    Verbosity {
        /// Send no reply.
        noreply: bool,
    },
    /// `quit`: close the connection.
    Quit,
    /// `mg <key> <flags>*`: meta get.
    MetaGet {
        /// The item's key.
        key: &'a [u8],
        /// The meta flags, in request order.
        flags: MetaFlags<'a>,
    },
    /// `ms <key> <datalen> <flags>*` and its data block: meta set.
    MetaSet {
        /// The item's key.
        key: &'a [u8],
        /// The data block, without its trailing `\r\n`.
        data: &'a [u8],
        /// The meta flags, in request order.
        flags: MetaFlags<'a>,
    },
    /// `md <key> <flags>*`: meta delete.
    MetaDelete {
        /// The item's key.
        key: &'a [u8],
        /// The meta flags, in request order.
        flags: MetaFlags<'a>,
    },
    /// `ma <key> <flags>*`: meta arithmetic (increment or decrement).
    MetaArith {
        /// The counter's key.
        key: &'a [u8],
        /// The meta flags, in request order.
        flags: MetaFlags<'a>,
    },
    /// `mn`: meta no-op, replies `MN` (marks the end of a pipeline of quiet commands).
    MetaNoop,
}

impl<'a> Command<'a> {
    /// The key of a command on one key (`None` for `get`-family commands, which name a list,
    /// and for commands without a key).
    pub fn key(&self) -> Option<&'a [u8]> {
        match self {
            Command::Store { key, .. }
            | Command::Delete { key, .. }
            | Command::Arith { key, .. }
            | Command::Touch { key, .. }
            | Command::MetaGet { key, .. }
            | Command::MetaSet { key, .. }
            | Command::MetaDelete { key, .. }
            | Command::MetaArith { key, .. } => Some(key),
            Command::Get { .. }
            | Command::FlushAll { .. }
            | Command::Stats { .. }
            | Command::Version
            | Command::Verbosity { .. }
            | Command::Quit
            | Command::MetaNoop => None,
        }
    }
}

/// `ms` modes (`M` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaSetMode {
    /// `MS` (the default): store unconditionally.
    Set,
    /// `ME`: store only if the key has no live item.
    Add,
    /// `MR`: store only if the key has a live item.
    Replace,
    /// `MA`: append to a live item's data.
    Append,
    /// `MP`: prepend to a live item's data.
    Prepend,
}

/// The flags of a meta command. `raw` keeps them in request order, so that a reply can echo
/// the return flags (`k`, `O`, `c`, `f`, `s`, `t`, `b`) in the order the client asked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaFlags<'a> {
    /// The flag tokens as they appeared on the line (trimmed), read by [`MetaFlags::tokens`].
    pub raw: &'a [u8],
    /// `q`: quiet mode (suppress the common reply: `EN` for mg, `HD` for ms/md/ma).
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `O<token>`: opaque, echoed.
    pub opaque: Option<&'a [u8]>,
    /// `T<ttl>`: set (ms, ma on create) or update (mg, ma) the expiry.
    pub ttl: Option<i64>,
    /// `N<ttl>`: mg / ma: create the item on a miss with this expiry.
    pub vivify: Option<i64>,
    /// `F<flags>`: ms: client flags.
    pub client_flags: Option<u32>,
    /// `C<cas>`: ms, md, ma: compare this CAS value.
    pub compare_cas: Option<u64>,
    /// `I`: ms, md: invalidate (accepted; treated like a plain set / delete).
    pub invalidate: bool,
    /// `M<mode>` of ms.
    pub set_mode: Option<MetaSetMode>,
    /// `M<mode>` of ma: true = increment (default), false = decrement.
    pub incr: bool,
    /// `J<initial>`: ma: initial value on auto-create.
    pub initial: Option<u64>,
    /// `D<delta>`: ma: delta (default 1).
    pub delta: Option<u64>,
}

impl<'a> MetaFlags<'a> {
    /// The flag tokens in request order: (flag byte, token after it).
    pub fn tokens(&self) -> impl Iterator<Item = (u8, &'a [u8])> + 'a {
        self.raw.split(|b| *b == b' ').filter(|t| !t.is_empty()).map(|t| (t[0], &t[1..]))
    }
}

/// What [`parse`] found at the front of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// The line or the data block has not fully arrived: read more and parse again.
    Incomplete,
    /// A complete command.
    Cmd {
        /// The command, borrowing the buffer.
        cmd: Command<'a>,
        /// Bytes it took from the front of the buffer (line and data block).
        used: usize,
    },
    /// Reply `reply` (one line, `\r\n` not included), drop `used` bytes, then skip `swallow`
    /// more bytes (an oversized data block and its `\r\n`), which may not have arrived yet.
    Error {
        /// The error line memcached sends.
        reply: &'static str,
        /// Bytes to drop from the front of the buffer.
        used: usize,
        /// Bytes to skip after those, as they arrive.
        swallow: usize,
    },
    /// Reply and close the connection.
    Close {
        /// The error line to send before closing.
        reply: &'static str,
    },
}

/// Unknown command, or too few arguments (also the reply to an unknown `stats` argument).
pub const ERROR: &str = "ERROR";
/// A malformed command line: invalid key, or a non-numeric flags, exptime, length or unique.
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// A data block not followed by `\r\n` where its declared length ends.
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
/// A data block above `item_size_max`, or an item that grows past the size limit.
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
/// A command line of `line_max` bytes or more without a newline; the connection is closed.
pub const LINE_TOO_LONG: &str = "CLIENT_ERROR line too long";
/// An exptime (of `gat`, `gats`, `touch`) or `flush_all` delay that is not a decimal i64.
pub const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
/// An `incr`/`decr` delta that is not a decimal u64.
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
/// `incr`/`decr` of an item whose data is not a decimal u64.
pub const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";
/// `delete` with arguments other than a legacy `0` and `noreply`.
pub const DELETE_USAGE: &str = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";
/// A meta flag that is not a letter or not allowed for the command.
pub const INVALID_FLAG: &str = "CLIENT_ERROR invalid flag";
/// A meta flag's numeric token (`T`, `N`, `F`, `C`, `J`, `D`) that does not parse.
pub const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format";
/// An `ms` mode (`M` flag) other than `S`, `E`, `R`, `A`, `P`.
pub const BAD_MS_MODE: &str = "CLIENT_ERROR invalid mode for ms M token";
/// An `ma` mode (`M` flag) other than `I`, `+`, `D`, `-`.
pub const BAD_MA_MODE: &str = "CLIENT_ERROR invalid mode for ma M token";

/// At most this many tokens are looked at on a line other than a key list.
const TOKENS_MAX: usize = 24;

/// Parses the command at the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let scan = buf.len().min(limits.line_max);
    let Some(nl) = buf[..scan].iter().position(|b| *b == b'\n') else {
        return if buf.len() >= limits.line_max { Parsed::Close { reply: LINE_TOO_LONG } } else { Parsed::Incomplete };
    };
    let line_used = nl + 1;
    let mut line = &buf[..nl];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    let err = |reply: &'static str| Parsed::Error { reply, used: line_used, swallow: 0 };
    let (name, rest) = split_first_token(line);
    let cmd = match name {
        b"get" => return parse_get(rest, false, None, line_used, limits),
        b"gets" => return parse_get(rest, true, None, line_used, limits),
        b"gat" | b"gats" => {
            let (t, keys) = split_first_token(rest);
            let Some(exptime) = parse_i64(t) else { return err(BAD_EXPTIME) };
            return parse_get(keys, name == b"gats", Some(exptime), line_used, limits);
        }
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            return parse_store(name, rest, buf, line_used, limits)
        }
        b"ms" => return parse_meta_set(rest, buf, line_used, limits),
        _ => {
            let mut toks = [&[][..]; TOKENS_MAX];
            let n = tokenize(rest, &mut toks);
            let toks = &toks[..n];
            match parse_simple(name, toks, rest, limits) {
                Ok(cmd) => cmd,
                Err(reply) => return err(reply),
            }
        }
    };
    Parsed::Cmd { cmd, used: line_used }
}

fn parse_simple<'a>(
    name: &[u8],
    toks: &[&'a [u8]],
    rest: &'a [u8],
    limits: &Limits,
) -> Result<Command<'a>, &'static str> {
    let noreply_last = toks.last().is_some_and(|t| *t == b"noreply");
    Ok(match name {
        b"delete" => {
            // `delete <key> [0] [noreply]`: a legacy zero time is accepted.
            let key = key_at(toks, 0, limits).ok_or(BAD_FORMAT)?;
            let noreply = toks.len() > 1 && noreply_last;
            let extra = &toks[1..toks.len() - usize::from(noreply)];
            if extra.len() > 1 || extra.first().is_some_and(|t| *t != b"0") {
                return Err(DELETE_USAGE);
            }
            Command::Delete { key, noreply }
        }
        b"incr" | b"decr" => {
            if toks.len() < 2 {
                return Err(ERROR);
            }
            let key = key_at(toks, 0, limits).ok_or(BAD_FORMAT)?;
            let delta = parse_u64(toks[1]).ok_or(BAD_DELTA)?;
            Command::Arith { incr: name == b"incr", key, delta, noreply: noreply_last }
        }
        b"touch" => {
            if toks.len() < 2 {
                return Err(ERROR);
            }
            let key = key_at(toks, 0, limits).ok_or(BAD_FORMAT)?;
            let exptime = parse_i64(toks[1]).ok_or(BAD_EXPTIME)?;
            Command::Touch { key, exptime, noreply: noreply_last }
        }
        b"flush_all" => {
            let args = &toks[..toks.len() - usize::from(noreply_last)];
            let delay = match args {
                [] => 0,
                [d] => parse_i64(d).ok_or(BAD_EXPTIME)?,
                _ => return Err(ERROR),
            };
            Command::FlushAll { delay, noreply: noreply_last }
        }
        b"stats" => Command::Stats { arg: trim(rest) },
        b"version" => Command::Version,
        b"verbosity" => {
            // `verbosity <level> [noreply]`: one or two arguments (memcached ignores the level).
            if toks.is_empty() || toks.len() > 2 {
                return Err(ERROR);
            }
            Command::Verbosity { noreply: noreply_last }
        }
        b"quit" => Command::Quit,
        b"mn" => Command::MetaNoop,
        b"mg" | b"md" | b"ma" => {
            if toks.is_empty() {
                return Err(ERROR);
            }
            let key = key_at(toks, 0, limits).ok_or(BAD_FORMAT)?;
            let flags = parse_meta_flags(name, rest_after_first(rest))?;
            match name {
                b"mg" => Command::MetaGet { key, flags },
                b"md" => Command::MetaDelete { key, flags },
                _ => Command::MetaArith { key, flags },
            }
        }
        _ => return Err(ERROR),
    })
}

fn parse_get<'a>(rest: &'a [u8], cas: bool, touch: Option<i64>, used: usize, limits: &Limits) -> Parsed<'a> {
    let keys = trim(rest);
    let mut any = false;
    for k in keys.split(|b| *b == b' ').filter(|t| !t.is_empty()) {
        if !valid_key(k, limits) {
            return Parsed::Error { reply: BAD_FORMAT, used, swallow: 0 };
        }
        any = true;
    }
    if !any {
        return Parsed::Error { reply: ERROR, used, swallow: 0 };
    }
    Parsed::Cmd { cmd: Command::Get { keys: Keys(keys), cas, touch }, used }
}

fn parse_store<'a>(name: &[u8], rest: &'a [u8], buf: &'a [u8], used: usize, limits: &Limits) -> Parsed<'a> {
    let mut toks = [&[][..]; TOKENS_MAX];
    let n = tokenize(rest, &mut toks);
    let toks = &toks[..n];
    let err = |reply| Parsed::Error { reply, used, swallow: 0 };
    let mode = match name {
        b"set" => StoreMode::Set,
        b"add" => StoreMode::Add,
        b"replace" => StoreMode::Replace,
        b"append" => StoreMode::Append,
        b"prepend" => StoreMode::Prepend,
        _ => StoreMode::Cas,
    };
    let need = if mode == StoreMode::Cas { 5 } else { 4 };
    if toks.len() < need {
        return err(ERROR);
    }
    let Some(key) = key_at(toks, 0, limits) else { return err(BAD_FORMAT) };
    let (Some(flags), Some(exptime), Some(bytes)) = (parse_u32(toks[1]), parse_i64(toks[2]), parse_u64(toks[3])) else {
        return err(BAD_FORMAT);
    };
    let cas = if mode == StoreMode::Cas {
        match parse_u64(toks[4]) {
            Some(c) => c,
            None => return err(BAD_FORMAT),
        }
    } else {
        0
    };
    let noreply = toks.len() > need && toks[toks.len() - 1] == b"noreply";
    data_block(buf, used, bytes, limits, |data| Command::Store { mode, key, flags, exptime, cas, data, noreply })
}

fn parse_meta_set<'a>(rest: &'a [u8], buf: &'a [u8], used: usize, limits: &Limits) -> Parsed<'a> {
    let err = |reply| Parsed::Error { reply, used, swallow: 0 };
    let mut toks = [&[][..]; 2];
    let n = tokenize(rest, &mut toks);
    if n == 0 {
        return err(ERROR);
    }
    let Some(key) = key_at(&toks[..n], 0, limits) else { return err(BAD_FORMAT) };
    if n < 2 {
        return err(BAD_FORMAT);
    }
    let Some(bytes) = parse_u64(toks[1]) else { return err(BAD_FORMAT) };
    let flags_raw = rest_after_first(rest_after_first(rest));
    let flags = match parse_meta_flags(b"ms", flags_raw) {
        Ok(f) => f,
        Err(reply) => {
            // The data block follows a well-formed length: skip it with the error.
            return Parsed::Error {
                reply,
                used,
                swallow: usize::try_from(bytes).unwrap_or(usize::MAX).saturating_add(2),
            };
        }
    };
    data_block(buf, used, bytes, limits, |data| Command::MetaSet { key, data, flags })
}

/// The data block of a storage command after a line of `used` bytes.
fn data_block<'a>(
    buf: &'a [u8],
    used: usize,
    bytes: u64,
    limits: &Limits,
    make: impl FnOnce(&'a [u8]) -> Command<'a>,
) -> Parsed<'a> {
    if bytes > limits.item_size_max as u64 {
        let swallow = usize::try_from(bytes).unwrap_or(usize::MAX).saturating_add(2);
        return Parsed::Error { reply: TOO_LARGE, used, swallow };
    }
    let bytes = bytes as usize;
    let end = used + bytes;
    if buf.len() < end + 2 {
        return Parsed::Incomplete;
    }
    if &buf[end..end + 2] != b"\r\n" {
        // memcached consumes the block and its two trailing bytes, then answers bad chunk.
        return Parsed::Error { reply: BAD_CHUNK, used: end + 2, swallow: 0 };
    }
    Parsed::Cmd { cmd: make(&buf[used..end]), used: end + 2 }
}

fn parse_meta_flags<'a>(cmd: &[u8], raw: &'a [u8]) -> Result<MetaFlags<'a>, &'static str> {
    let raw = trim(raw);
    let mut f = MetaFlags { raw, incr: true, ..MetaFlags::default() };
    let mut seen = [false; 128];
    for (n, t) in raw.split(|b| *b == b' ').filter(|t| !t.is_empty()).enumerate() {
        if n >= TOKENS_MAX {
            return Err(BAD_FORMAT);
        }
        let (c, tok) = (t[0], &t[1..]);
        if c >= 128 || !c.is_ascii_alphabetic() {
            return Err(INVALID_FLAG);
        }
        if seen[c as usize] {
            return Err("CLIENT_ERROR duplicate flag");
        }
        seen[c as usize] = true;
        let allowed: &[u8] = match cmd {
            b"mg" => b"bcfhklOqstuvENTR",
            b"ms" => b"bcfIkOqsSTCFM",
            b"md" => b"bIkOqTCx",
            _ => b"bcktOqvNJDTCM",
        };
        if !allowed.contains(&c) {
            return Err(INVALID_FLAG);
        }
        match c {
            b'b' => return Err("CLIENT_ERROR base64 keys are not supported"),
            b'q' => f.quiet = true,
            b'v' => f.value = true,
            b'I' => f.invalidate = true,
            b'O' => {
                if tok.len() > 32 {
                    return Err("CLIENT_ERROR opaque token too long");
                }
                f.opaque = Some(tok)
            }
            b'T' => f.ttl = Some(parse_i64(tok).ok_or(BAD_TOKEN)?),
            b'N' => f.vivify = Some(parse_i64(tok).ok_or(BAD_TOKEN)?),
            b'F' => f.client_flags = Some(parse_u32(tok).ok_or(BAD_TOKEN)?),
            b'C' => f.compare_cas = Some(parse_u64(tok).ok_or(BAD_TOKEN)?),
            b'J' => f.initial = Some(parse_u64(tok).ok_or(BAD_TOKEN)?),
            b'D' => f.delta = Some(parse_u64(tok).ok_or(BAD_TOKEN)?),
            b'M' if cmd == b"ms" => {
                f.set_mode = Some(match tok {
                    [b'S' | b's'] => MetaSetMode::Set,
                    [b'E' | b'e'] => MetaSetMode::Add,
                    [b'R' | b'r'] => MetaSetMode::Replace,
                    [b'A' | b'a'] => MetaSetMode::Append,
                    [b'P' | b'p'] => MetaSetMode::Prepend,
                    _ => return Err(BAD_MS_MODE),
                })
            }
            b'M' => {
                f.incr = match tok {
                    [b'I' | b'i' | b'+'] => true,
                    [b'D' | b'd' | b'-'] => false,
                    _ => return Err(BAD_MA_MODE),
                }
            }
            _ => {}
        }
    }
    Ok(f)
}

fn key_at<'a>(toks: &[&'a [u8]], i: usize, limits: &Limits) -> Option<&'a [u8]> {
    toks.get(i).copied().filter(|k| valid_key(k, limits))
}

/// 1 to `key_max` bytes, no space or newline. Like memcached, other control characters are
/// accepted (load generators such as memcaslap put them in keys).
pub fn valid_key(k: &[u8], limits: &Limits) -> bool {
    !k.is_empty() && k.len() <= limits.key_max && !k.iter().any(|b| *b == b' ' || *b == b'\n')
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| *b != b' ').unwrap_or(s.len());
    let end = s.iter().rposition(|b| *b != b' ').map_or(start, |e| e + 1);
    &s[start..end.max(start)]
}

fn split_first_token(s: &[u8]) -> (&[u8], &[u8]) {
    let s = &s[s.iter().position(|b| *b != b' ').unwrap_or(s.len())..];
    match s.iter().position(|b| *b == b' ') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, &[]),
    }
}

fn rest_after_first(s: &[u8]) -> &[u8] {
    split_first_token(s).1
}

/// Splits on spaces into `out`; returns how many tokens were stored (extra tokens are dropped).
fn tokenize<'a>(s: &'a [u8], out: &mut [&'a [u8]]) -> usize {
    let mut n = 0;
    for t in s.split(|b| *b == b' ').filter(|t| !t.is_empty()) {
        if n == out.len() {
            break;
        }
        out[n] = t;
        n += 1;
    }
    n
}

/// Strict unsigned decimal (1 to 20 digits, no sign), no overflow.
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

/// Strict unsigned decimal that fits in 32 bits (client flags).
pub fn parse_u32(s: &[u8]) -> Option<u32> {
    parse_u64(s).and_then(|v| u32::try_from(v).ok())
}

/// Signed decimal with an optional leading `-`.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    match s {
        [b'-', rest @ ..] => parse_u64(rest).and_then(|v| i64::try_from(v).ok()).map(|v| -v),
        _ => parse_u64(s).and_then(|v| i64::try_from(v).ok()),
    }
}

/// The numeric value of an item for incr/decr: optional leading spaces (memcached pads
/// decremented values), then decimal digits, optional trailing spaces; at most 20 digits.
pub fn parse_counter(s: &[u8]) -> Option<u64> {
    parse_u64(trim(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[u8]) -> Parsed<'_> {
        parse(s, &Limits::default())
    }

    fn cmd(s: &[u8]) -> Command<'_> {
        match p(s) {
            Parsed::Cmd { cmd, used } => {
                assert_eq!(used, s.len(), "{:?}", String::from_utf8_lossy(s));
                cmd
            }
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(s)),
        }
    }

    fn err(s: &[u8]) -> &'static str {
        match p(s) {
            Parsed::Error { reply, .. } | Parsed::Close { reply } => reply,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(s)),
        }
    }

    #[test]
    fn storage_commands() {
        assert_eq!(
            cmd(b"set k 5 10 2\r\nhi\r\n"),
            Command::Store {
                mode: StoreMode::Set,
                key: b"k",
                flags: 5,
                exptime: 10,
                cas: 0,
                data: b"hi",
                noreply: false
            }
        );
        assert!(matches!(
            cmd(b"cas k 0 -1 0 77 noreply\r\n\r\n"),
            Command::Store { mode: StoreMode::Cas, cas: 77, exptime: -1, noreply: true, .. }
        ));
        assert!(matches!(cmd(b"append k 0 0 1\nx\r\n"), Command::Store { mode: StoreMode::Append, .. }));
        assert_eq!(p(b"set k 0 0 2\r\nh"), Parsed::Incomplete);
        assert_eq!(p(b"set k 0 0"), Parsed::Incomplete);
        assert_eq!(p(b"set k 0 0 2\r\nhiX\r\n"), Parsed::Error { reply: BAD_CHUNK, used: 17, swallow: 0 });
        assert_eq!(err(b"set k 0 0 abc\r\n"), BAD_FORMAT);
        assert_eq!(err(b"set k 0 0 -1\r\n"), BAD_FORMAT);
        assert_eq!(err(b"set k 4294967296 0 1\r\n"), BAD_FORMAT);
        assert_eq!(err(b"set k 0\r\n"), ERROR);
        assert_eq!(err(b"cas k 0 0 1\r\n"), ERROR);
        let long = format!("set {} 0 0 1\r\nx\r\n", "k".repeat(251));
        assert_eq!(err(long.as_bytes()), BAD_FORMAT);
        assert_eq!(p(b"set k 0 0 2000000\r\n"), Parsed::Error { reply: TOO_LARGE, used: 19, swallow: 2_000_002 });
    }

    #[test]
    fn retrieval_and_others() {
        match cmd(b"gets a  bb c\r\n") {
            Command::Get { keys, cas: true, touch: None } => {
                assert_eq!(keys.iter().collect::<Vec<_>>(), vec![&b"a"[..], b"bb", b"c"])
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(cmd(b"gat 10 a\r\n"), Command::Get { touch: Some(10), cas: false, .. }));
        assert_eq!(err(b"gat x a\r\n"), BAD_EXPTIME);
        assert_eq!(err(b"get\r\n"), ERROR);
        assert_eq!(err(b"\r\n"), ERROR);
        assert_eq!(err(b"GET a\r\n"), ERROR);
        assert_eq!(cmd(b"delete a 0\r\n"), Command::Delete { key: b"a", noreply: false });
        assert_eq!(cmd(b"delete a noreply\r\n"), Command::Delete { key: b"a", noreply: true });
        assert_eq!(err(b"delete a 5\r\n"), DELETE_USAGE);
        // Found by the fuzzer: a key named like the option.
        assert_eq!(cmd(b"delete noreply\r\n"), Command::Delete { key: b"noreply", noreply: false });
        assert_eq!(
            cmd(b"incr a 18446744073709551615\r\n"),
            Command::Arith { incr: true, key: b"a", delta: u64::MAX, noreply: false }
        );
        assert_eq!(err(b"incr a abc\r\n"), BAD_DELTA);
        assert_eq!(err(b"incr a\r\n"), ERROR);
        assert_eq!(err(b"touch a x\r\n"), BAD_EXPTIME);
        assert_eq!(cmd(b"flush_all 10 noreply\r\n"), Command::FlushAll { delay: 10, noreply: true });
        assert_eq!(err(b"flush_all abc\r\n"), BAD_EXPTIME);
        assert_eq!(err(b"verbosity\r\n"), ERROR);
        assert_eq!(cmd(b"verbosity 1 noreply\r\n"), Command::Verbosity { noreply: true });
        assert_eq!(err(b"verbosity foo bar my\r\n"), ERROR);
        assert_eq!(cmd(b"stats  settings \r\n"), Command::Stats { arg: b"settings" });
        assert_eq!(p(&vec![b'g'; 70_000]), Parsed::Close { reply: LINE_TOO_LONG });
    }

    #[test]
    fn meta_commands() {
        match cmd(b"mg k v f c t s k O123 q\r\n") {
            Command::MetaGet { key, flags } => {
                assert_eq!(key, b"k");
                assert!(flags.value && flags.quiet);
                assert_eq!(flags.opaque, Some(&b"123"[..]));
                assert_eq!(flags.tokens().map(|(c, _)| c).collect::<Vec<_>>(), b"vfctskOq".to_vec());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            cmd(b"ms k 2 T10 F7 MA C9\r\nhi\r\n"),
            Command::MetaSet {
                data: b"hi",
                flags: MetaFlags {
                    ttl: Some(10),
                    client_flags: Some(7),
                    set_mode: Some(MetaSetMode::Append),
                    compare_cas: Some(9),
                    ..
                },
                ..
            }
        ));
        assert_eq!(err(b"ms k 2 MZ\r\nhi\r\n"), BAD_MS_MODE);
        assert_eq!(p(b"ms k 2 MZ\r\nhi\r\n"), Parsed::Error { reply: BAD_MS_MODE, used: 11, swallow: 4 });
        assert_eq!(err(b"ms k S2\r\nhi\r\n"), BAD_FORMAT);
        assert_eq!(err(b"ms k\r\n"), BAD_FORMAT);
        assert_eq!(err(b"mg\r\n"), ERROR);
        assert_eq!(err(b"mg a zz\r\n"), INVALID_FLAG);
        assert_eq!(err(b"mg a Tabc\r\n"), BAD_TOKEN);
        assert!(matches!(
            cmd(b"ma k N0 J10 D5 MD v\r\n"),
            Command::MetaArith {
                flags: MetaFlags { vivify: Some(0), initial: Some(10), delta: Some(5), incr: false, value: true, .. },
                ..
            }
        ));
        assert!(matches!(
            cmd(b"md k q C5\r\n"),
            Command::MetaDelete { flags: MetaFlags { quiet: true, compare_cas: Some(5), .. }, .. }
        ));
        assert_eq!(cmd(b"mn\r\n"), Command::MetaNoop);
    }

    #[test]
    fn never_panics_on_prefixes_and_garbage() {
        let samples: &[&[u8]] = &[
            b"set k 0 0 5\r\nhello\r\nget k\r\n",
            b"ms k 3 T1 F2 MS\r\nabc\r\nmg k v\r\n",
            b"cas k 1 2 3 4 noreply\r\nabc\r\n",
            b"\xff\xfe\r\n\r\n \r\n",
            b"ma k N5 J1 D99999999999999999999999 v\r\n",
        ];
        for s in samples {
            for i in 0..=s.len() {
                let _ = p(&s[..i]);
            }
        }
        let mut x: u64 = 1;
        for _ in 0..20_000 {
            let mut v = Vec::new();
            for _ in 0..(x % 40) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let alphabet = b"setgmcadsnv 0123\r\n-kqTCNMF";
                v.push(alphabet[(x >> 33) as usize % alphabet.len()]);
            }
            let _ = p(&v);
        }
    }

    #[test]
    fn counters() {
        assert_eq!(parse_counter(b" 12 "), Some(12));
        assert_eq!(parse_counter(b"-1"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"184467440737095516150"), None);
        assert_eq!(parse_i64(b"-5"), Some(-5));
    }
}

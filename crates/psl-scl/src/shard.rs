//! Shards of a KV space (`docs/protocol/sharding.md` §2–§3; the rest of the design is not
//! built yet): a key's *point* in the hash space, and the shard map that divides that space
//! among the shards' capsules, with its byte encoding (the body of a record in the map
//! capsule).
//!
//! ```text
//! map (version 1):
//!   [4] "PSLM" | u8 version (1) | u64 map_version
//!   | u16 s (1 ..= SHARDS_MAX)   | s × ( [32] capsule name | u8 m (0 ..= FRONT_ENDS_MAX)
//!                                      | m × ( u8 len (1 ..= 255) | len bytes "host:port", UTF-8 ) )
//!   | u16 r (1 ..= ROUTES_MAX)   | r × ( u64 first point | u16 shard )
//!   | u16 k (0 ..= MOVES_MAX)    | k × ( u64 first point | u64 last point | u16 from | u16 to
//!                                      | u8 phase (1 copying, 2 fenced) )
//! ```
//!
//! Integers are little-endian. A route runs from its first point to the next route's first
//! point less one (the last route to `u64::MAX`), so the routes cover the whole space exactly
//! once when the first starts at 0 and the starts strictly increase; the decoder refuses
//! anything else, a shard index out of range, two shards with one capsule, an unused shard
//! slot's address list too long, a move that is empty, runs backwards, names the same shard
//! twice, overlaps another or leaves its source's routes, and trailing bytes. Every map the
//! decoder accepts encodes back to the same bytes (fuzz target `shard_map`).

use psl_crypto::sha256;

/// The magic that opens a shard map.
pub const MAP_MAGIC: &[u8; 4] = b"PSLM";
/// The encoding version this build reads and writes.
pub const MAP_VERSION: u8 = 1;
/// Most shards one map names.
pub const SHARDS_MAX: usize = 1024;
/// Most routes one map holds (several per shard after splits and merges).
pub const ROUTES_MAX: usize = 4096;
/// Most moves in progress at once.
pub const MOVES_MAX: usize = 64;
/// Most front-end addresses listed per shard.
pub const FRONT_ENDS_MAX: usize = 64;
/// The domain of a key's point hash.
pub const POINT_DOMAIN: &[u8] = b"psl/shard/v1";
/// The one writer of a map capsule (`sharding.md` §3): the owner, or the leader on its
/// behalf, writes each map under this index. No role is ever given it: worker writers start
/// at 2^16 ([`crate::writer_index`]), capsule servers' keys at 2^15, coordinators' just below
/// 2^31. A reader refuses a map capsule with a data record of any other writer.
pub const MAP_WRITER: u32 = 1;
/// The key under which a map record puts its map (the record's only op).
pub const MAP_KEY: &[u8] = b"psl/shard-map";

/// The part of `key` that decides its shard: the bytes between the first `{` and the first
/// `}` after it when there are some (a *hash tag*, Redis Cluster's rule: `{user42}.cart` and
/// `{user42}.orders` share a shard), else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// A key's point: the first 8 bytes, big-endian, of SHA-256(`POINT_DOMAIN` ‖ its hash tag).
pub fn point(key: &[u8]) -> u64 {
    let h = sha256(&[POINT_DOMAIN, hash_tag(key)]);
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_be_bytes(first)
}

/// One shard: its capsule and the front ends that serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The shard's capsule name.
    pub capsule: [u8; 32],
    /// Where its front ends take forwarded commands (`host:port`).
    pub front_ends: Vec<String>,
}

/// The points from `first` up to the next route's first point (exclusive) belong to `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The route's first point.
    pub first: u64,
    /// Index into [`ShardMap::shards`].
    pub shard: u16,
}

/// How far a move of a range between shards has come (`sharding.md` §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The destination imports the range; the source still takes its writes.
    Copying,
    /// The source refuses the range's writes; the destination imports the last of them.
    Fenced,
}

/// A range on its way from one shard to another. The routes still send it to `from` until
/// the map that ends the move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The first point moved.
    pub first: u64,
    /// The last point moved (inclusive).
    pub last: u64,
    /// The source shard.
    pub from: u16,
    /// The destination shard.
    pub to: u16,
    /// How far it has come.
    pub phase: Phase,
}

/// The shard map: which shard holds each point, at one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    /// Strictly increasing from one map to the next.
    pub map_version: u64,
    /// The shards, by index.
    pub shards: Vec<Shard>,
    /// The routes, by first point.
    pub routes: Vec<Route>,
    /// Moves in progress.
    pub moves: Vec<Move>,
}

/// Why bytes are not a shard map, or a map breaks its rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardMapError {
    /// The input ended inside a field.
    #[error("shard map truncated in {0}")]
    Truncated(&'static str),
    /// Not a shard map, or one of another version.
    #[error("not a version-{MAP_VERSION} shard map ({0})")]
    Header(&'static str),
    /// A count is out of its bounds.
    #[error("shard map: {field} is {count}, allowed {min} ..= {max}")]
    Count {
        /// The counted items.
        field: &'static str,
        /// The count found.
        count: usize,
        /// The fewest allowed.
        min: usize,
        /// The most allowed.
        max: usize,
    },
    /// A field's value breaks the map's rules.
    #[error("shard map: {0}")]
    Invalid(String),
    /// Bytes follow the map.
    #[error("shard map: {0} trailing bytes")]
    Trailing(usize),
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ShardMapError> {
        if self.buf.len() < n {
            return Err(ShardMapError::Truncated(field));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, ShardMapError> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, ShardMapError> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, ShardMapError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A count read as `u16` (or `u8`), checked against its bounds before anything is read or
    /// allocated for it.
    fn count(&mut self, wide: bool, field: &'static str, min: usize, max: usize) -> Result<usize, ShardMapError> {
        let count = if wide { self.u16(field)? as usize } else { self.u8(field)? as usize };
        if count < min || count > max {
            return Err(ShardMapError::Count { field, count, min, max });
        }
        Ok(count)
    }
}

impl ShardMap {
    /// A map of one shard, `capsule`, holding every point (a deployment before any split).
    pub fn single(map_version: u64, capsule: [u8; 32], front_ends: Vec<String>) -> ShardMap {
        ShardMap {
            map_version,
            shards: vec![Shard { capsule, front_ends }],
            routes: vec![Route { first: 0, shard: 0 }],
            moves: Vec::new(),
        }
    }

    /// The shard that holds `point`.
    pub fn shard_of_point(&self, point: u64) -> u16 {
        // The routes start at 0 and strictly increase (checked), so some route holds it.
        let i = self.routes.partition_point(|r| r.first <= point);
        self.routes[i.saturating_sub(1)].shard
    }

    /// The shard that holds `key`.
    pub fn shard_of(&self, key: &[u8]) -> u16 {
        self.shard_of_point(point(key))
    }

    /// The last point of route `i`.
    fn route_last(&self, i: usize) -> u64 {
        self.routes.get(i + 1).map_or(u64::MAX, |next| next.first - 1)
    }

    /// Checks the map's rules (module docs): what [`ShardMap::decode`] refuses, and what
    /// [`ShardMap::encode`] will not write.
    pub fn check(&self) -> Result<(), ShardMapError> {
        let bad = |s: String| Err(ShardMapError::Invalid(s));
        let bounds = |field, count, min, max| {
            if count < min || count > max {
                Err(ShardMapError::Count { field, count, min, max })
            } else {
                Ok(())
            }
        };
        bounds("shards", self.shards.len(), 1, SHARDS_MAX)?;
        bounds("routes", self.routes.len(), 1, ROUTES_MAX)?;
        bounds("moves", self.moves.len(), 0, MOVES_MAX)?;
        for (i, s) in self.shards.iter().enumerate() {
            bounds("front ends of a shard", s.front_ends.len(), 0, FRONT_ENDS_MAX)?;
            if self.shards[..i].iter().any(|o| o.capsule == s.capsule) {
                return bad(format!("shards {i} and another name the same capsule"));
            }
            for a in &s.front_ends {
                if a.is_empty() || a.len() > 255 {
                    return bad(format!("shard {i}: a front-end address of {} bytes (1 ..= 255)", a.len()));
                }
            }
        }
        let n = self.shards.len();
        if self.routes[0].first != 0 {
            return bad(format!("the first route starts at {}, not 0", self.routes[0].first));
        }
        for (i, r) in self.routes.iter().enumerate() {
            if r.shard as usize >= n {
                return bad(format!("route {i} names shard {} of {n}", r.shard));
            }
            if i > 0 && r.first <= self.routes[i - 1].first {
                return bad(format!("route {i} starts at {}, not after route {}'s start", r.first, i - 1));
            }
        }
        for (i, m) in self.moves.iter().enumerate() {
            if m.first > m.last {
                return bad(format!("move {i} runs backwards ({} > {})", m.first, m.last));
            }
            if m.from == m.to || m.from as usize >= n || m.to as usize >= n {
                return bad(format!("move {i} from shard {} to shard {} of {n}", m.from, m.to));
            }
            // The whole range lies in routes of its source.
            let start = self.routes.partition_point(|r| r.first <= m.first) - 1;
            let mut j = start;
            loop {
                if self.routes[j].shard != m.from {
                    return bad(format!("move {i} covers points shard {} does not hold", m.from));
                }
                if self.route_last(j) >= m.last {
                    break;
                }
                j += 1;
            }
            for (k, o) in self.moves[..i].iter().enumerate() {
                if m.first <= o.last && o.first <= m.last {
                    return bad(format!("moves {k} and {i} overlap"));
                }
            }
        }
        Ok(())
    }

    /// The map's bytes. Panics on a map that breaks its rules ([`ShardMap::check`]): the
    /// writer of a map builds it, so a broken one is a bug there, never input.
    pub fn encode(&self) -> Vec<u8> {
        if let Err(e) = self.check() {
            panic!("encoding a shard map that breaks its rules: {e}");
        }
        let mut out = Vec::with_capacity(64 + self.shards.len() * 64 + self.routes.len() * 10);
        out.extend_from_slice(MAP_MAGIC);
        out.push(MAP_VERSION);
        out.extend_from_slice(&self.map_version.to_le_bytes());
        out.extend_from_slice(&(self.shards.len() as u16).to_le_bytes());
        for s in &self.shards {
            out.extend_from_slice(&s.capsule);
            out.push(s.front_ends.len() as u8);
            for a in &s.front_ends {
                out.push(a.len() as u8);
                out.extend_from_slice(a.as_bytes());
            }
        }
        out.extend_from_slice(&(self.routes.len() as u16).to_le_bytes());
        for r in &self.routes {
            out.extend_from_slice(&r.first.to_le_bytes());
            out.extend_from_slice(&r.shard.to_le_bytes());
        }
        out.extend_from_slice(&(self.moves.len() as u16).to_le_bytes());
        for m in &self.moves {
            out.extend_from_slice(&m.first.to_le_bytes());
            out.extend_from_slice(&m.last.to_le_bytes());
            out.extend_from_slice(&m.from.to_le_bytes());
            out.extend_from_slice(&m.to.to_le_bytes());
            out.push(match m.phase {
                Phase::Copying => 1,
                Phase::Fenced => 2,
            });
        }
        out
    }

    /// Reads a map from exactly `b`, and checks its rules.
    pub fn decode(b: &[u8]) -> Result<ShardMap, ShardMapError> {
        let mut r = Reader { buf: b };
        if r.take(4, "magic")? != MAP_MAGIC {
            return Err(ShardMapError::Header("bad magic"));
        }
        if r.u8("version")? != MAP_VERSION {
            return Err(ShardMapError::Header("unknown version"));
        }
        let map_version = r.u64("map version")?;
        let s = r.count(true, "shards", 1, SHARDS_MAX)?;
        let mut shards = Vec::with_capacity(s);
        for _ in 0..s {
            let mut capsule = [0u8; 32];
            capsule.copy_from_slice(r.take(32, "capsule name")?);
            let m = r.count(false, "front ends of a shard", 0, FRONT_ENDS_MAX)?;
            let mut front_ends = Vec::with_capacity(m);
            for _ in 0..m {
                let len = r.count(false, "front-end address", 1, 255)?;
                let a = std::str::from_utf8(r.take(len, "front-end address")?)
                    .map_err(|_| ShardMapError::Invalid("a front-end address is not UTF-8".into()))?;
                front_ends.push(a.to_string());
            }
            shards.push(Shard { capsule, front_ends });
        }
        let n = r.count(true, "routes", 1, ROUTES_MAX)?;
        let mut routes = Vec::with_capacity(n);
        for _ in 0..n {
            routes.push(Route { first: r.u64("route first point")?, shard: r.u16("route shard")? });
        }
        let k = r.count(true, "moves", 0, MOVES_MAX)?;
        let mut moves = Vec::with_capacity(k);
        for _ in 0..k {
            let (first, last) = (r.u64("move first point")?, r.u64("move last point")?);
            let (from, to) = (r.u16("move source")?, r.u16("move destination")?);
            let phase = match r.u8("move phase")? {
                1 => Phase::Copying,
                2 => Phase::Fenced,
                p => return Err(ShardMapError::Invalid(format!("unknown move phase {p}"))),
            };
            moves.push(Move { first, last, from, to, phase });
        }
        if !r.buf.is_empty() {
            return Err(ShardMapError::Trailing(r.buf.len()));
        }
        let map = ShardMap { map_version, shards, routes, moves };
        map.check()?;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn capsule(i: u8) -> [u8; 32] {
        [i; 32]
    }

    /// Four shards after two splits, one move fenced.
    fn sample() -> ShardMap {
        ShardMap {
            map_version: 7,
            shards: (0..4u8)
                .map(|i| Shard { capsule: capsule(i), front_ends: vec![format!("10.0.0.{i}:21211")] })
                .collect(),
            routes: vec![
                Route { first: 0, shard: 0 },
                Route { first: 1 << 62, shard: 1 },
                Route { first: 1 << 63, shard: 2 },
                Route { first: (1 << 63) + (1 << 62), shard: 0 },
            ],
            moves: vec![Move { first: 1 << 61, last: (1 << 62) - 1, from: 0, to: 3, phase: Phase::Fenced }],
        }
    }

    #[test]
    fn hash_tags_follow_the_redis_rule() {
        assert_eq!(hash_tag(b"{user42}.cart"), b"user42");
        assert_eq!(hash_tag(b"x{a}{b}"), b"a");
        assert_eq!(hash_tag(b"{}.cart"), b"{}.cart", "an empty tag is no tag");
        assert_eq!(hash_tag(b"{open"), b"{open");
        assert_eq!(hash_tag(b"plain"), b"plain");
        assert_eq!(point(b"{user42}.cart"), point(b"{user42}.orders"));
        assert_ne!(point(b"user42.cart"), point(b"user42.orders"));
        // The point is part of the format: clients compute it too.
        let h = sha256(&[b"psl/shard/v1abc"]);
        assert_eq!(point(b"abc"), u64::from_be_bytes(h.as_bytes()[..8].try_into().unwrap()));
        // The same vectors as the Python SDK's tests (clients/python/tests/test_shards.py).
        assert_eq!(point(b"user:1"), 0xe874_d9ad_abb8_1120);
        assert_eq!(point(b"{user42}.cart"), 0x4d73_b003_3f54_392d);
    }

    #[test]
    fn routes_cover_every_point_once() {
        let m = sample();
        assert_eq!(m.shard_of_point(0), 0);
        assert_eq!(m.shard_of_point((1 << 62) - 1), 0);
        assert_eq!(m.shard_of_point(1 << 62), 1);
        assert_eq!(m.shard_of_point(u64::MAX), 0);
        assert_eq!(m.shard_of_point((1 << 63) + 5), 2);
        let one = ShardMap::single(1, capsule(9), vec![]);
        assert!(one.check().is_ok());
        assert_eq!(one.shard_of(b"anything"), 0);
    }

    #[test]
    fn broken_maps_are_refused() {
        let mut cases: Vec<(ShardMap, &str)> = Vec::new();
        let mut m = sample();
        m.routes[0].first = 1;
        cases.push((m, "starts at 1"));
        let mut m = sample();
        m.routes[2].first = m.routes[1].first;
        cases.push((m, "not after"));
        let mut m = sample();
        m.routes[1].shard = 4;
        cases.push((m, "names shard 4"));
        let mut m = sample();
        m.shards[3].capsule = capsule(0);
        cases.push((m, "same capsule"));
        let mut m = sample();
        m.moves[0].to = 0;
        cases.push((m, "from shard 0 to shard 0"));
        let mut m = sample();
        m.moves[0].last = 1 << 62;
        cases.push((m, "does not hold"));
        let mut m = sample();
        m.moves.push(Move { first: 5, last: 1 << 61, from: 0, to: 2, phase: Phase::Copying });
        cases.push((m, "overlap"));
        let mut m = sample();
        m.moves[0].first = m.moves[0].last + 1;
        cases.push((m, "backwards"));
        let mut m = sample();
        m.shards[0].front_ends.push(String::new());
        cases.push((m, "0 bytes"));
        let mut m = sample();
        m.shards.clear();
        cases.push((m, "shards is 0"));
        for (m, why) in cases {
            let e = m.check().expect_err(why).to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn bytes_round_trip_and_every_cut_or_extra_byte_is_refused() {
        let m = sample();
        let b = m.encode();
        assert_eq!(ShardMap::decode(&b), Ok(m));
        for cut in 0..b.len() {
            assert!(ShardMap::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(ShardMap::decode(&long), Err(ShardMapError::Trailing(1)));
        let mut v2 = b.clone();
        v2[4] = 2;
        assert!(matches!(ShardMap::decode(&v2), Err(ShardMapError::Header(_))));
        // A count over its limit is refused before anything is allocated for it.
        let mut huge = b[..13].to_vec();
        huge.extend_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(ShardMap::decode(&huge), Err(ShardMapError::Count { field: "shards", .. })));
    }

    fn arb_map() -> impl Strategy<Value = ShardMap> {
        (1usize..6, proptest::collection::btree_set(1u64..u64::MAX, 0..12), any::<u64>(), any::<u64>()).prop_map(
            |(n, starts, version, pick)| {
                let shards = (0..n)
                    .map(|i| Shard {
                        capsule: capsule(i as u8),
                        front_ends: (0..(i % 3)).map(|j| format!("h{i}-{j}:1")).collect(),
                    })
                    .collect();
                let routes: Vec<Route> = std::iter::once(0)
                    .chain(starts)
                    .enumerate()
                    .map(|(i, first)| Route { first, shard: ((i as u64 ^ pick) % n as u64) as u16 })
                    .collect();
                let mut map = ShardMap { map_version: version, shards, routes, moves: Vec::new() };
                // One move: the first half of a route, to another shard, when there is one.
                if n > 1 {
                    let i = (pick as usize) % map.routes.len();
                    let (first, last) = (map.routes[i].first, map.route_last(i));
                    let from = map.routes[i].shard;
                    let to = (from + 1) % n as u16;
                    let phase = if pick % 2 == 0 { Phase::Copying } else { Phase::Fenced };
                    map.moves.push(Move { first, last: first + (last - first) / 2, from, to, phase });
                }
                map
            },
        )
    }

    proptest! {
        #[test]
        fn generated_maps_round_trip_and_route_like_a_linear_scan(m in arb_map(), p in any::<u64>()) {
            prop_assert!(m.check().is_ok(), "{:?}", m.check());
            let b = m.encode();
            prop_assert_eq!(ShardMap::decode(&b), Ok(m.clone()));
            let linear = m.routes.iter().rev().find(|r| r.first <= p).map(|r| r.shard);
            prop_assert_eq!(Some(m.shard_of_point(p)), linear);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_what_decodes_encodes_back(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut input = MAP_MAGIC.to_vec();
            input.push(MAP_VERSION);
            input.extend_from_slice(&b);
            if let Ok(m) = ShardMap::decode(&input) {
                prop_assert_eq!(m.encode(), input);
            }
        }
    }
}

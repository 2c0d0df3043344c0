//! Subject-based routing for the NATS backend: which subject a message is published on, and
//! which subjects an endpoint subscribes to. Pure functions, no I/O.
//!
//! # Classifying by the public prefix (and why the trait has no topic)
//!
//! Every message PSL puts on the fabric starts with the public routing header of the SCL wire
//! format, `u8 version (1) | u8 type | [32] capsule name` (`psl-scl`'s `wire` and `dbwire`).
//! The NATS backend reads those 34 bytes (and, for an ack, the writer indices it names) to pick
//! the subject; it does not look further and never decodes a record. The alternative, a topic
//! argument on [`crate::Fabric::publish`], was rejected: every message reaches the fabric as
//! bytes that crossed the TEE boundary ring from a trusted core (`psl-node`), a capsule
//! server's commit path or CapsuleDB's role, so a topic would have to be carried through each
//! ring, each engine's outputs and each runtime, for information the bytes already carry in
//! the clear (any router or NATS operator reads the same header). Misclassification cannot
//! hurt safety: receivers verify every record and signed message as before; a wrongly routed
//! message is at worst a lost message, which the protocol repairs. The header is versioned:
//! a message of another version or an unknown type is routed to the catch-all subject
//! (`<prefix>.any`), which every endpoint subscribes to, so non-SCL bytes keep the plain
//! multicast contract of the trait.
//!
//! # The subject tree of a capsule
//!
//! `<prefix>.<capsule name, 64 lowercase hex>.<leaf>` (prefix `psl` by default):
//!
//! | type | message | leaf | who subscribes |
//! | --- | --- | --- | --- |
//! | 1 | record (a first send or a repair answer: the bytes are the same) | `rec` | every role of the capsule |
//! | 2 | repair request | `repair` | nodes, coordinators, capsule servers, CapsuleDB (whoever can answer) |
//! | 3 | heads hint | `heads` | nodes, coordinators, capsule servers, CapsuleDB |
//! | 4 | capsule server's ack | `ack.<node>`, once per node named by its entries | the writing node (`node` = writer index >> 16) |
//! | 5 | CapsuleDB get | `db.get` | CapsuleDB |
//! | 6 | CapsuleDB answer | `db.answer` | nodes reading through CapsuleDB |
//! | 7 | CapsuleDB heads (frontier) | `db.heads` | nodes reading through CapsuleDB |
//! | 10 | key statements (writer certificates, revocations) | `certs` | every role that takes records |
//! | 11 | epoch wanted (a node waits on a `sync()` of an idle capsule) | `heads` | as heads hints (the coordinators act on it) |
//!
//! An observer (the job recorder of `psl run --cluster`) takes `rec` and `certs` only. A node never
//! receives another capsule's traffic, nor acks meant for other nodes, nor CapsuleDB gets.

use std::fmt::Write as _;

/// The SCL wire version this classifier understands.
pub const SCL_WIRE_VERSION: u8 = 1;
/// Length of the routing header: version, type, capsule name.
pub const PREFIX_LEN: usize = 34;
/// Default first token of every subject.
pub const SUBJECT_PREFIX_DEFAULT: &str = "psl";
/// Most distinct nodes one ack is routed to (an ack names at most 1024 entries).
pub const ACK_NODES_MAX: usize = 1024;

const TYPE_RECORD: u8 = 1;
const TYPE_REPAIR: u8 = 2;
const TYPE_HEADS: u8 = 3;
const TYPE_ACK: u8 = 4;
const TYPE_DB_GET: u8 = 5;
const TYPE_DB_ANSWER: u8 = 6;
const TYPE_DB_HEADS: u8 = 7;
const TYPE_CERTS: u8 = 10;
const TYPE_EPOCH_WANTED: u8 = 11;
/// `u32 server | u16 n` after the prefix; then `n × 52` bytes of entries.
const ACK_HEAD_LEN: usize = 6;
const ACK_ENTRY_LEN: usize = 4 + 8 + 8 + 32;

/// The first byte of an interest frame ([`Interest::encode_frame`]).
pub const INTEREST_FRAME_TAG: u8 = 0xFF;
/// The interest frame's version.
pub const INTEREST_FRAME_VERSION: u8 = 1;
/// Most capsules one interest frame names (a role serves a handful; an interest with more is
/// sent as everything).
pub const INTEREST_CAPSULES_MAX: usize = 1024;

/// The leaf a message goes to, under its capsule's subject tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Leaf {
    /// A record, first sent or answering a repair (`rec`).
    Record,
    /// A repair request (`repair`).
    Repair,
    /// A heads hint (`heads`).
    Heads,
    /// An ack for the writers of one node (`writer >> 16`).
    Ack(u32),
    /// A CapsuleDB get (`db.get`).
    DbGet,
    /// A CapsuleDB answer (`db.answer`).
    DbAnswer,
    /// CapsuleDB heads, its frontier (`db.heads`).
    DbHeads,
    /// Writer certificates and revocations: whoever verifies records needs them.
    Certs,
}

impl Leaf {
    fn push(&self, s: &mut String) {
        match self {
            Leaf::Record => s.push_str("rec"),
            Leaf::Repair => s.push_str("repair"),
            Leaf::Heads => s.push_str("heads"),
            Leaf::Ack(node) => {
                let _ = write!(s, "ack.{node}");
            }
            Leaf::DbGet => s.push_str("db.get"),
            Leaf::DbAnswer => s.push_str("db.answer"),
            Leaf::DbHeads => s.push_str("db.heads"),
            Leaf::Certs => s.push_str("certs"),
        }
    }
}

/// Where one message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Under the capsule's tree, on these leaves (more than one only for an ack naming writers
    /// of several nodes).
    Capsule {
        /// The capsule name from the message's routing header.
        capsule: [u8; 32],
        /// The leaves to publish on: one, or one per node an ack names (at most
        /// [`ACK_NODES_MAX`]).
        leaves: Vec<Leaf>,
    },
    /// Not an SCL message this classifier knows: the catch-all subject.
    Any,
}

/// The route of `msg`, from its public header only. Never panics, whatever the bytes.
pub fn classify(msg: &[u8]) -> Route {
    if msg.len() < PREFIX_LEN || msg[0] != SCL_WIRE_VERSION {
        return Route::Any;
    }
    let mut capsule = [0u8; 32];
    capsule.copy_from_slice(&msg[2..PREFIX_LEN]);
    let leaf = match msg[1] {
        TYPE_RECORD => Leaf::Record,
        TYPE_REPAIR => Leaf::Repair,
        // A hint for the coordinators, who take heads hints (small, rare: no leaf of its own).
        TYPE_HEADS | TYPE_EPOCH_WANTED => Leaf::Heads,
        TYPE_ACK => {
            return match ack_nodes(&msg[PREFIX_LEN..]) {
                Some(nodes) => Route::Capsule { capsule, leaves: nodes.into_iter().map(Leaf::Ack).collect() },
                None => Route::Any,
            }
        }
        TYPE_DB_GET => Leaf::DbGet,
        TYPE_DB_ANSWER => Leaf::DbAnswer,
        TYPE_DB_HEADS => Leaf::DbHeads,
        TYPE_CERTS => Leaf::Certs,
        _ => return Route::Any,
    };
    Route::Capsule { capsule, leaves: vec![leaf] }
}

/// The distinct nodes (`writer >> 16`) an ack's entries name, in ascending order; `None` if the
/// ack is malformed (its receivers would refuse it anyway) or names no entry.
fn ack_nodes(p: &[u8]) -> Option<Vec<u32>> {
    if p.len() < ACK_HEAD_LEN {
        return None;
    }
    let n = u16::from_le_bytes([p[4], p[5]]) as usize;
    let entries = p.get(ACK_HEAD_LEN..ACK_HEAD_LEN.checked_add(n.checked_mul(ACK_ENTRY_LEN)?)?)?;
    let mut nodes: Vec<u32> =
        entries.chunks_exact(ACK_ENTRY_LEN).map(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]]) >> 16).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.truncate(ACK_NODES_MAX);
    (!nodes.is_empty()).then_some(nodes)
}

/// `<prefix>.<capsule hex>.<leaf>`.
pub fn subject(prefix: &str, capsule: &[u8; 32], leaf: Leaf) -> String {
    let mut s = String::with_capacity(prefix.len() + 1 + 64 + 12);
    s.push_str(prefix);
    s.push('.');
    s.push_str(&hex::encode(capsule));
    s.push('.');
    leaf.push(&mut s);
    s
}

/// The catch-all subject: `<prefix>.any`.
pub fn any_subject(prefix: &str) -> String {
    format!("{prefix}.any")
}

/// Checks a subject prefix: one or more dot-separated tokens of `[A-Za-z0-9_-]`.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 128
        && prefix
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}

/// What an endpoint wants to receive: the capsules it serves and, per capsule, the messages
/// its role consumes. NATS subscribes to its subjects; the router tree learns it from the
/// endpoint's interest frame ([`Interest::encode_frame`]) and filters at the last hop.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Interest {
    /// Capsule names; empty with `everything` means every capsule (`<prefix>.>`).
    pub capsules: Vec<[u8; 32]>,
    /// Records and key statements (writer certificates, revocations): every role that takes
    /// records.
    pub records: bool,
    /// Repair requests and heads hints (whoever can answer a repair from what it holds).
    pub repair: bool,
    /// Acks for this node's writers (`psl node --id`), if it waits for durability.
    pub acks_for_node: Option<u32>,
    /// CapsuleDB gets (the CapsuleDB role).
    pub db_gets: bool,
    /// CapsuleDB answers and frontiers (a node reading through CapsuleDB).
    pub db_answers: bool,
    /// Every message of the capsules (or of every capsule): monitors, the benchmark, tests.
    pub everything: bool,
}

impl Interest {
    /// A worker node or SecureCached front end: records, repair, heads, its own acks, and
    /// CapsuleDB's answers if it reads through CapsuleDB.
    pub fn node(capsule: [u8; 32], node: u32, capsuledb: bool) -> Interest {
        Interest {
            capsules: vec![capsule],
            records: true,
            repair: true,
            acks_for_node: Some(node),
            db_answers: capsuledb,
            ..Interest::default()
        }
    }

    /// A coordinator (primary or shadow): records, repair and heads.
    pub fn coordinator(capsule: [u8; 32]) -> Interest {
        Interest { capsules: vec![capsule], records: true, repair: true, ..Interest::default() }
    }

    /// A capsule server: records, repair and heads (it answers repairs from disk and pulls by
    /// heads); never acks, its own or other servers'.
    pub fn server(capsule: [u8; 32]) -> Interest {
        Interest { capsules: vec![capsule], records: true, repair: true, ..Interest::default() }
    }

    /// The CapsuleDB role: a receive-only node that also answers gets and waits for acks of
    /// the blocks and indexes it writes as node `node`.
    pub fn capsuledb(capsule: [u8; 32], node: u32) -> Interest {
        Interest {
            capsules: vec![capsule],
            records: true,
            repair: true,
            acks_for_node: Some(node),
            db_gets: true,
            ..Interest::default()
        }
    }

    /// An observer that keeps the capsule's records (the job recorder).
    pub fn observer(capsule: [u8; 32]) -> Interest {
        Interest { capsules: vec![capsule], records: true, ..Interest::default() }
    }

    /// Everything on these capsules (every capsule if `capsules` is empty).
    pub fn everything(capsules: Vec<[u8; 32]>) -> Interest {
        Interest { capsules, everything: true, ..Interest::default() }
    }

    /// The subjects to subscribe to (wildcards where a whole subtree is wanted), the
    /// catch-all subject included.
    pub fn subjects(&self, prefix: &str) -> Vec<String> {
        let mut out = vec![any_subject(prefix)];
        if self.everything && self.capsules.is_empty() {
            out.push(format!("{prefix}.>"));
            out.remove(0); // `psl.>` covers `psl.any`
            return out;
        }
        for c in &self.capsules {
            let hexname = hex::encode(c);
            let at = |leaf: &str| format!("{prefix}.{hexname}.{leaf}");
            if self.everything {
                out.push(at(">"));
                continue;
            }
            if self.records {
                out.push(at("rec"));
                out.push(at("certs"));
            }
            if self.repair {
                out.push(at("repair"));
                out.push(at("heads"));
            }
            if let Some(n) = self.acks_for_node {
                out.push(at(&format!("ack.{n}")));
            }
            if self.db_gets {
                out.push(at("db.get"));
            }
            if self.db_answers {
                out.push(at("db.answer"));
                out.push(at("db.heads"));
            }
        }
        out.dedup();
        out
    }

    /// The interest frame an endpoint of the router tree sends after each connect (the
    /// router then forwards it only what [`Interest::wants`]):
    ///
    /// ```text
    /// u8 0xFF (INTEREST_FRAME_TAG: no wire message starts with it) | u8 version (1)
    /// | u8 flags (1 records, 2 repair, 4 acks for a node, 8 db gets, 16 db answers, 32 everything)
    /// | u32 node (0 unless flag 4) | u16 n (0 ..= INTEREST_CAPSULES_MAX) | n × [32] capsule
    /// ```
    ///
    /// An interest naming more than `INTEREST_CAPSULES_MAX` capsules is sent as everything on
    /// every capsule (a superset: the endpoint misses nothing).
    pub fn encode_frame(&self) -> Vec<u8> {
        if self.capsules.len() > INTEREST_CAPSULES_MAX {
            return Interest::everything(Vec::new()).encode_frame();
        }
        let capsules = &self.capsules;
        let flags = u8::from(self.records)
            | u8::from(self.repair) << 1
            | u8::from(self.acks_for_node.is_some()) << 2
            | u8::from(self.db_gets) << 3
            | u8::from(self.db_answers) << 4
            | u8::from(self.everything) << 5;
        let mut out = Vec::with_capacity(9 + 32 * capsules.len());
        out.extend_from_slice(&[INTEREST_FRAME_TAG, INTEREST_FRAME_VERSION, flags]);
        out.extend_from_slice(&self.acks_for_node.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(capsules.len() as u16).to_le_bytes());
        for c in capsules {
            out.extend_from_slice(c);
        }
        out
    }

    /// An interest frame's interest; `None` for any other bytes (a frame that is not an
    /// interest frame, another version, unknown flags, a node without its flag, a count over
    /// the limit, a length that does not match the count). Never panics; what it accepts
    /// encodes back to the same bytes.
    pub fn decode_frame(b: &[u8]) -> Option<Interest> {
        let (&[tag, version, flags], rest) = b.split_first_chunk::<3>()?;
        if tag != INTEREST_FRAME_TAG || version != INTEREST_FRAME_VERSION || flags >> 6 != 0 {
            return None;
        }
        let (node, rest) = rest.split_first_chunk::<4>()?;
        let (n, rest) = rest.split_first_chunk::<2>()?;
        let n = u16::from_le_bytes(*n) as usize;
        if n > INTEREST_CAPSULES_MAX || rest.len() != n * 32 || flags & 4 == 0 && *node != [0; 4] {
            return None;
        }
        let capsules = rest
            .chunks_exact(32)
            .map(|c| {
                let mut a = [0u8; 32];
                a.copy_from_slice(c);
                a
            })
            .collect();
        let bit = |i: u8| flags & (1 << i) != 0;
        Some(Interest {
            capsules,
            records: bit(0),
            repair: bit(1),
            acks_for_node: bit(2).then(|| u32::from_le_bytes(*node)),
            db_gets: bit(3),
            db_answers: bit(4),
            everything: bit(5),
        })
    }

    /// Whether the router forwards `msg` to an endpoint with this interest: a message for a
    /// capsule if some leaf of it is wanted, and anything the classifier does not know (the
    /// catch-all subject, which every endpoint takes).
    pub fn wants_message(&self, msg: &[u8]) -> bool {
        self.wants_route(&classify(msg))
    }

    /// [`Interest::wants_message`] for a message already classified (the router classifies
    /// each frame once, whatever the number of links it offers it to).
    pub fn wants_route(&self, route: &Route) -> bool {
        match route {
            Route::Capsule { capsule, leaves } => leaves.iter().any(|l| self.wants(capsule, *l)),
            Route::Any => true,
        }
    }

    /// Whether a message routed to `leaf` of `capsule` reaches this interest (the in-process
    /// model of the subscriptions: tests and the simulator's fan-out count).
    pub fn wants(&self, capsule: &[u8; 32], leaf: Leaf) -> bool {
        if !(self.capsules.contains(capsule) || self.capsules.is_empty() && self.everything) {
            return false;
        }
        if self.everything {
            return true;
        }
        match leaf {
            Leaf::Record | Leaf::Certs => self.records,
            Leaf::Repair | Leaf::Heads => self.repair,
            Leaf::Ack(n) => self.acks_for_node == Some(n),
            Leaf::DbGet => self.db_gets,
            Leaf::DbAnswer | Leaf::DbHeads => self.db_answers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(t: u8, cap: u8, payload: &[u8]) -> Vec<u8> {
        let mut m = vec![1, t];
        m.extend_from_slice(&[cap; 32]);
        m.extend_from_slice(payload);
        m
    }

    fn ack(writers: &[u32]) -> Vec<u8> {
        let mut p = 7u32.to_le_bytes().to_vec();
        p.extend_from_slice(&(writers.len() as u16).to_le_bytes());
        for w in writers {
            p.extend_from_slice(&w.to_le_bytes());
            p.extend_from_slice(&[0; 48]);
        }
        p.extend_from_slice(&[0; 64]);
        msg(4, 9, &p)
    }

    #[test]
    fn every_type_has_its_leaf() {
        let cases = [
            (1, Leaf::Record),
            (2, Leaf::Repair),
            (3, Leaf::Heads),
            (5, Leaf::DbGet),
            (6, Leaf::DbAnswer),
            (7, Leaf::DbHeads),
            (10, Leaf::Certs),
            (11, Leaf::Heads),
        ];
        for (t, leaf) in cases {
            assert_eq!(classify(&msg(t, 3, b"x")), Route::Capsule { capsule: [3; 32], leaves: vec![leaf] });
        }
        assert_eq!(classify(&msg(8, 3, b"x")), Route::Any);
        assert_eq!(classify(&msg(1, 3, b"")[..33]), Route::Any);
        let mut v2 = msg(1, 3, b"x");
        v2[0] = 2;
        assert_eq!(classify(&v2), Route::Any);
        assert_eq!(classify(b"hello"), Route::Any);
    }

    #[test]
    fn an_ack_goes_to_each_node_it_names_once() {
        let w = |node: u32, inc: u32, actor: u32| (node << 16) | (inc << 4) | actor;
        let r = classify(&ack(&[w(5, 1, 0), w(3, 2, 1), w(5, 1, 1)]));
        assert_eq!(r, Route::Capsule { capsule: [9; 32], leaves: vec![Leaf::Ack(3), Leaf::Ack(5)] });
        // Malformed: count beyond the bytes, or no entry.
        let mut bad = ack(&[w(5, 1, 0)]);
        bad[PREFIX_LEN + 4] = 200;
        assert_eq!(classify(&bad), Route::Any);
        assert_eq!(classify(&ack(&[])), Route::Any);
    }

    #[test]
    fn subjects_name_the_capsule_and_leaf() {
        let c = [0xab; 32];
        let s = subject("psl", &c, Leaf::Ack(42));
        assert_eq!(s, format!("psl.{}.ack.42", "ab".repeat(32)));
        assert_eq!(subject("a.b", &c, Leaf::DbGet), format!("a.b.{}.db.get", "ab".repeat(32)));
        assert!(valid_prefix("psl") && valid_prefix("site-1.psl_x"));
        assert!(!valid_prefix("") && !valid_prefix("a..b") && !valid_prefix("a.*") && !valid_prefix("a b"));
    }

    #[test]
    fn roles_subscribe_to_what_they_consume_only() {
        let c = [1; 32];
        let n = Interest::node(c, 7, false);
        assert!(n.wants(&c, Leaf::Record) && n.wants(&c, Leaf::Repair) && n.wants(&c, Leaf::Ack(7)));
        assert!(!n.wants(&c, Leaf::Ack(8)) && !n.wants(&c, Leaf::DbGet) && !n.wants(&c, Leaf::DbAnswer));
        assert!(!n.wants(&[2; 32], Leaf::Record));
        assert!(Interest::node(c, 7, true).wants(&c, Leaf::DbHeads));
        let s = Interest::server(c);
        assert!(s.wants(&c, Leaf::Heads) && !s.wants(&c, Leaf::Ack(0)));
        let d = Interest::capsuledb(c, 30_000);
        assert!(d.wants(&c, Leaf::DbGet) && d.wants(&c, Leaf::Ack(30_000)) && !d.wants(&c, Leaf::DbAnswer));
        let o = Interest::observer(c);
        assert!(o.wants(&c, Leaf::Record) && !o.wants(&c, Leaf::Repair));
        assert!(Interest::everything(vec![]).wants(&[5; 32], Leaf::DbGet));
        assert!(o.wants(&c, Leaf::Certs) && s.wants(&c, Leaf::Certs) && !Interest::default().wants(&c, Leaf::Certs));
        let subs = n.subjects("psl");
        assert_eq!(subs.len(), 6, "{subs:?}");
        assert!(subs.contains(&subject("psl", &c, Leaf::Certs)));
        assert!(subs.contains(&"psl.any".to_string()));
        assert!(subs.contains(&subject("psl", &c, Leaf::Ack(7))));
        assert_eq!(Interest::everything(vec![]).subjects("psl"), vec!["psl.>".to_string()]);
        assert_eq!(Interest::everything(vec![c]).subjects("p")[1], format!("p.{}.>", hex::encode(c)));
    }

    proptest! {
        #[test]
        fn classify_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = classify(&bytes);
        }

        #[test]
        fn a_routed_message_reaches_exactly_the_interested(t in 1u8..8, node in 1u32..100) {
            let m = if t == 4 { ack(&[node << 16]) } else { msg(t, 9, b"payload") };
            let Route::Capsule { capsule, leaves } = classify(&m) else { panic!("routed") };
            let n = Interest::node(capsule, node, true);
            let wanted = leaves.iter().any(|l| n.wants(&capsule, *l));
            prop_assert_eq!(wanted, t != 5);
        }
    }
}

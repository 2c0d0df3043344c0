//! The announcement handler: the key statements (certificates of this node's own writers, and
//! any revocations its leader issued) that the node announces on the fabric, again every
//! [`CERTS_ANNOUNCE_MS`], so that late joiners learn them (see the `wire` module docs).
//! Installing the statements in the verifier stays with the [`NodeCore`](crate::NodeCore),
//! which hands the handler only what it must announce.

use crate::wire::Msg;
use psl_capsule::{CapsuleName, KeyStatement};

/// How often a node (and a capsule server) announces its own writers' certificates.
pub const CERTS_ANNOUNCE_MS: u64 = 1000;

/// The statements to announce and when they last were.
#[derive(Debug, Default)]
pub(crate) struct Announcer {
    statements: Vec<KeyStatement>,
    /// When (ms) the statements were last announced; `None`: at the next tick.
    last_at: Option<u64>,
}

impl Announcer {
    pub(crate) fn new() -> Announcer {
        Announcer::default()
    }

    /// Replaces what is announced; announced at the next tick.
    pub(crate) fn set(&mut self, statements: Vec<KeyStatement>) {
        self.statements = statements;
        self.last_at = None;
    }

    /// Adds a statement (once) to what is announced; everything is announced at the next tick.
    pub(crate) fn add(&mut self, s: KeyStatement) {
        if !self.statements.contains(&s) {
            self.statements.push(s);
        }
        self.last_at = None;
    }

    /// The messages to publish at a tick at `now`: every statement, in chunks of at most
    /// a record's worth, if any and if they were not announced within [`CERTS_ANNOUNCE_MS`].
    pub(crate) fn due(&mut self, name: CapsuleName, now: u64) -> Vec<Msg> {
        if self.statements.is_empty() || self.last_at.is_some_and(|t| now.saturating_sub(t) < CERTS_ANNOUNCE_MS) {
            return Vec::new();
        }
        self.last_at = Some(now);
        self.statements
            .chunks(psl_capsule::certs::STATEMENTS_PER_RECORD_MAX)
            .map(|chunk| Msg::Certs { capsule: name, statements: chunk.to_vec() })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule, Limits, Revocation};
    use psl_crypto::OwnerKey;

    fn revocations(n: u32) -> (CapsuleName, Vec<KeyStatement>) {
        let owner = OwnerKey::from_seed(&[21; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "announce", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let s = (0..n)
            .map(|i| KeyStatement::Revoke(Revocation::issue(&app, meta.name(), 1, 0x10000 + i, 0, 0).unwrap()))
            .collect();
        (meta.name(), s)
    }

    fn announced(msgs: &[Msg]) -> usize {
        msgs.iter()
            .map(|m| match m {
                Msg::Certs { statements, .. } => statements.len(),
                _ => panic!("only certificate messages: {m:?}"),
            })
            .sum()
    }

    #[test]
    fn nothing_is_announced_without_statements() {
        let mut a = Announcer::new();
        let (name, _) = revocations(0);
        assert!(a.due(name, 0).is_empty());
        assert!(a.due(name, 5_000).is_empty());
    }

    #[test]
    fn statements_are_announced_at_once_then_every_interval_and_at_once_again_when_they_change() {
        let (name, s) = revocations(2);
        let mut a = Announcer::new();
        a.set(vec![s[0].clone()]);
        assert_eq!(announced(&a.due(name, 10)), 1, "new statements go out at the next tick");
        assert!(a.due(name, 10 + CERTS_ANNOUNCE_MS - 1).is_empty(), "not again within the interval");
        assert_eq!(announced(&a.due(name, 10 + CERTS_ANNOUNCE_MS)), 1);
        a.add(s[1].clone());
        assert_eq!(announced(&a.due(name, 10 + CERTS_ANNOUNCE_MS + 1)), 2, "an added one: everything at once");
        a.add(s[1].clone());
        assert_eq!(announced(&a.due(name, 10 + CERTS_ANNOUNCE_MS + 2)), 2, "added twice, announced once");
    }

    #[test]
    fn many_statements_go_out_in_chunks_of_a_records_worth() {
        let max = psl_capsule::certs::STATEMENTS_PER_RECORD_MAX;
        let (name, s) = revocations(max as u32 + 1);
        let mut a = Announcer::new();
        a.set(s);
        let msgs = a.due(name, 0);
        assert_eq!(msgs.len(), 2);
        assert_eq!(announced(&msgs), max + 1);
    }
}

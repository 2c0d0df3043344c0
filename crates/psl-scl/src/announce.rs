//! The announcement handler: the key statements (certificates of this node's own writers, and
//! any revocations its leader issued) that the node (or a capsule server, its own certificate)
//! announces on the fabric, and again and again, so that late joiners learn them (see the
//! `wire` module docs). Installing the statements in the verifier stays with the
//! [`NodeCore`](crate::NodeCore), which hands the handler only what it must announce.
//!
//! The repeats follow Trickle (RFC 6206): the first comes [`CERTS_ANNOUNCE_MS`] after an
//! announcement, each next one waits twice as long, up to [`CERTS_ANNOUNCE_IDLE_MS`] (below
//! [`psl_capsule::verify::CERT_WAIT_MS`], so a record held for a certificate outlives the wait for
//! it). Hearing a statement it did not know (a process joined, or restarted under a new
//! writer) makes a process announce again at its next tick ([`Announcer::hurry`]): the newcomer
//! learns everyone's certificates at once, and an idle deployment repeats itself rarely.

use crate::wire::Msg;
use psl_capsule::{CapsuleName, KeyStatement};

/// How soon a node (and a capsule server) announces its own writers' certificates again after
/// an announcement that followed a change or a newcomer.
pub const CERTS_ANNOUNCE_MS: u64 = 1000;
/// The longest wait between two announcements (see the module docs).
pub const CERTS_ANNOUNCE_IDLE_MS: u64 = 8_000;
const _: () = assert!(CERTS_ANNOUNCE_IDLE_MS < psl_capsule::verify::CERT_WAIT_MS);

/// The statements to announce and when they last were.
#[derive(Debug)]
pub struct Announcer {
    statements: Vec<KeyStatement>,
    /// When (ms) the statements were last announced; `None`: at the next tick.
    last_at: Option<u64>,
    /// The wait after `last_at` (doubling from [`CERTS_ANNOUNCE_MS`]).
    every_ms: u64,
}

impl Default for Announcer {
    fn default() -> Self {
        Announcer { statements: Vec::new(), last_at: None, every_ms: CERTS_ANNOUNCE_MS }
    }
}

impl Announcer {
    /// Nothing to announce yet.
    pub fn new() -> Announcer {
        Announcer::default()
    }

    /// Replaces what is announced; announced at the next tick.
    pub fn set(&mut self, statements: Vec<KeyStatement>) {
        self.statements = statements;
        self.hurry();
    }

    /// Adds a statement (once) to what is announced; everything is announced at the next tick.
    pub fn add(&mut self, s: KeyStatement) {
        if !self.statements.contains(&s) {
            self.statements.push(s);
        }
        self.hurry();
    }

    /// Someone may lack what this process announces (it heard a statement new to it): announce
    /// at the next tick, and repeat at the short interval again.
    pub fn hurry(&mut self) {
        self.last_at = None;
        self.every_ms = CERTS_ANNOUNCE_MS;
    }

    /// When (ms) the statements are due again (`Some(0)`: at the next tick); `None`: nothing
    /// to announce.
    pub fn next_due(&self) -> Option<u64> {
        if self.statements.is_empty() {
            return None;
        }
        Some(self.last_at.map_or(0, |t| t.saturating_add(self.every_ms)))
    }

    /// The messages to publish at a tick at `now`: every statement, in chunks of at most
    /// a record's worth, if any and if the current wait since the last announcement is over.
    pub fn due(&mut self, name: CapsuleName, now: u64) -> Vec<Msg> {
        if self.statements.is_empty() || self.last_at.is_some_and(|t| now.saturating_sub(t) < self.every_ms) {
            return Vec::new();
        }
        if self.last_at.is_some() {
            self.every_ms = (self.every_ms * 2).min(CERTS_ANNOUNCE_IDLE_MS);
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

    #[test]
    fn repeats_back_off_while_nothing_changes_and_a_newcomer_brings_them_back() {
        let (name, st) = revocations(1);
        let mut a = Announcer::new();
        a.set(st);
        let mut at = Vec::new();
        for t in 0..40_000 {
            if !a.due(name, t).is_empty() {
                at.push(t);
            }
        }
        let gaps: Vec<u64> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(
            &gaps[..4],
            &[CERTS_ANNOUNCE_MS, 2 * CERTS_ANNOUNCE_MS, 4 * CERTS_ANNOUNCE_MS, CERTS_ANNOUNCE_IDLE_MS]
        );
        assert!(gaps[3..].iter().all(|g| *g == CERTS_ANNOUNCE_IDLE_MS), "{gaps:?}");
        assert_eq!(a.next_due(), Some(at.last().unwrap() + CERTS_ANNOUNCE_IDLE_MS));
        // A statement new to us was heard: announce at once, then at the short interval.
        a.hurry();
        assert_eq!(a.next_due(), Some(0));
        assert!(!a.due(name, 40_000).is_empty());
        assert!(!a.due(name, 40_000 + CERTS_ANNOUNCE_MS).is_empty());
    }
}

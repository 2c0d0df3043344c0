//! The checker: the history and the finals in, violations out. Pure.
//!
//! | check | what must hold |
//! | --- | --- |
//! | `convergence` | every live node (and every front end, for the counters) holds the same value for every key |
//! | `durable_lost` | an owned key's final value is its last write acknowledged durable or a later write of its owner (program order is version order for a key one client writes) |
//! | `lww` | a shared key's final version is at or above every durable write's version seen, and its value is the one its version's writer wrote |
//! | `phantom` | every value read or held was written (before it was read), by a write that was not refused |
//! | `read_your_writes` | a client reading its own key on its own node, in the session that wrote it, reads its last write |
//! | `recovery` | a fresh node recovered from any f + 1 servers holds the same as `durable_lost` demands |
//! | `replication` | every put acknowledged durable is stored by at least f + 1 servers |
//! | `memory` | no process exceeded its bound |
//! | `store` | every store re-verifies |
//! | `cas_stale` / `cas_lost` / `cas_chain` | no two `cas` stored on one unique; every stored token is in the final counter, each after exactly the value its `cas` read |
//! | `crash` | no process exited that the schedule did not kill |
//! | `stuck` | after the heal, every node makes a write durable |
//! | `nemesis` | every scheduled restart came up, every start the schedule expects to fail failed |
//! | `byzantine` | (`--byzantine`) no node or front end applied, no server stored or acked, a record of the leaked writer that its revocation covers (`check_byzantine`) |

use super::history::{CasOutcome, Finals, History, KvState, Outcome, WriteEvent};
use super::workload::{author_of, owner_of};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub check: &'static str,
    pub detail: String,
}

fn v(check: &'static str, detail: String) -> Violation {
    Violation { check, detail }
}

/// Per key, its writes in program order (owned keys: one client's program order).
struct Index<'a> {
    by_key: HashMap<&'a str, Vec<&'a WriteEvent>>,
    /// (client, session) -> highest `upto` of an acknowledged SYNC_DURABLE.
    durable_upto: HashMap<(u8, u32), usize>,
    /// Every (key, value) written by a write that was not refused, with when it was sent.
    written: HashMap<(&'a str, &'a str), u64>,
}

impl<'a> Index<'a> {
    fn new(h: &'a History) -> Index<'a> {
        let mut by_key: HashMap<&str, Vec<&WriteEvent>> = HashMap::new();
        let mut written = HashMap::new();
        for w in &h.writes {
            by_key.entry(&w.key).or_default().push(w);
            if let (Some(val), true) = (&w.value, w.outcome != Outcome::Failed) {
                written.insert((w.key.as_str(), val.as_str()), w.at_ms);
            }
        }
        for ws in by_key.values_mut() {
            ws.sort_by_key(|w| (w.client, w.index));
        }
        let mut durable_upto: HashMap<(u8, u32), usize> = HashMap::new();
        for d in &h.durables {
            let e = durable_upto.entry((d.client, d.session)).or_default();
            *e = (*e).max(d.upto);
        }
        Index { by_key, durable_upto, written }
    }

    fn is_durable(&self, w: &WriteEvent) -> bool {
        w.outcome == Outcome::Ok && self.durable_upto.get(&(w.client, w.session)).is_some_and(|u| w.index < *u)
    }

    /// For an owned key: the values it may hold at the end (after every write), as the
    /// durability rule allows: its last durable write or any later write that was not refused;
    /// `None` stands for absent (a delete, or no durable write yet).
    fn allowed_final(&self, key: &str) -> (HashSet<Option<&'a str>>, Option<&'a WriteEvent>) {
        let ws = self.by_key.get(key).map(|v| &v[..]).unwrap_or(&[]);
        let last_durable = ws.iter().rposition(|w| self.is_durable(w));
        let mut ok: HashSet<Option<&str>> = HashSet::new();
        if last_durable.is_none() {
            ok.insert(None);
        }
        for w in &ws[last_durable.unwrap_or(0)..] {
            if w.outcome != Outcome::Failed {
                ok.insert(w.value.as_deref());
            }
        }
        (ok, last_durable.map(|i| ws[i]))
    }
}

fn show(v: Option<&str>) -> String {
    v.map_or("(absent)".to_string(), |s| format!("{s:?}"))
}

/// Checks everything (see the module docs). `f`: the servers' fault bound.
pub fn check(h: &History, fin: &Finals, f: usize) -> Vec<Violation> {
    let idx = Index::new(h);
    let mut out = Vec::new();
    check_states(&idx, fin, &mut out);
    check_reads(&idx, h, &mut out);
    check_lww(h, fin, &mut out);
    check_replication(&idx, h, fin, f, &mut out);
    check_cas(h, fin, &mut out);
    for (p, what, value, bound) in &fin.memory {
        if value > bound {
            out.push(v("memory", format!("{p}: {what} {value} above its bound {bound}")));
        }
    }
    for (what, clean, detail) in &fin.stores {
        if !clean {
            out.push(v("store", format!("{what}: {detail}")));
        }
    }
    for e in &fin.unexpected_exits {
        out.push(v("crash", e.clone()));
    }
    for (n, e) in &fin.stuck {
        out.push(v("stuck", format!("{n}: no durable write after the heal: {e}")));
    }
    for (step, e) in &fin.nemesis_errors {
        out.push(v("nemesis", format!("{step}: {e}")));
    }
    check_byzantine(fin, &mut out);
    out
}

/// Convergence of the live nodes, the durability rule on their state, phantoms, and the
/// recovered nodes.
fn check_states(idx: &Index<'_>, fin: &Finals, out: &mut Vec<Violation>) {
    let states: Vec<(&String, &KvState)> =
        fin.nodes.iter().filter_map(|(n, s)| s.as_ref().ok().map(|s| (n, s))).collect();
    for (n, s) in &fin.nodes {
        if let Err(e) = s {
            out.push(v("convergence", format!("{n}: its state could not be read: {e}")));
        }
    }
    if let Some((first, s0)) = states.first() {
        for (n, s) in &states[1..] {
            let differ: Vec<String> = s0
                .keys()
                .chain(s.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter(|k| s0.get(*k).cloned().flatten() != s.get(*k).cloned().flatten())
                .take(5)
                .map(|k| {
                    format!(
                        "{k}: {first} {} vs {n} {}",
                        show(s0.get(k).cloned().flatten().as_deref()),
                        show(s.get(k).cloned().flatten().as_deref())
                    )
                })
                .collect();
            if !differ.is_empty() {
                out.push(v("convergence", format!("{first} and {n} differ: {}", differ.join("; "))));
            }
        }
        state_rules("durable_lost", first, s0, idx, out);
    }
    for (label, s, _) in &fin.recovered {
        match s {
            Ok(s) => state_rules("recovery", label, s, idx, out),
            Err(e) => out.push(v("recovery", format!("{label}: {e}"))),
        }
    }
}

/// The durability rule for owned keys and no phantoms, on one state.
fn state_rules(check: &'static str, who: &str, s: &KvState, idx: &Index<'_>, out: &mut Vec<Violation>) {
    for (k, val) in s {
        if let Some(val) = val {
            if !idx.written.contains_key(&(k.as_str(), val.as_str())) {
                out.push(v("phantom", format!("{who}: {k} holds {val:?}, which no write (not refused) wrote")));
                continue;
            }
        }
        if owner_of(k).is_some() {
            let (ok, last) = idx.allowed_final(k);
            if !ok.contains(&val.as_deref()) {
                let last =
                    last.map_or("none".to_string(), |w| format!("{} (write #{})", show(w.value.as_deref()), w.index));
                out.push(v(
                    check,
                    format!(
                        "{who}: {k} holds {}, older than its last write acknowledged durable, {last}",
                        show(val.as_deref())
                    ),
                ));
            }
        }
    }
    // Keys the state lacks entirely read as absent.
    for k in idx.by_key.keys().filter(|k| owner_of(k).is_some() && !s.contains_key(**k)) {
        let (ok, last) = idx.allowed_final(k);
        if !ok.contains(&None) {
            out.push(v(
                check,
                format!("{who}: {k} is absent; its last durable write was {:?}", last.map(|w| &w.value)),
            ));
        }
    }
}

/// Reads: no phantoms, no reads from the future, read-your-writes on the own node.
fn check_reads(idx: &Index<'_>, h: &History, out: &mut Vec<Violation>) {
    for r in &h.reads {
        let Ok(got) = &r.got else { continue };
        if let Some(val) = got {
            match idx.written.get(&(r.key.as_str(), val.as_str())) {
                None => {
                    out.push(v(
                        "phantom",
                        format!("client {} read {} = {val:?} on node{}: never written", r.client, r.key, r.node),
                    ));
                    continue;
                }
                Some(sent) if *sent > r.at_ms => out.push(v(
                    "phantom",
                    format!(
                        "client {} read {} = {val:?} at {} ms, before it was written at {sent} ms",
                        r.client, r.key, r.at_ms
                    ),
                )),
                Some(_) => {}
            }
        }
        if !r.own || owner_of(&r.key) != Some(r.client) {
            continue;
        }
        let ws = idx.by_key.get(r.key.as_str()).map(|v| &v[..]).unwrap_or(&[]);
        let before: Vec<&&WriteEvent> = ws.iter().filter(|w| w.index < r.after_index).collect();
        let Some(last) = before.last() else { continue };
        if last.session == r.session && last.outcome == Outcome::Ok {
            if got.as_deref() != last.value.as_deref() {
                out.push(v(
                    "read_your_writes",
                    format!(
                        "client {} read {} = {} on its node, after writing {} there (write #{})",
                        r.client,
                        r.key,
                        show(got.as_deref()),
                        show(last.value.as_deref()),
                        last.index
                    ),
                ));
            }
        } else {
            // After a restart: at least the last durable write before the read.
            let last_durable = before.iter().rposition(|w| idx.is_durable(w));
            let allowed: HashSet<Option<&str>> = match last_durable {
                None => before
                    .iter()
                    .filter(|w| w.outcome != Outcome::Failed)
                    .map(|w| w.value.as_deref())
                    .chain([None])
                    .collect(),
                Some(i) => {
                    before[i..].iter().filter(|w| w.outcome != Outcome::Failed).map(|w| w.value.as_deref()).collect()
                }
            };
            if !allowed.contains(&got.as_deref()) {
                out.push(v(
                    "read_your_writes",
                    format!(
                        "client {} read {} = {} on its restarted node; its last durable write there was {}",
                        r.client,
                        r.key,
                        show(got.as_deref()),
                        last_durable.map_or("none".into(), |i| show(before[i].value.as_deref()))
                    ),
                ));
            }
        }
    }
}

/// Shared keys: the final version is at or above every durable version seen, and names the
/// value's author.
fn check_lww(h: &History, fin: &Finals, out: &mut Vec<Violation>) {
    let mut states: Vec<(&str, &crate::chaos::history::Versions)> = vec![("final", &fin.versions)];
    for (label, s, vers) in &fin.recovered {
        if s.is_ok() {
            states.push((label.as_str(), vers));
        }
    }
    for (who, vers) in states {
        for (k, (val, _, writer)) in vers {
            if let Some(author) = author_of(val) {
                // Node client c runs on node id c + 1 (writer index: node id << 16 | ...).
                if writer >> 16 != u32::from(author) + 1 {
                    out.push(v(
                        "lww",
                        format!("{who}: {k} = {val:?} carries writer {writer}, not one of client {author}'s node"),
                    ));
                }
            }
        }
        for s in &h.versions {
            if owner_of(&s.key).is_some() {
                continue;
            }
            match vers.get(&s.key) {
                Some((val, l, w)) if (*l, *w) < (s.lamport, s.writer) => out.push(v(
                    "lww",
                    format!(
                        "{who}: {} = {val:?} at version ({l}, {w}), below the durable {:?} seen at ({}, {})",
                        s.key, s.value, s.lamport, s.writer
                    ),
                )),
                None if !vers.is_empty() => {
                    // Absent: only a delete at a higher version could explain it; deletes leave
                    // no version in DUMP, so this is not checked.
                }
                _ => {}
            }
        }
    }
}

/// Every durable put is stored by f + 1 servers.
fn check_replication(idx: &Index<'_>, h: &History, fin: &Finals, f: usize, out: &mut Vec<Violation>) {
    if fin.server_puts.is_empty() {
        return; // not observed
    }
    let readable: Vec<(&String, &HashSet<(String, String)>)> =
        fin.server_puts.iter().filter_map(|(s, p)| p.as_ref().ok().map(|p| (s, p))).collect();
    for (s, p) in &fin.server_puts {
        if let Err(e) = p {
            out.push(v("replication", format!("{s}: could not be read: {e}")));
        }
    }
    let mut missing = Vec::new();
    for w in h.writes.iter().filter(|w| idx.is_durable(w)) {
        let Some(val) = &w.value else { continue };
        let holders = readable.iter().filter(|(_, p)| p.contains(&(w.key.clone(), val.clone()))).count();
        if holders < f + 1 {
            missing.push(format!("{} = {val:?} on {holders} server(s)", w.key));
        }
    }
    if !missing.is_empty() {
        let n = missing.len();
        missing.truncate(5);
        out.push(v(
            "replication",
            format!("{n} durable puts on fewer than {} servers, e.g. {}", f + 1, missing.join("; ")),
        ));
    }
}

/// CAS: no two stores on one unique; every stored token in the final counter, after exactly
/// what its cas read; every token in the counter from a cas that was stored or may have been.
fn check_cas(h: &History, fin: &Finals, out: &mut Vec<Violation>) {
    let mut by_unique: HashMap<(&str, u64), &str> = HashMap::new();
    for c in h.cas.iter().filter(|c| c.outcome == CasOutcome::Stored) {
        if let Some(other) = by_unique.insert((c.key.as_str(), c.read_unique), c.token.as_str()) {
            out.push(v(
                "cas_stale",
                format!("{}: cas of {other} and of {} both stored on unique {}", c.key, c.token, c.read_unique),
            ));
        }
    }
    for (key, reads) in &fin.counters {
        let values: Vec<&Option<String>> = reads.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
        for (front, r) in reads {
            if let Err(e) = r {
                out.push(v("convergence", format!("{key} could not be read on {front}: {e}")));
            }
        }
        if values.windows(2).any(|w| w[0] != w[1]) {
            let all: Vec<String> = reads.iter().map(|(f, r)| format!("{f}: {r:?}")).collect();
            out.push(v("convergence", format!("front ends disagree on {key}: {}", all.join("; "))));
            continue;
        }
        let Some(Some(final_value)) = values.first() else { continue };
        let tokens: Vec<&str> = final_value.split(',').collect();
        let pos: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
        let attempts: HashMap<&str, &super::history::CasEvent> =
            h.cas.iter().filter(|c| &c.key == key).map(|c| (c.token.as_str(), c)).collect();
        for c in attempts.values() {
            match (c.outcome, pos.get(c.token.as_str())) {
                (CasOutcome::Stored, None) => {
                    out.push(v("cas_lost", format!("{key}: the stored cas of {} is not in the final value", c.token)))
                }
                (CasOutcome::Stored | CasOutcome::Unknown, Some(p)) => {
                    let before = tokens[..*p].join(",");
                    if before != c.read_value {
                        out.push(v(
                            "cas_chain",
                            format!(
                                "{key}: {} follows {before:?} in the final value, but its cas read {:?}",
                                c.token, c.read_value
                            ),
                        ));
                    }
                }
                (CasOutcome::Exists | CasOutcome::NotFound, Some(_)) => out.push(v(
                    "cas_chain",
                    format!("{key}: {} is in the final value although its cas answered {:?}", c.token, c.outcome),
                )),
                _ => {}
            }
        }
        for t in &tokens[1..] {
            if !attempts.contains_key(t) {
                out.push(v("cas_chain", format!("{key}: token {t} in the final value was never sent")));
            }
        }
    }
}

/// The `byzantine` check: nothing the revocation covers is applied by a node or a front end
/// (no `byz/post/` key shows) or stored (so acked) by a capsule server (the leaked writer's
/// newest stored seq is below `from_seq`; a store holds each chain in order, so its head is its
/// highest seq). `byz/pre/` keys may stay: records published and applied before the revocation
/// are valid (seq below `from_seq`, epoch 0). A revocation that was never issued fails the seed
/// too (the attack would prove nothing).
fn check_byzantine(fin: &Finals, out: &mut Vec<Violation>) {
    let Some(b) = &fin.byzantine else { return };
    let v = |detail: String| v("byzantine", detail);
    for e in &b.log.errors {
        out.push(v(format!("the attack did not run as planned: {e}")));
    }
    let Some((from_epoch, from_seq)) = b.log.revoked else {
        if b.log.errors.is_empty() {
            out.push(v("the leaked writer was never revoked".into()));
        }
        return;
    };
    for (who, shown) in &b.shown {
        if let Ok(keys) = shown {
            let covered: Vec<&String> = keys.iter().filter(|k| k.starts_with(super::byzantine::COVERED)).collect();
            if !covered.is_empty() {
                let n = covered.len();
                let some: Vec<&str> = covered.iter().take(5).map(|k| k.as_str()).collect();
                out.push(v(format!(
                    "{who} applied {n} record(s) of writer {} that its revocation (from epoch {from_epoch}, seq {from_seq}) covers: {}",
                    b.log.plan.map_or(0, |p| p.writer),
                    some.join(", ")
                )));
            }
        }
    }
    for (who, head) in &b.server_heads {
        if let Ok(Some(seq)) = head {
            if *seq >= from_seq {
                out.push(v(format!(
                    "{who} stores writer {}'s records up to seq {seq}, at or past the revocation's seq bound {from_seq}",
                    b.log.plan.map_or(0, |p| p.writer)
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::*;
    use super::*;
    use std::collections::BTreeMap;

    fn w(client: u8, session: u32, index: usize, key: &str, value: Option<&str>, outcome: Outcome) -> WriteEvent {
        WriteEvent {
            client,
            session,
            index,
            key: key.into(),
            value: value.map(Into::into),
            outcome,
            at_ms: index as u64,
        }
    }

    fn state(kv: &[(&str, Option<&str>)]) -> KvState {
        kv.iter().map(|(k, v)| (k.to_string(), v.map(str::to_string))).collect()
    }

    /// Client 0 writes o0-1 three times; the second is acknowledged durable.
    fn history() -> History {
        History {
            writes: vec![
                w(0, 0, 0, "o0-1", Some("c0.0.0"), Outcome::Ok),
                w(0, 0, 1, "o0-1", Some("c0.1.0"), Outcome::Ok),
                w(0, 1, 2, "o0-1", Some("c0.2.0"), Outcome::Unknown),
                w(0, 1, 3, "o0-2", Some("c0.2.1"), Outcome::Failed),
            ],
            durables: vec![DurableEvent { client: 0, session: 0, upto: 2, at_ms: 2 }],
            ..History::default()
        }
    }

    fn finals(nodes: Vec<KvState>) -> Finals {
        Finals {
            nodes: nodes.into_iter().enumerate().map(|(i, s)| (format!("node{i}"), Ok(s))).collect(),
            ..Finals::default()
        }
    }

    fn checks(vs: &[Violation]) -> Vec<&'static str> {
        vs.iter().map(|v| v.check).collect()
    }

    #[test]
    fn the_durable_write_or_a_later_one_is_fine_an_older_one_is_lost() {
        let h = history();
        for ok in [Some("c0.1.0"), Some("c0.2.0")] {
            let s = state(&[("o0-1", ok)]);
            assert_eq!(check(&h, &finals(vec![s.clone(), s]), 1), vec![], "{ok:?}");
        }
        for bad in [Some("c0.0.0"), None] {
            let s = state(&[("o0-1", bad)]);
            assert_eq!(checks(&check(&h, &finals(vec![s.clone(), s]), 1)), vec!["durable_lost"], "{bad:?}");
        }
        // A refused write's value, or one never written: phantoms.
        let s = state(&[("o0-1", Some("c0.1.0")), ("o0-2", Some("c0.2.1"))]);
        assert_eq!(checks(&check(&h, &finals(vec![s]), 1)), vec!["phantom"]);
        let s = state(&[("o0-1", Some("c0.1.0")), ("s-1", Some("c9.9.9"))]);
        assert_eq!(checks(&check(&h, &finals(vec![s]), 1)), vec!["phantom"]);
    }

    #[test]
    fn nodes_that_differ_do_not_converge() {
        let h = history();
        let a = state(&[("o0-1", Some("c0.1.0"))]);
        let b = state(&[("o0-1", Some("c0.2.0"))]);
        assert_eq!(checks(&check(&h, &finals(vec![a, b]), 1)), vec!["convergence"]);
    }

    #[test]
    fn a_recovered_node_missing_a_durable_write_is_caught() {
        let h = history();
        let s = state(&[("o0-1", Some("c0.1.0"))]);
        let mut fin = finals(vec![s]);
        fin.recovered.push(("from server0,server1".into(), Ok(state(&[("o0-1", Some("c0.0.0"))])), BTreeMap::new()));
        assert_eq!(checks(&check(&h, &fin, 1)), vec!["recovery"]);
    }

    #[test]
    fn durable_puts_must_be_on_f_plus_one_servers() {
        let h = history();
        let s = state(&[("o0-1", Some("c0.1.0"))]);
        let mut fin = finals(vec![s]);
        let both: HashSet<(String, String)> =
            [("o0-1", "c0.0.0"), ("o0-1", "c0.1.0")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let one: HashSet<(String, String)> = [("o0-1".to_string(), "c0.0.0".to_string())].into();
        fin.server_puts = vec![("server0".into(), Ok(both.clone())), ("server1".into(), Ok(one.clone()))];
        assert_eq!(checks(&check(&h, &fin, 1)), vec!["replication"]);
        fin.server_puts.push(("server2".into(), Ok(both)));
        assert_eq!(check(&h, &fin, 1), vec![]);
    }

    #[test]
    fn reads_must_see_own_writes_and_nothing_unwritten() {
        let mut h = history();
        let read = |session, after_index, got: Option<&str>| ReadEvent {
            client: 0,
            session,
            node: 0,
            own: true,
            key: "o0-1".into(),
            got: Ok(got.map(Into::into)),
            after_index,
            at_ms: 100,
        };
        // In session 0 after write #1: exactly c0.1.0.
        h.reads = vec![read(0, 2, Some("c0.1.0"))];
        assert_eq!(check(&h, &finals(vec![]), 1), vec![]);
        h.reads = vec![read(0, 2, Some("c0.0.0"))];
        assert_eq!(checks(&check(&h, &finals(vec![]), 1)), vec!["read_your_writes"]);
        // In a later session (restarted node): at least the durable write.
        h.reads = vec![read(1, 2, Some("c0.1.0"))];
        assert_eq!(check(&h, &finals(vec![]), 1), vec![]);
        h.reads = vec![read(1, 2, None)];
        assert_eq!(checks(&check(&h, &finals(vec![]), 1)), vec!["read_your_writes"]);
        // A value read before it was written.
        let mut early = read(0, 1, Some("c0.0.0"));
        early.key = "o0-1".into();
        early.at_ms = 0;
        h.writes[0].at_ms = 50;
        h.reads = vec![early];
        assert_eq!(checks(&check(&h, &finals(vec![]), 1)), vec!["phantom"]);
    }

    #[test]
    fn lww_versions_must_not_go_below_a_durable_one_and_must_name_the_author() {
        let mut h = History::default();
        h.writes.push(w(1, 0, 0, "s-1", Some("c1.0.0"), Outcome::Ok));
        h.writes.push(w(2, 0, 0, "s-1", Some("c2.0.0"), Outcome::Ok));
        h.versions.push(VersionSeen { key: "s-1".into(), value: "c1.0.0".into(), lamport: 50, writer: 2 << 16 });
        let mut fin = finals(vec![state(&[("s-1", Some("c2.0.0"))])]);
        fin.versions.insert("s-1".into(), ("c2.0.0".into(), 60, 3 << 16));
        assert_eq!(check(&h, &fin, 1), vec![]);
        fin.versions.insert("s-1".into(), ("c2.0.0".into(), 40, 3 << 16));
        assert_eq!(checks(&check(&h, &fin, 1)), vec!["lww"]);
        fin.versions.insert("s-1".into(), ("c2.0.0".into(), 60, 2 << 16));
        assert_eq!(checks(&check(&h, &fin, 1)), vec!["lww"]);
    }

    #[test]
    fn cas_anomalies_are_caught() {
        let cas = |token: &str, read: &str, unique, outcome| CasEvent {
            client: 0,
            front: 0,
            key: "ctr-0".into(),
            read_value: read.into(),
            read_unique: unique,
            token: token.into(),
            outcome,
        };
        let mut h = History {
            cas: vec![
                cas("a", "init", 1, CasOutcome::Stored),
                cas("b", "init,a", 2, CasOutcome::Stored),
                cas("c", "init,a", 2, CasOutcome::Exists),
                cas("d", "init,a,b", 3, CasOutcome::Unknown),
            ],
            ..History::default()
        };
        let counters = |v: &str| {
            let mut m = BTreeMap::new();
            m.insert(
                "ctr-0".to_string(),
                vec![("mc0".to_string(), Ok(Some(v.to_string()))), ("mc1".to_string(), Ok(Some(v.to_string())))],
            );
            m
        };
        let fin = |v: &str| Finals { counters: counters(v), ..Finals::default() };
        assert_eq!(check(&h, &fin("init,a,b"), 1), vec![]);
        assert_eq!(check(&h, &fin("init,a,b,d"), 1), vec![]);
        assert_eq!(checks(&check(&h, &fin("init,a"), 1)), vec!["cas_lost"]);
        assert_eq!(checks(&check(&h, &fin("init,a,b,c"), 1)), vec!["cas_chain"]);
        assert_eq!(checks(&check(&h, &fin("init,b,a"), 1)), vec!["cas_chain", "cas_chain"]);
        assert_eq!(checks(&check(&h, &fin("init,a,b,z"), 1)), vec!["cas_chain"]);
        // Two stored on one unique: a stale unique.
        h.cas[2].outcome = CasOutcome::Stored;
        assert!(checks(&check(&h, &fin("init,a,b"), 1)).contains(&"cas_stale"));
    }

    #[test]
    fn memory_stores_crashes_and_stuck_nodes_are_reported() {
        let fin = Finals {
            memory: vec![("node1".into(), "memtable keys".into(), 70, 64), ("node2".into(), "rss KiB".into(), 10, 64)],
            stores: vec![("server0".into(), false, "DAMAGED".into())],
            unexpected_exits: vec!["node2 exited: signal 6".into()],
            stuck: vec![("node0".into(), "timeout".into())],
            ..Finals::default()
        };
        assert_eq!(checks(&check(&History::default(), &fin, 1)), vec!["memory", "store", "crash", "stuck"]);
    }

    fn byz_finals(shown: Vec<&str>, head: Option<u64>) -> Finals {
        let log = super::super::byzantine::AttackLog {
            plan: Some(super::super::byzantine::Plan::generate(1, 3000)),
            revoked: Some((40, 6)),
            pre_keys: vec!["byz/pre/0".into()],
            post_keys: vec!["byz/post/w0".into(), "byz/post/f0".into()],
            ..super::super::byzantine::AttackLog::default()
        };
        let b = super::super::byzantine::ByzFinals {
            log,
            shown: vec![
                ("node0".into(), Ok(shown.into_iter().map(String::from).collect())),
                ("mc0".into(), Err("unreachable".into())),
            ],
            server_heads: vec![("server0".into(), Ok(head)), ("server1".into(), Ok(None))],
            ..super::super::byzantine::ByzFinals::default()
        };
        Finals { byzantine: Some(b), ..Finals::default() }
    }

    fn byz(vs: &[Violation]) -> Vec<&str> {
        vs.iter().filter(|v| v.check == "byzantine").map(|v| v.detail.as_str()).collect()
    }

    #[test]
    fn the_checker_catches_a_covered_key_or_a_stored_covered_record() {
        let h = History::default();
        // Nothing covered anywhere; the servers hold the chain up to seq 5 (< from_seq 6).
        assert_eq!(byz(&check(&h, &byz_finals(vec!["byz/pre/0"], Some(5)), 1)), Vec::<&str>::new());
        // A node applied a record the revocation covers.
        let vs = check(&h, &byz_finals(vec!["byz/pre/0", "byz/post/f0"], Some(5)), 1);
        let d = byz(&vs);
        assert_eq!(d.len(), 1, "{vs:?}");
        assert!(d[0].contains("node0") && d[0].contains("byz/post/f0"), "{d:?}");
        // A server stored (and so acked) the record at the seq bound.
        let vs = check(&h, &byz_finals(vec![], Some(6)), 1);
        let d = byz(&vs);
        assert_eq!(d.len(), 1, "{vs:?}");
        assert!(d[0].contains("server0") && d[0].contains("seq 6"), "{d:?}");
        // A revocation never issued fails the seed.
        let mut f = byz_finals(vec![], None);
        if let Some(b) = f.byzantine.as_mut() {
            b.log.revoked = None;
        }
        assert_eq!(byz(&check(&h, &f, 1)).len(), 1);
    }
}

//! The fault schedule a seed decides: router fault rates and a timeline of faults (the
//! "nemesis"), generated from the seed alone by a self-contained PRNG, so that a replay of a
//! seed (`psl chaos --seeds 1 --start SEED`) runs exactly the same schedule on any machine and
//! any build. Pure: no I/O, no clock.
//!
//! Faults come in *episodes* (a kill and its restart, a pause and its resume, a cut and its
//! heal, a full disk and its freeing, ...), laid out on a nominal timeline within a budget that
//! keeps the promises testable: at most `f` capsule servers impaired at once (down, paused, cut
//! off, out of disk space, or restarted empty and not yet caught up), at most one coordinator,
//! one node, one front end and CapsuleDB at a time, and a router restart only when nothing else
//! is under way. The timeline is then flattened into [`Step`]s with relative delays; the runner
//! executes them in order (a step that waits, such as [`Action::AwaitCaughtUp`], delays the
//! rest, so the budget holds in real time too).

use serde::Serialize;
use std::fmt;

/// SplitMix64: tiny, fast, and fixed forever (a library RNG may change its stream between
/// versions, which would silently change what a seed replays).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5eed_c4a0_5eed_c4a0)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n.max(1) as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// An index by weight.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut x = self.below(total.max(1));
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
}

/// A process of the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "String")]
pub enum Proc {
    Router,
    /// Rank 0 is the primary, 1 the shadow.
    Coordinator(u8),
    Server(u8),
    Node(u8),
    CapsuleDb,
    /// A SecureCached front end.
    Memcached(u8),
}

impl From<Proc> for String {
    fn from(p: Proc) -> String {
        p.to_string()
    }
}

impl fmt::Display for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proc::Router => write!(f, "router"),
            Proc::Coordinator(r) => write!(f, "coord{r}"),
            Proc::Server(i) => write!(f, "server{i}"),
            Proc::Node(i) => write!(f, "node{i}"),
            Proc::CapsuleDb => write!(f, "capsuledb"),
            Proc::Memcached(i) => write!(f, "mc{i}"),
        }
    }
}

impl Proc {
    /// Whether it is attached to the fabric (through a proxy the runner can cut).
    pub fn on_fabric(self) -> bool {
        !matches!(self, Proc::Router)
    }
}

/// The deployment a schedule is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shape {
    pub servers: u8,
    pub f: u8,
    pub coordinators: u8,
    pub nodes: u8,
    pub memcached: u8,
    /// Nominal length of the fault phase.
    pub fault_ms: u64,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape { servers: 3, f: 1, coordinators: 2, nodes: 3, memcached: 2, fault_ms: 12_000 }
    }
}

/// Fault rates of the router (every link, independently), and its fault seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RouterFaults {
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub corrupt: f64,
    pub replay: f64,
    pub delay_ms: u64,
    pub seed: u64,
}

impl RouterFaults {
    /// `psl router` flags for these rates.
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for (flag, v) in [
            ("--loss", self.loss),
            ("--duplicate", self.duplicate),
            ("--reorder", self.reorder),
            ("--corrupt", self.corrupt),
            ("--replay", self.replay),
        ] {
            if v > 0.0 {
                a.extend([flag.to_string(), format!("{v}")]);
            }
        }
        if self.delay_ms > 0 {
            a.extend(["--delay".into(), "0.1".into(), "--delay-ms".into(), self.delay_ms.to_string()]);
        }
        a.extend(["--seed".into(), self.seed.to_string()]);
        a
    }
}

/// One thing the nemesis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum Action {
    /// SIGKILL.
    Kill {
        proc: Proc,
    },
    /// Start it again: with its state (`wipe: false`) or with its state directory emptied.
    /// Nodes always recover from the servers (`--recover-from`); `wipe` also loses their
    /// incarnation counter.
    Restart {
        proc: Proc,
        wipe: bool,
    },
    /// SIGSTOP / SIGCONT.
    Pause {
        proc: Proc,
    },
    Resume {
        proc: Proc,
    },
    /// Cut the process off the fabric (its proxy closes every connection and refuses new
    /// ones), and heal.
    Cut {
        proc: Proc,
    },
    Heal {
        proc: Proc,
    },
    /// Wait (bounded) until a server restarted empty holds every record the others held when
    /// it restarted: until then it counts against the fault budget.
    AwaitCaughtUp {
        server: u8,
    },
    /// Fill the server's store file system (a tmpfs mounted for it): its next append fails
    /// and it stops. Freeing the space restarts it if it stopped.
    FillDisk {
        server: u8,
    },
    FreeDisk {
        server: u8,
    },
    /// Remount the (stopped) server's store read-only, check that a start fails cleanly, and
    /// make it writable again.
    ReadOnly {
        server: u8,
    },
    ExpectStartFails {
        server: u8,
    },
    Writable {
        server: u8,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Kill { proc } => write!(f, "kill -9 {proc}"),
            Action::Restart { proc, wipe: false } => write!(f, "restart {proc} (same state)"),
            Action::Restart { proc, wipe: true } => write!(f, "restart {proc} EMPTY"),
            Action::Pause { proc } => write!(f, "SIGSTOP {proc}"),
            Action::Resume { proc } => write!(f, "SIGCONT {proc}"),
            Action::Cut { proc } => write!(f, "cut {proc} off the fabric"),
            Action::Heal { proc } => write!(f, "heal {proc}'s link"),
            Action::AwaitCaughtUp { server } => write!(f, "await server{server} caught up"),
            Action::FillDisk { server } => write!(f, "fill server{server}'s disk"),
            Action::FreeDisk { server } => write!(f, "free server{server}'s disk (restart it if it stopped)"),
            Action::ReadOnly { server } => write!(f, "server{server}'s store read-only"),
            Action::ExpectStartFails { server } => write!(f, "start server{server}: must fail cleanly"),
            Action::Writable { server } => write!(f, "server{server}'s store writable"),
        }
    }
}

/// An action and how long to wait before it (after the previous step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    pub after_ms: u64,
    #[serde(flatten)]
    pub action: Action,
}

/// Kinds of episodes, for the mix a run reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeKind {
    Crash,
    CrashWipe,
    Pause,
    Cut,
    DiskFull,
    ReadOnly,
    RouterRestart,
}

impl EpisodeKind {
    pub const ALL: [EpisodeKind; 7] = [
        EpisodeKind::Crash,
        EpisodeKind::CrashWipe,
        EpisodeKind::Pause,
        EpisodeKind::Cut,
        EpisodeKind::DiskFull,
        EpisodeKind::ReadOnly,
        EpisodeKind::RouterRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EpisodeKind::Crash => "crash",
            EpisodeKind::CrashWipe => "crash_wipe",
            EpisodeKind::Pause => "pause",
            EpisodeKind::Cut => "cut",
            EpisodeKind::DiskFull => "disk_full",
            EpisodeKind::ReadOnly => "read_only",
            EpisodeKind::RouterRestart => "router_restart",
        }
    }
}

/// One episode on the nominal timeline: a fault on `proc` from `start_ms` to `end_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Episode {
    pub kind: EpisodeKind,
    pub proc: Proc,
    pub start_ms: u64,
    pub end_ms: u64,
}

/// Everything a seed decides about faults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    pub seed: u64,
    pub shape: Shape,
    pub router: RouterFaults,
    pub episodes: Vec<Episode>,
    pub steps: Vec<Step>,
}

/// Impairment classes and how many of each may be impaired at once.
fn class(p: Proc) -> u8 {
    match p {
        Proc::Router => 0,
        Proc::Coordinator(_) => 1,
        Proc::Server(_) => 2,
        Proc::Node(_) => 3,
        Proc::CapsuleDb => 4,
        Proc::Memcached(_) => 5,
    }
}

/// Extra time a server restarted empty counts as impaired after its restart (the runner waits
/// for it to catch up right after restarting it, so this is only the nominal share).
const CATCH_UP_MS: u64 = 1500;

impl Schedule {
    /// The schedule of `seed` for `shape`.
    pub fn generate(seed: u64, shape: Shape) -> Schedule {
        let mut rng = Rng::new(seed);
        let router = RouterFaults {
            loss: rng.pick(&[0.0, 0.0, 0.01, 0.03, 0.08]),
            duplicate: rng.pick(&[0.0, 0.01, 0.03]),
            reorder: rng.pick(&[0.0, 0.02, 0.1]),
            corrupt: rng.pick(&[0.0, 0.0, 0.01]),
            replay: rng.pick(&[0.0, 0.0, 0.01]),
            delay_ms: rng.pick(&[0, 0, 5, 20]),
            seed,
        };
        let mut episodes: Vec<Episode> = Vec::new();
        let mut t = rng.range(300, 900);
        while t < shape.fault_ms {
            if let Some(e) = Self::episode(&mut rng, shape, t, &episodes) {
                episodes.push(e);
            }
            t += rng.range(150, 900);
        }
        let steps = Self::flatten(&episodes);
        Schedule { seed, shape, router, episodes, steps }
    }

    /// Processes of `shape` that faults may hit, by kind.
    fn targets(shape: Shape, kind: EpisodeKind) -> Vec<Proc> {
        let servers = (0..shape.servers).map(Proc::Server);
        let coords = (0..shape.coordinators).map(Proc::Coordinator);
        let nodes = (0..shape.nodes).map(Proc::Node);
        let mcs = (0..shape.memcached).map(Proc::Memcached);
        // A SecureCached front end is the home of its keys' conditional commands. With static
        // homes (fewer than three front ends) a restarted home that arbitrated before catching
        // up could let a cas succeed on a stale unique, so front ends are paused and cut off,
        // never killed. Three or more fail homes over (docs/protocol/memcached.md §6): a killed
        // home's slots move, and it takes them back after a quarantine and a hand-over, so
        // they are killed and restarted too (with their state directories).
        let killable_mcs: Vec<Proc> = if usize::from(shape.memcached) >= psl_memcached::failover::MEMBERS_MIN {
            mcs.clone().collect()
        } else {
            Vec::new()
        };
        match kind {
            EpisodeKind::Crash => {
                servers.chain(coords).chain(nodes).chain(std::iter::once(Proc::CapsuleDb)).chain(killable_mcs).collect()
            }
            EpisodeKind::CrashWipe => servers.chain(nodes).chain(std::iter::once(Proc::CapsuleDb)).collect(),
            EpisodeKind::Pause | EpisodeKind::Cut => {
                servers.chain(coords).chain(nodes).chain(std::iter::once(Proc::CapsuleDb)).chain(mcs).collect()
            }
            EpisodeKind::DiskFull | EpisodeKind::ReadOnly => servers.collect(),
            EpisodeKind::RouterRestart => vec![Proc::Router],
        }
    }

    /// An episode starting at `t` that fits the budget, if any does.
    fn episode(rng: &mut Rng, shape: Shape, t: u64, so_far: &[Episode]) -> Option<Episode> {
        let active: Vec<&Episode> = so_far.iter().filter(|e| e.end_ms >= t).collect();
        let weights = [30, 12, 20, 20, 6, 4, 3];
        let kind = EpisodeKind::ALL[rng.weighted(&weights)];
        if kind == EpisodeKind::RouterRestart && !active.is_empty() {
            return None;
        }
        if active.iter().any(|e| e.kind == EpisodeKind::RouterRestart) {
            return None;
        }
        let free: Vec<Proc> = Self::targets(shape, kind)
            .into_iter()
            .filter(|p| {
                let busy = active.iter().filter(|e| class(e.proc) == class(*p)).count();
                let cap = if class(*p) == class(Proc::Server(0)) { shape.f as usize } else { 1 };
                busy < cap && !active.iter().any(|e| e.proc == *p)
            })
            .collect();
        if free.is_empty() {
            return None;
        }
        let proc = rng.pick(&free);
        let len = match kind {
            EpisodeKind::Crash | EpisodeKind::CrashWipe => rng.range(200, 2500),
            EpisodeKind::Pause => rng.range(100, 2000),
            EpisodeKind::Cut => rng.range(200, 3000),
            EpisodeKind::DiskFull => rng.range(500, 2500),
            EpisodeKind::ReadOnly => rng.range(300, 1200),
            EpisodeKind::RouterRestart => rng.range(200, 1500),
        };
        let tail = if kind == EpisodeKind::CrashWipe && matches!(proc, Proc::Server(_)) { CATCH_UP_MS } else { 0 };
        Some(Episode { kind, proc, start_ms: t, end_ms: t + len + tail })
    }

    /// The episodes as steps in time order, each with its delay after the previous one.
    fn flatten(episodes: &[Episode]) -> Vec<Step> {
        // (time, order within an episode, action)
        let mut timed: Vec<(u64, u8, Action)> = Vec::new();
        for e in episodes {
            let (s, end) = (e.start_ms, e.end_ms);
            let server = match e.proc {
                Proc::Server(i) => Some(i),
                _ => None,
            };
            match (e.kind, server) {
                (EpisodeKind::Crash, _) => {
                    timed.push((s, 0, Action::Kill { proc: e.proc }));
                    timed.push((end, 1, Action::Restart { proc: e.proc, wipe: false }));
                }
                (EpisodeKind::CrashWipe, Some(i)) => {
                    let up = end - CATCH_UP_MS;
                    timed.push((s, 0, Action::Kill { proc: e.proc }));
                    timed.push((up, 1, Action::Restart { proc: e.proc, wipe: true }));
                    timed.push((up, 2, Action::AwaitCaughtUp { server: i }));
                }
                (EpisodeKind::CrashWipe, None) => {
                    timed.push((s, 0, Action::Kill { proc: e.proc }));
                    timed.push((end, 1, Action::Restart { proc: e.proc, wipe: true }));
                }
                (EpisodeKind::Pause, _) => {
                    timed.push((s, 0, Action::Pause { proc: e.proc }));
                    timed.push((end, 1, Action::Resume { proc: e.proc }));
                }
                (EpisodeKind::Cut, _) => {
                    timed.push((s, 0, Action::Cut { proc: e.proc }));
                    timed.push((end, 1, Action::Heal { proc: e.proc }));
                }
                (EpisodeKind::DiskFull, Some(i)) => {
                    timed.push((s, 0, Action::FillDisk { server: i }));
                    timed.push((end, 1, Action::FreeDisk { server: i }));
                }
                (EpisodeKind::ReadOnly, Some(i)) => {
                    let mid = s + (end - s) / 2;
                    timed.push((s, 0, Action::Kill { proc: e.proc }));
                    timed.push((s, 1, Action::ReadOnly { server: i }));
                    timed.push((mid, 2, Action::ExpectStartFails { server: i }));
                    timed.push((mid, 3, Action::Writable { server: i }));
                    timed.push((end, 4, Action::Restart { proc: e.proc, wipe: false }));
                }
                (EpisodeKind::RouterRestart, _) => {
                    timed.push((s, 0, Action::Kill { proc: Proc::Router }));
                    timed.push((end, 1, Action::Restart { proc: Proc::Router, wipe: false }));
                }
                (EpisodeKind::DiskFull | EpisodeKind::ReadOnly, None) => {}
            }
        }
        // Stable: equal times keep episode order, then the order within the episode.
        timed.sort_by_key(|(t, o, _)| (*t, *o));
        let mut last = 0;
        timed
            .into_iter()
            .map(|(t, _, action)| {
                let after_ms = t - last;
                last = t;
                Step { after_ms, action }
            })
            .collect()
    }

    /// How many episodes of each kind.
    pub fn mix(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let mut m = std::collections::BTreeMap::new();
        for e in &self.episodes {
            *m.entry(e.kind.name()).or_insert(0) += 1;
        }
        m
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.router;
        writeln!(
            f,
            "seed {}: router loss {} duplicate {} reorder {} corrupt {} replay {} delay {} ms",
            self.seed, r.loss, r.duplicate, r.reorder, r.corrupt, r.replay, r.delay_ms
        )?;
        let mut t = 0;
        for s in &self.steps {
            t += s.after_ms;
            writeln!(f, "  t+{t:>6} ms  {}", s.action)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_the_schedule_exactly() {
        for seed in [0, 1, 7, 12345, u64::MAX] {
            let a = Schedule::generate(seed, Shape::default());
            let b = Schedule::generate(seed, Shape::default());
            assert_eq!(a, b);
            assert_eq!(a.to_string(), b.to_string());
        }
        let differ = (0..20)
            .filter(|s| {
                Schedule::generate(*s, Shape::default()).steps != Schedule::generate(s + 1, Shape::default()).steps
            })
            .count();
        assert!(differ >= 18, "seeds barely change the schedule");
    }

    #[test]
    fn the_rng_stream_is_fixed() {
        // A replay must not depend on any library's RNG version: this stream never changes.
        let mut r = Rng::new(42);
        let v: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        let mut again = Rng::new(42);
        assert_eq!(v, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
        assert!(v.iter().all(|x| *x != 0) && v[0] != v[1]);
        for n in [1, 2, 3, 10, 1000] {
            assert!((0..1000).all(|_| r.below(n) < n));
        }
    }

    /// Replays the steps and tracks who is impaired when: every schedule heals everything it
    /// breaks, and never impairs more than the budget allows at once.
    #[test]
    fn every_schedule_heals_what_it_breaks_and_stays_within_the_budget() {
        let shape = Shape::default();
        let mut kinds = std::collections::HashSet::new();
        for seed in 0..2000 {
            let s = Schedule::generate(seed, shape);
            let mut down: std::collections::BTreeSet<Proc> = Default::default();
            let mut impaired: std::collections::BTreeSet<Proc> = Default::default();
            let mut full: std::collections::BTreeSet<u8> = Default::default();
            let mut ro: std::collections::BTreeSet<u8> = Default::default();
            for st in &s.steps {
                match st.action {
                    Action::Kill { proc } => {
                        assert!(down.insert(proc), "seed {seed}: {proc} killed twice");
                        impaired.insert(proc);
                    }
                    Action::Restart { proc, wipe } => {
                        assert!(down.remove(&proc), "seed {seed}: {proc} restarted while up");
                        if let (Proc::Server(i), false) = (proc, wipe) {
                            assert!(!ro.contains(&i), "seed {seed}: restarted on a read-only store");
                        }
                        if !(wipe && matches!(proc, Proc::Server(_))) {
                            impaired.remove(&proc);
                        }
                    }
                    Action::AwaitCaughtUp { server } => assert!(impaired.remove(&Proc::Server(server))),
                    Action::Pause { proc } | Action::Cut { proc } => assert!(impaired.insert(proc)),
                    Action::Resume { proc } | Action::Heal { proc } => assert!(impaired.remove(&proc)),
                    Action::FillDisk { server } => {
                        assert!(full.insert(server));
                        impaired.insert(Proc::Server(server));
                    }
                    Action::FreeDisk { server } => {
                        assert!(full.remove(&server));
                        impaired.remove(&Proc::Server(server));
                    }
                    Action::ReadOnly { server } => {
                        assert!(down.contains(&Proc::Server(server)));
                        ro.insert(server);
                    }
                    Action::ExpectStartFails { server } => assert!(ro.contains(&server)),
                    Action::Writable { server } => assert!(ro.remove(&server)),
                }
                kinds.insert(std::mem::discriminant(&st.action));
                let servers = impaired.iter().filter(|p| matches!(p, Proc::Server(_))).count();
                assert!(servers <= shape.f as usize, "seed {seed}: {servers} servers impaired at once");
                for c in 0..=5u8 {
                    if c == 2 {
                        continue;
                    }
                    let n = impaired.iter().filter(|p| class(**p) == c).count();
                    assert!(n <= 1, "seed {seed}: {n} processes of class {c} impaired at once");
                }
                if impaired.contains(&Proc::Router) {
                    assert_eq!(impaired.len(), 1, "seed {seed}: a router restart overlaps another fault");
                }
            }
            assert!(down.is_empty() && impaired.is_empty() && full.is_empty() && ro.is_empty(), "seed {seed}: {s}");
            assert!(s.steps.iter().map(|s| s.after_ms).sum::<u64>() < shape.fault_ms + 10_000);
        }
        assert_eq!(kinds.len(), 12, "every kind of step appears in 2000 seeds");
    }

    #[test]
    fn front_ends_are_killed_only_when_their_homes_fail_over() {
        for seed in 0..500 {
            for st in Schedule::generate(seed, Shape::default()).steps {
                if let Action::Kill { proc: Proc::Memcached(_) } = st.action {
                    panic!("seed {seed} kills a front end of a group with static homes");
                }
            }
        }
        let three = Shape { memcached: 3, ..Shape::default() };
        let kills = (0..500)
            .flat_map(|seed| Schedule::generate(seed, three).steps)
            .filter(|st| matches!(st.action, Action::Kill { proc: Proc::Memcached(_) }))
            .count();
        assert!(kills > 0, "no seed kills a front end of a group that fails over");
    }
}

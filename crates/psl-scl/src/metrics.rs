//! Counters of a node, rejections by reason, rendered as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why an incoming message or record was not applied. Names are stable metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    /// Verifier reasons (see `psl_capsule::Reason::name`).
    ///
    /// This one: a record's bytes do not decode under the capsule's limits.
    Encoding,
    /// A record or message for another capsule.
    Capsule,
    /// A record whose writer index has no derivable key, a record signed by a capsule server's
    /// key (servers sign acks only), or an ack from a server this node does not count.
    Writer,
    /// A record under a key generation unknown here or not yet in force at its epoch, or a
    /// refused rotation certificate.
    KeyGeneration,
    /// A record of a kind its writer may not write (coordinator kinds from a non-coordinator).
    Kind,
    /// A record whose header or links break the format's structural rules.
    Structure,
    /// A record's or an ack's signature that does not verify under its writer's key.
    Signature,
    /// A record body that does not decrypt under the application data key.
    Decryption,
    /// A decrypted body (or a Rotate record's certificate) that does not decode.
    Body,
    /// A SYNC naming an application key other than the one in force.
    KeyFingerprint,
    /// A record signed with an application key generation retired at or before its epoch.
    RetiredKey,
    /// A message that is not a valid wire message.
    BadMessage,
    /// A record already applied, arriving again.
    Duplicate,
    /// A record already applied, from an epoch before the current one (a replay).
    StaleEpoch,
    /// A different record for a (writer, seq) already applied, or a chain that does not link.
    Equivocation,
    /// A writer's epoch going backwards along its chain.
    EpochRegression,
    /// A SYNC whose epoch is not newer than the one in force.
    StaleSync,
    /// The hold-back buffer was full.
    HoldFull,
    /// The verify queue was full (the node is overloaded); repair fetches it again.
    Overload,
    /// A record whose writer has no certificate, after its hold-back wait (certified capsules).
    Uncertified,
    /// A record outside its writer's certificate's epochs.
    CertWindow,
    /// A record of a revoked writer at or after the revocation's epoch.
    Revoked,
    /// A Cert record carrying a statement the application key did not sign.
    Certificate,
}

impl RejectReason {
    /// Every reason, in metric output order.
    pub const ALL: [RejectReason; 23] = [
        RejectReason::Encoding,
        RejectReason::Capsule,
        RejectReason::Writer,
        RejectReason::KeyGeneration,
        RejectReason::Kind,
        RejectReason::Structure,
        RejectReason::Signature,
        RejectReason::Decryption,
        RejectReason::Body,
        RejectReason::KeyFingerprint,
        RejectReason::RetiredKey,
        RejectReason::BadMessage,
        RejectReason::Duplicate,
        RejectReason::StaleEpoch,
        RejectReason::Equivocation,
        RejectReason::EpochRegression,
        RejectReason::StaleSync,
        RejectReason::HoldFull,
        RejectReason::Overload,
        RejectReason::Uncertified,
        RejectReason::CertWindow,
        RejectReason::Revoked,
        RejectReason::Certificate,
    ];

    /// The reason's stable metric label (`reason="…"`), in kebab case.
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::Encoding => "encoding",
            RejectReason::Capsule => "capsule",
            RejectReason::Writer => "writer",
            RejectReason::KeyGeneration => "key-generation",
            RejectReason::Kind => "kind",
            RejectReason::Structure => "structure",
            RejectReason::Signature => "signature",
            RejectReason::Decryption => "decryption",
            RejectReason::Body => "body",
            RejectReason::KeyFingerprint => "key-fingerprint",
            RejectReason::RetiredKey => "retired-key",
            RejectReason::BadMessage => "bad-message",
            RejectReason::Duplicate => "duplicate",
            RejectReason::StaleEpoch => "stale-epoch",
            RejectReason::Equivocation => "equivocation",
            RejectReason::EpochRegression => "epoch-regression",
            RejectReason::StaleSync => "stale-sync",
            RejectReason::HoldFull => "hold-full",
            RejectReason::Overload => "overload",
            RejectReason::Uncertified => "uncertified",
            RejectReason::CertWindow => "cert-window",
            RejectReason::Revoked => "revoked",
            RejectReason::Certificate => "certificate",
        }
    }

    /// Maps a verifier rejection.
    pub fn from_verifier(r: &psl_capsule::Reason) -> RejectReason {
        use psl_capsule::Reason as R;
        match r {
            R::Encoding(_) => RejectReason::Encoding,
            R::Capsule { .. } => RejectReason::Capsule,
            R::Writer(_) => RejectReason::Writer,
            R::KeyGeneration(_) => RejectReason::KeyGeneration,
            R::KindNotAllowed { .. } => RejectReason::Kind,
            R::Structure(_) => RejectReason::Structure,
            R::Signature(_) => RejectReason::Signature,
            R::Decryption => RejectReason::Decryption,
            R::Body(_) => RejectReason::Body,
            R::KeyFingerprint { .. } => RejectReason::KeyFingerprint,
            R::RetiredKey { .. } => RejectReason::RetiredKey,
            R::Uncertified { .. } => RejectReason::Uncertified,
            R::CertWindow { .. } => RejectReason::CertWindow,
            R::Revoked { .. } => RejectReason::Revoked,
            R::Certificate(_) => RejectReason::Certificate,
        }
    }

    fn index(self) -> usize {
        RejectReason::ALL.iter().position(|r| *r == self).expect("every reason is listed")
    }
}

/// A node's counters. Shared between threads; every field is a relaxed atomic.
#[derive(Debug, Default)]
pub struct Metrics {
    rejected: [AtomicU64; 23],
    /// Records verified and applied in per-writer order (not this node's own new records).
    pub records_applied: AtomicU64,
    /// Data ops (puts and deletes) in the applied records, counted even where no values are kept.
    pub ops_applied: AtomicU64,
    /// Own records written and published (data, control and CapsuleDB records).
    pub records_written: AtomicU64,
    /// Data ops in the own data records written.
    pub ops_written: AtomicU64,
    /// Records put in the hold-back buffer to wait for an earlier seq of their writer.
    pub records_held: AtomicU64,
    /// Repair requests published (one per missing seq range asked for).
    pub repair_requests_sent: AtomicU64,
    /// Of those, first tries asked of the records' writer only (`origin_only`).
    pub repair_requests_origin: AtomicU64,
    /// Records published from the repair cache in answer to repair requests.
    pub repair_records_sent: AtomicU64,
    /// SYNC records applied (each moves the node into a new epoch).
    pub syncs_applied: AtomicU64,
    /// Withholding reports: a writer's gap that repair could not fill within `withholding_after_ms`.
    pub withholding_reports: AtomicU64,
    /// Messages dropped because the outbound ring stayed full (the host side stalled).
    pub outbound_dropped: AtomicU64,
    /// The epoch in force: that of the newest SYNC applied (a gauge).
    pub epoch: AtomicU64,
    /// Newest application key generation installed (0: never rotated).
    pub key_gen: AtomicU64,
    /// Bytes of records the node keeps to answer repairs (`NodeConfig::cache_bytes_max`).
    pub repair_cache_bytes: AtomicU64,
    /// Writes that waited for capsule servers' acks (flow control; `psl_node::flow`).
    pub flow_waits: AtomicU64,
    /// Times a writer's flow window opened because no quorum acked while it waited.
    pub flow_opened: AtomicU64,
}

impl Metrics {
    /// Counts one rejection for reason `r`.
    pub fn reject(&self, r: RejectReason) {
        self.rejected[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Rejections counted so far for reason `r`.
    pub fn rejected(&self, r: RejectReason) -> u64 {
        self.rejected[r.index()].load(Ordering::Relaxed)
    }

    /// Adds `n` to counter `c`.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value of counter `c`.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self, prefix: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# TYPE {prefix}_rejected_total counter");
        for r in RejectReason::ALL {
            let _ = writeln!(s, "{prefix}_rejected_total{{reason=\"{}\"}} {}", r.name(), self.rejected(r));
        }
        for (name, c) in [
            ("records_applied_total", &self.records_applied),
            ("ops_applied_total", &self.ops_applied),
            ("records_written_total", &self.records_written),
            ("ops_written_total", &self.ops_written),
            ("records_held_total", &self.records_held),
            ("outbound_dropped_total", &self.outbound_dropped),
            ("repair_requests_sent_total", &self.repair_requests_sent),
            ("repair_requests_origin_total", &self.repair_requests_origin),
            ("repair_records_sent_total", &self.repair_records_sent),
            ("syncs_applied_total", &self.syncs_applied),
            ("withholding_reports_total", &self.withholding_reports),
            ("flow_waits_total", &self.flow_waits),
            ("flow_opened_total", &self.flow_opened),
            ("epoch", &self.epoch),
            ("key_gen", &self.key_gen),
            ("repair_cache_bytes", &self.repair_cache_bytes),
        ] {
            let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
            let _ = writeln!(s, "# TYPE {prefix}_{name} {kind}");
            let _ = writeln!(s, "{prefix}_{name} {}", Metrics::get(c));
        }
        s
    }
}

/// Appends counters to Prometheus text: `# HELP`, `# TYPE … counter` and the sample of each
/// `(name, help, value)`, named `{prefix}_{name}_total` (the roles' stats structs share it).
pub fn render_counters(out: &mut String, prefix: &str, counters: &[(&str, &str, u64)]) {
    for (name, help, v) in counters {
        let _ = write!(out, "# HELP {prefix}_{name}_total {help}\n# TYPE {prefix}_{name}_total counter\n");
        let _ = writeln!(out, "{prefix}_{name}_total {v}");
    }
}

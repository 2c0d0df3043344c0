//! The coordinator's writer as the engine drives it: it introduces itself (its certificate)
//! before its first other record, writes RTS, SYNC, Cert and Rotate records when the
//! [`NodeCore`](crate::NodeCore) asks, and makes each one durable in its own-chain log before
//! the record may be published. A record that cannot be logged is dropped unpublished and the
//! writer stops: after a restart it could no longer tell which seqs it had let out (a shadow
//! coordinator takes over meanwhile).

use psl_capsule::{Author, Head, Record, RotationCert, SealError};
use psl_crypto::{DataKey, SigningKey};

/// Where a coordinator's own records become durable before they are published: the runtime's
/// fsync'd chain log, or the simulator's in-memory one that outlives a simulated crash.
pub trait CoordinatorLog: Send {
    /// Appends one record; returns only once it is durable.
    fn append(&mut self, rec: &Record) -> Result<(), String>;
}

/// Why the coordinator writer did not produce a record.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorWriteError {
    /// The author refused to seal the record (nothing was written; the writer goes on).
    #[error("cannot seal the {what} record: {source}")]
    Seal {
        /// The kind of record: `"RTS"`, `"SYNC"`, `"Cert"`, `"Rotate"`, …
        what: &'static str,
        /// Why sealing failed.
        source: SealError,
    },
    /// The sealed record could not be appended to the own-chain log: it is dropped unpublished
    /// and the coordinator writer stops.
    #[error("coordinator stopped: cannot persist its {what} record (writer {writer}, seq {seq}): {reason}")]
    Persist {
        /// The kind of record: `"RTS"`, `"SYNC"`, `"Cert"`, `"Rotate"`, …
        what: &'static str,
        /// The coordinator's writer index.
        writer: u32,
        /// The record's sequence number, now lost.
        seq: u64,
        /// The log's error.
        reason: String,
    },
}

pub(crate) struct CoordinatorWriter {
    pub(crate) author: Author,
    /// Whether it has carried its own certificate into its chain in this process.
    pub(crate) introduced: bool,
    /// The generation the writer has been given keys for (it switches to them only at the
    /// rotation epoch; `Author::key_gen` is the one it signs with now).
    pub(crate) next_gen: u32,
    log: Option<Box<dyn CoordinatorLog>>,
}

impl CoordinatorWriter {
    pub(crate) fn new(author: Author, log: Option<Box<dyn CoordinatorLog>>) -> CoordinatorWriter {
        CoordinatorWriter { author, introduced: false, next_gen: 0, log }
    }

    /// Seals one record with `seal` and logs it: the record is returned only once durable.
    pub(crate) fn write(
        &mut self,
        what: &'static str,
        seal: impl FnOnce(&mut Author) -> Result<Record, SealError>,
    ) -> Result<Record, CoordinatorWriteError> {
        let rec = seal(&mut self.author).map_err(|source| CoordinatorWriteError::Seal { what, source })?;
        if let Some(log) = &mut self.log {
            log.append(&rec).map_err(|reason| CoordinatorWriteError::Persist {
                what,
                writer: rec.header().writer,
                seq: rec.header().seq,
                reason,
            })?;
        }
        Ok(rec)
    }

    /// The generation it holds keys for (the one it signs with, or a scheduled newer one).
    pub(crate) fn key_gen(&self) -> u32 {
        self.author.key_gen().max(self.next_gen)
    }

    /// Schedules the writer's key for a rotation it does not hold yet; false if it already does.
    pub(crate) fn schedule_rotation(
        &mut self,
        cert: &RotationCert,
        key: SigningKey,
        data_key: Option<DataKey>,
    ) -> Result<bool, String> {
        if self.author.key_gen() >= cert.key_gen || self.next_gen >= cert.key_gen {
            return Ok(false);
        }
        let dk = data_key.ok_or("the coordinator's rotation needs the new data key")?;
        self.author.schedule_rotation(cert, key, dk).map_err(|e| format!("coordinator key: {e}"))?;
        self.next_gen = cert.key_gen;
        Ok(true)
    }

    /// The rejoin period is over: continue the chain after `head`, never back (a writer that
    /// already signed past it keeps its place).
    pub(crate) fn resume(&mut self, head: &Head) {
        if self.author.writer() == head.writer && head.seq >= self.author.next_seq() {
            self.author.resume(head);
        }
    }
}

//! Moving records between a store and the portable capsule file (`.capsule`).

use crate::error::StoreError;
use crate::report::AppendOutcome;
use crate::store::{DiskStore, METADATA_FILE};
use psl_capsule::file::{self, CapsuleFile};
use psl_capsule::{Record, Verified};
use psl_crypto::DataKey;
use std::path::Path;

impl DiskStore {
    /// The capsule file of everything the store holds, records in chain order, each read back
    /// and re-verified on the way out.
    pub fn export(&self) -> Result<Vec<u8>, StoreError> {
        let recs = self.records_in_chain_order()?;
        Ok(file::encode(self.metadata(), recs.iter().map(|r| &**r)))
    }

    /// Imports a parsed capsule file of this capsule: verifies every record the store does not
    /// hold yet with the store's verifier, sorts them into chain order (writer, seq) and appends
    /// them as one batch. Records already held are skipped. All or nothing: a record that fails
    /// verification or does not extend its chain refuses the whole import.
    pub fn import(&mut self, file: &CapsuleFile) -> Result<AppendOutcome, StoreError> {
        self.writable()?;
        if file.metadata.name() != self.name() {
            return Err(StoreError::WrongCapsule { expected: self.name(), found: file.metadata.name() });
        }
        let mut known = 0;
        // Certificates first: a file may hold a record before its writer's certificate.
        self.verifier().learn_statements(&file.records);
        let mut recs: Vec<Verified<Record>> = Vec::with_capacity(file.records.len());
        for (index, r) in file.records.iter().enumerate() {
            if self.contains(&r.hash())? {
                known += 1;
                continue;
            }
            recs.push(
                self.verifier()
                    .verify(r.clone())
                    .map_err(|source| StoreError::Rejected { index, source: Box::new(source) })?,
            );
        }
        recs.sort_by_key(|r| (r.header().writer, r.header().seq, r.hash()));
        let mut out = self.append(&recs)?;
        out.duplicates += known;
        Ok(out)
    }
}

/// Imports the capsule file `bytes` into the store in `dir`, creating the store from the
/// file's metadata if `dir` holds none yet.
pub fn import_into(
    dir: impl AsRef<Path>,
    bytes: &[u8],
    data_key: Option<DataKey>,
) -> Result<(DiskStore, AppendOutcome), StoreError> {
    let dir = dir.as_ref();
    let file = CapsuleFile::parse(bytes)?;
    let mut store = if dir.join(METADATA_FILE).exists() {
        DiskStore::open(dir, data_key)?.0
    } else {
        DiskStore::create(dir, file.metadata.clone(), data_key)?
    };
    let out = store.import(&file)?;
    Ok((store, out))
}

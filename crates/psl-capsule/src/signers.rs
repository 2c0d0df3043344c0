//! [`SignPool`]: threads that sign a batch of record hashes alongside the calling thread, for
//! [`Author::write_bodies`](crate::Author::write_bodies).
//!
//! A record's hash does not cover its signature, so a writer seals a run of records in chain
//! order (each `prev` is the hash of the one before) and signs them afterwards, in any order
//! and on several threads. Signatures are deterministic (RFC 6979), so the records are the
//! same bytes whichever thread signed them.
//!
//! The signing key is shared with the helpers as an `Arc<SigningKey>` for the length of one
//! batch: the scalar stays in the key's one zeroized allocation (no copy is made), and a helper
//! drops its reference before it hands back its signatures. Each helper thread keeps its own
//! blinded libsecp256k1 context (`psl_crypto`'s per-thread signer), made once for the pool's
//! life rather than once per batch.

use psl_crypto::{Hash256, Signature, SigningKey};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// One batch being signed: every participant (the caller and the helpers sent the batch)
/// claims the next unsigned hash until none is left, so a slow or descheduled thread delays
/// the batch by one signature at most.
struct Batch {
    key: Arc<SigningKey>,
    hashes: Vec<Hash256>,
    next: AtomicUsize,
}

impl Batch {
    /// Signs claimed hashes until every hash is claimed; `(position, signature)` pairs.
    fn claim_and_sign(&self) -> Vec<(usize, Signature)> {
        let mut out = Vec::new();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(h) = self.hashes.get(i) else { return out };
            out.push((i, self.key.sign(h)));
        }
    }
}

/// A batch for one helper, and where it sends the signatures it made.
type Job = (Arc<Batch>, mpsc::Sender<Vec<(usize, Signature)>>);

/// A pool of signing threads: [`SignPool::sign_all`] signs on the calling thread and up to
/// `threads - 1` helper threads, which wait for work between batches. Dropping the pool stops
/// and joins the helpers. Safe to share: concurrent batches interleave on the helpers.
pub struct SignPool {
    helpers: Vec<mpsc::Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for SignPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SignPool(threads={})", self.threads())
    }
}

impl SignPool {
    /// A pool signing on `threads` threads in all: the caller's and `threads - 1` helpers
    /// (none for `threads <= 1`: every batch is then signed on the calling thread). Fails only
    /// if the OS refuses a thread.
    pub fn new(threads: usize) -> std::io::Result<SignPool> {
        let mut pool = SignPool { helpers: Vec::new(), handles: Vec::new() };
        for i in 1..threads {
            let (tx, rx) = mpsc::channel::<Job>();
            let handle = std::thread::Builder::new().name(format!("psl-sign-{i}")).spawn(move || helper(rx))?;
            pool.helpers.push(tx);
            pool.handles.push(handle);
        }
        Ok(pool)
    }

    /// Threads a batch is signed on at most, the caller's included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Signs every hash with `key`; the signatures in the order of `hashes`. A single hash is
    /// signed on the calling thread with no helper involved. A helper that is gone (it
    /// panicked) leaves its share to the others: this never fails.
    pub fn sign_all(&self, key: &Arc<SigningKey>, hashes: Vec<Hash256>) -> Vec<Signature> {
        let n = hashes.len();
        let helpers = self.helpers.len().min(n.saturating_sub(1));
        if helpers == 0 {
            return hashes.iter().map(|h| key.sign(h)).collect();
        }
        let batch = Arc::new(Batch { key: key.clone(), hashes, next: AtomicUsize::new(0) });
        let (tx, rx) = mpsc::channel();
        for h in &self.helpers[..helpers] {
            // A helper that is gone cannot claim anything: the others sign its share.
            let _ = h.send((batch.clone(), tx.clone()));
        }
        drop(tx);
        let mut sigs: Vec<Option<Signature>> = vec![None; n];
        let mut got = 0;
        let mut take = |part: Vec<(usize, Signature)>| {
            got += part.len();
            for (i, s) in part {
                sigs[i] = Some(s);
            }
            got
        };
        let mut have = take(batch.claim_and_sign());
        // Every hash is claimed now; wait for the helpers' claims. `recv` fails once every
        // helper has answered or is gone (each drops its sender after answering).
        while have < n {
            match rx.recv() {
                Ok(part) => have = take(part),
                Err(_) => break,
            }
        }
        // Anything a vanished helper had claimed is signed here.
        sigs.into_iter().zip(&batch.hashes).map(|(s, h)| s.unwrap_or_else(|| key.sign(h))).collect()
    }
}

impl Drop for SignPool {
    fn drop(&mut self) {
        // Closing its channel ends each helper's loop.
        self.helpers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A helper thread: signs its claims of each batch it is sent until the pool is dropped.
fn helper(jobs: mpsc::Receiver<Job>) {
    while let Ok((batch, reply)) = jobs.recv() {
        let part = batch.claim_and_sign();
        // The key's reference goes before the answer: once the caller has every answer, no
        // helper holds the key.
        drop(batch);
        let _ = reply.send(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_signs_as_the_key_does_in_order_whatever_the_batch() {
        let key = Arc::new(SigningKey::from_bytes(&[0x31; 32]).unwrap());
        for threads in [0, 1, 2, 3] {
            let pool = SignPool::new(threads).unwrap();
            assert_eq!(pool.threads(), threads.max(1));
            for n in [0usize, 1, 2, 5, 40] {
                let hashes: Vec<Hash256> = (0..n).map(|i| psl_crypto::sha256(&[&i.to_le_bytes()])).collect();
                let want: Vec<Signature> = hashes.iter().map(|h| key.sign(h)).collect();
                assert_eq!(pool.sign_all(&key, hashes), want, "threads {threads}, batch of {n}");
            }
        }
    }

    #[test]
    fn no_helper_keeps_the_key_after_a_batch() {
        let key = Arc::new(SigningKey::from_bytes(&[0x32; 32]).unwrap());
        let pool = SignPool::new(3).unwrap();
        let hashes: Vec<Hash256> = (0u32..64).map(|i| psl_crypto::sha256(&[&i.to_le_bytes()])).collect();
        let _ = pool.sign_all(&key, hashes);
        drop(pool); // joins the helpers
        assert_eq!(Arc::strong_count(&key), 1);
    }

    #[test]
    fn concurrent_batches_share_one_pool() {
        let key = Arc::new(SigningKey::from_bytes(&[0x33; 32]).unwrap());
        let pool = SignPool::new(2).unwrap();
        std::thread::scope(|s| {
            for t in 0u32..3 {
                let (pool, key) = (&pool, &key);
                s.spawn(move || {
                    for round in 0u32..5 {
                        let hashes: Vec<Hash256> = (0u32..9)
                            .map(|i| psl_crypto::sha256(&[&[t as u8, round as u8], &i.to_le_bytes()]))
                            .collect();
                        let want: Vec<Signature> = hashes.iter().map(|h| key.sign(h)).collect();
                        assert_eq!(pool.sign_all(key, hashes), want);
                    }
                });
            }
        });
    }
}

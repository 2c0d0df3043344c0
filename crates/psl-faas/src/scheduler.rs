//! The scheduler (untrusted): a registry of workers and their idleness; it forwards sealed jobs
//! and never holds a key or a plaintext byte.

use crate::program::{JobId, SealedProgram};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// A job as the scheduler sees it: sealed bytes and public configuration.
#[derive(Clone, Debug)]
pub struct SealedJob {
    /// The job id.
    pub job: JobId,
    /// The sealed program (the scheduler cannot open it).
    pub program: SealedProgram,
    /// The sealed input, if any.
    pub input: Option<SealedProgram>,
    /// How many lambdas the job runs in all.
    pub lambdas: u32,
}

type Tamper = Box<dyn Fn(&mut SealedJob) + Send + Sync>;

/// The untrusted scheduler of the embedded deployment: which workers are idle; it hands out
/// sealed jobs and never holds a key.
#[derive(Default)]
pub struct Scheduler {
    idle: Mutex<BTreeMap<u32, bool>>,
    /// Test hook: what a malicious scheduler does to a job before forwarding it.
    tamper: Mutex<Option<Tamper>>,
}

impl Scheduler {
    /// A scheduler with no worker registered.
    pub fn new() -> Scheduler {
        Scheduler::default()
    }

    /// Registers `worker` as idle.
    pub fn register(&self, worker: u32) {
        self.idle.lock().insert(worker, true);
    }

    /// Makes this scheduler malicious: `f` alters every job it forwards.
    pub fn set_tamper(&self, f: Option<Tamper>) {
        *self.tamper.lock() = f;
    }

    /// Picks up to `max` idle workers, marks them busy, and returns the job to forward to each.
    pub fn dispatch(&self, job: &SealedJob, max: usize) -> Vec<(u32, SealedJob)> {
        let mut idle = self.idle.lock();
        let picked: Vec<u32> = idle.iter().filter(|(_, &i)| i).map(|(&w, _)| w).take(max).collect();
        let tamper = self.tamper.lock();
        picked
            .into_iter()
            .map(|w| {
                idle.insert(w, false);
                let mut j = job.clone();
                if let Some(f) = tamper.as_ref() {
                    f(&mut j);
                }
                (w, j)
            })
            .collect()
    }

    /// Marks `worker` idle again after its job.
    pub fn release(&self, worker: u32) {
        self.idle.lock().insert(worker, true);
    }

    /// How many registered workers are idle.
    pub fn idle_workers(&self) -> usize {
        self.idle.lock().values().filter(|&&i| i).count()
    }
}

//! Simulation parameters.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct SimConfig {
    /// Worker nodes.
    pub nodes: usize,
    /// Data writers (crypto actors) per node.
    pub writers_per_node: usize,
    /// Coordinators: one primary plus shadows.
    pub coordinators: usize,
    /// Distinct keys the workload touches (small, so that keys collide).
    pub keys: usize,
    /// Ops issued per node per millisecond of workload, as a probability.
    pub op_rate: f64,
    /// Share of ops that are deletes.
    pub delete_share: f64,
    /// Milliseconds of workload (faults happen during it).
    pub work_ms: u64,
    /// Milliseconds after faults stop within which every memtable must be identical.
    pub settle_ms: u64,
    pub flush_ms: u64,
    pub tick_ms: u64,
    pub epoch_ms: u64,
    pub batch_ops_max: usize,
    // Faults, as probabilities per message delivery or per millisecond.
    pub loss: f64,
    pub duplicate: f64,
    /// Largest delivery delay in ms (uniform), which reorders messages.
    pub delay_ms_max: u64,
    pub corrupt: f64,
    pub replay: f64,
    /// Per node per ms: probability of a crash (the node restarts `restart_ms` later, empty).
    pub crash: f64,
    pub restart_ms: u64,
    /// Per ms: probability that the primary coordinator crashes (for good).
    pub coordinator_crash: f64,
    /// Per ms: probability of a partition splitting the nodes in two, healed after `heal_ms`.
    pub partition: f64,
    pub heal_ms: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            writers_per_node: 2,
            coordinators: 2,
            keys: 24,
            op_rate: 0.15,
            delete_share: 0.15,
            work_ms: 1_500,
            settle_ms: 6_000,
            flush_ms: 5,
            tick_ms: 10,
            epoch_ms: 100,
            batch_ops_max: 16,
            loss: 0.2,
            duplicate: 0.05,
            delay_ms_max: 30,
            corrupt: 0.02,
            replay: 0.02,
            crash: 0.0004,
            restart_ms: 200,
            coordinator_crash: 0.0003,
            partition: 0.0005,
            heal_ms: 300,
        }
    }
}

impl SimConfig {
    /// A fault-free configuration (for checking the simulator itself).
    pub fn calm() -> SimConfig {
        SimConfig {
            loss: 0.0,
            duplicate: 0.0,
            delay_ms_max: 2,
            corrupt: 0.0,
            replay: 0.0,
            crash: 0.0,
            coordinator_crash: 0.0,
            partition: 0.0,
            ..SimConfig::default()
        }
    }
}

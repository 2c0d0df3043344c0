//! Every bound a lambda runs under.

use std::time::Duration;

/// The bounds one lambda runs under; [`Default`] gives 64 MiB of memory, 10 s of CPU time and
/// 60 s of wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Bytes the lambda's QuickJS runtime may allocate (heap, strings, bytecode).
    pub memory_bytes: usize,
    /// Native stack QuickJS may use for JS recursion before throwing a stack overflow.
    pub stack_bytes: usize,
    /// Stack of the lambda's thread (must exceed `stack_bytes` with room for the host calls).
    pub thread_stack_bytes: usize,
    /// CPU time of the lambda's thread (time blocked in `sync()` does not count).
    pub cpu_time: Duration,
    /// Wall-clock time from start to end, `sync()` waits included.
    pub wall_time: Duration,
    /// Size of the program text.
    pub program_bytes_max: usize,
    /// Size of the job input handed to every lambda as `lambda.input`.
    pub input_bytes_max: usize,
    /// Most `emit` calls one lambda may make (the next one throws a `RangeError`).
    pub emits_max: usize,
    /// Most bytes all of a lambda's `emit`ted values may total.
    pub emit_bytes_max: usize,
    /// Most `log` lines kept (later lines are dropped silently).
    pub log_lines_max: usize,
    /// Most bytes kept of one `log` line (longer lines are cut).
    pub log_line_bytes_max: usize,
    /// Bytes of one value's payload (text, JSON text or bytes): the capsule's 1 MiB value
    /// limit less the 29-byte item header the kind travels in (see [`crate::value`]).
    pub value_bytes_max: usize,
    /// Most entries one `scan` may ask for (`limit`).
    pub scan_limit_max: usize,
    /// Entries a `scan` returns when it does not pass a `limit`.
    pub scan_limit_default: usize,
    /// How long a durable `sync` or `put` waits for the capsule servers' acks by default.
    pub durable_timeout: Duration,
    /// The longest durability wait a lambda may ask for (`timeoutMs`).
    pub durable_timeout_max: Duration,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: 64 << 20,
            stack_bytes: 1 << 20,
            thread_stack_bytes: 8 << 20,
            cpu_time: Duration::from_secs(10),
            wall_time: Duration::from_secs(60),
            program_bytes_max: 1 << 20,
            input_bytes_max: 8 << 20,
            emits_max: 10_000,
            emit_bytes_max: 16 << 20,
            log_lines_max: 1_000,
            log_line_bytes_max: 4096,
            value_bytes_max: crate::value::payload_max(1 << 20),
            scan_limit_max: 1000,
            scan_limit_default: 100,
            durable_timeout: Duration::from_secs(10),
            durable_timeout_max: Duration::from_secs(60),
        }
    }
}

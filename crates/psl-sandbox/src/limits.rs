//! Every bound a lambda runs under.

use std::time::Duration;

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
    /// `emit` calls, and their total bytes.
    pub emits_max: usize,
    pub emit_bytes_max: usize,
    /// `log` lines kept, and bytes kept per line (longer lines are cut).
    pub log_lines_max: usize,
    pub log_line_bytes_max: usize,
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
        }
    }
}

//! Limits and timings shared by every backend.

use std::time::Duration;

use crate::error::ConfigError;

/// Default largest message (and frame payload): 16 MiB.
pub const FRAME_BYTES_MAX_DEFAULT: usize = 16 << 20;
/// Default length of a receive or link queue, in messages.
pub const QUEUE_MSGS_MAX_DEFAULT: usize = 4096;
/// Default size of a receive or link queue, in payload bytes.
pub const QUEUE_BYTES_MAX_DEFAULT: usize = 64 << 20;

/// Limits of one endpoint of any backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// Longest receive queue, in messages (default 4096). A message arriving at a full queue is
    /// dropped for this endpoint and counted in `dropped_full`.
    pub queue_msgs_max: usize,
    /// Largest receive queue, in payload bytes (default 64 MiB); same drop rule.
    pub queue_bytes_max: usize,
    /// Largest message (default 16 MiB). Bigger ones are refused by `publish`.
    pub frame_bytes_max: usize,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            queue_msgs_max: QUEUE_MSGS_MAX_DEFAULT,
            queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        }
    }
}

impl FabricConfig {
    /// Checks that every limit can work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_queue("queue_msgs_max", "queue_bytes_max", self.queue_msgs_max, self.queue_bytes_max)?;
        check_frame(self.frame_bytes_max)
    }
}

pub(crate) fn check_queue(
    msgs_field: &'static str,
    bytes_field: &'static str,
    msgs: usize,
    bytes: usize,
) -> Result<(), ConfigError> {
    if msgs == 0 {
        return Err(ConfigError::new(msgs_field, "must be at least 1"));
    }
    if bytes == 0 {
        return Err(ConfigError::new(bytes_field, "must be at least 1"));
    }
    Ok(())
}

pub(crate) fn check_frame(frame_bytes_max: usize) -> Result<(), ConfigError> {
    if frame_bytes_max == 0 || frame_bytes_max > u32::MAX as usize {
        return Err(ConfigError::new("frame_bytes_max", format!("{frame_bytes_max} is not in 1..=2^32-1")));
    }
    Ok(())
}

/// Timings of one TCP link (router or endpoint). Every wait is bounded by one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkTiming {
    /// Longest wait for a TCP connect (default 2 s).
    pub connect_timeout: Duration,
    /// First wait before reconnecting (default 50 ms); doubled after each failure...
    pub backoff_min: Duration,
    /// ...up to this (default 2 s).
    pub backoff_max: Duration,
    /// A link with nothing to send for this long sends a heartbeat (an empty frame; default 1 s).
    pub heartbeat_interval: Duration,
    /// A link that receives nothing (not even a heartbeat) for this long is closed (default 5 s).
    pub idle_timeout: Duration,
    /// A write that makes no progress for this long closes the link (default 5 s).
    pub write_timeout: Duration,
}

impl Default for LinkTiming {
    fn default() -> Self {
        LinkTiming {
            connect_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            heartbeat_interval: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        }
    }
}

impl LinkTiming {
    /// Checks the timings are non-zero and consistent (the idle timeout must exceed the
    /// heartbeat interval, or healthy idle links would be closed).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("backoff_min", self.backoff_min),
            ("heartbeat_interval", self.heartbeat_interval),
            ("idle_timeout", self.idle_timeout),
            ("write_timeout", self.write_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(field, "must be greater than zero"));
            }
        }
        if self.backoff_max < self.backoff_min {
            return Err(ConfigError::new("backoff_max", "must be at least backoff_min"));
        }
        if self.idle_timeout <= self.heartbeat_interval {
            return Err(ConfigError::new("idle_timeout", "must exceed heartbeat_interval"));
        }
        Ok(())
    }
}

#![allow(dead_code)]
use psl_faas::{Deployment, DeploymentConfig, JobReport, JobRequest};
use psl_sandbox::SandboxLimits;
use std::time::Duration;

pub fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

pub fn deployment(workers: usize, rogue: Vec<u32>) -> Deployment {
    Deployment::start(DeploymentConfig {
        workers,
        rogue_workers: rogue,
        limits: SandboxLimits {
            cpu_time: Duration::from_secs(5),
            wall_time: Duration::from_secs(30),
            memory_bytes: 32 << 20,
            ..SandboxLimits::default()
        },
        ..DeploymentConfig::default()
    })
    .unwrap()
}

pub fn run(d: &Deployment, program: &str, lambdas: u32, input: Option<&str>) -> JobReport {
    d.run_job(JobRequest {
        program: program.into(),
        lambdas,
        input: input.map(String::from),
        owner: None,
        rotate_after_ms: None,
    })
    .unwrap()
}

//! Durability inside lambdas, on the embedded deployment with real capsule servers (three per
//! job, f = 1): `sync({durable: true})` and `put(k, v, {durable: true})` succeed with one server
//! down; with two down they throw a `DurabilityError` after their bound that says how many acks
//! arrived (never durable on fewer than f + 1), and the job's report says whether it ended
//! durable. A job without servers cannot be made durable and says so.

use psl_faas::{Deployment, DeploymentConfig, JobReport, JobRequest};
use psl_sandbox::SandboxLimits;
use std::time::{Duration, Instant};

const PROGRAM: &str = r#"
const me = lambda.id;
const out = { id: me };
for (let i = 0; i < 20; i++) put("k/" + me + "/" + i, "value " + i);
try {
  sync({ durable: true, timeoutMs: 1500 });
  out.sync = "durable";
} catch (e) {
  out.sync = { name: e.name, acked: e.acked, quorum: e.quorum, servers: e.servers, message: String(e.message) };
}
try {
  put("last/" + me, "x", { durable: true, timeoutMs: 1500 });
  out.put = "durable";
} catch (e) {
  out.put = { name: e.name, acked: e.acked, quorum: e.quorum };
}
emit(JSON.stringify(out));
"#;

fn deployment(servers: u32, down: Vec<u32>) -> (Deployment, tempfile::TempDir) {
    let stores = tempfile::tempdir().unwrap();
    let d = Deployment::start(DeploymentConfig {
        workers: 2,
        servers,
        down_servers: down,
        store_dir: Some(stores.path().to_path_buf()),
        limits: SandboxLimits {
            cpu_time: Duration::from_secs(5),
            wall_time: Duration::from_secs(30),
            durable_timeout: Duration::from_secs(2),
            ..SandboxLimits::default()
        },
        ..DeploymentConfig::default()
    })
    .unwrap();
    (d, stores)
}

fn run(d: &Deployment) -> (JobReport, Vec<serde_json::Value>) {
    let r = d
        .run_job(JobRequest { program: PROGRAM.into(), lambdas: 2, input: None, owner: None, rotate_after_ms: None })
        .unwrap();
    assert!(r.ok, "{:?}", r.lambdas);
    let outs = r.lambdas.iter().map(|l| serde_json::from_str(&l.emitted[0]).unwrap()).collect();
    (r, outs)
}

#[test]
fn faas_lambda_durability_with_one_of_three_servers_down() {
    let (d, stores) = deployment(3, vec![2]);
    let (r, outs) = run(&d);
    for o in &outs {
        assert_eq!(o["sync"], "durable", "{o}");
        assert_eq!(o["put"], "durable", "{o}");
    }
    assert!(r.durable, "{:?}", r.durability);
    assert_eq!(r.durability.len(), 2);
    assert!(r.durability.iter().all(|(_, e)| e.servers == 3 && e.error.is_none()));
    // Only the two servers that ran stored records; the down one has no store.
    let ids: Vec<u32> = r.stored_records.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![0, 1]);
    assert!(r.stored_records.iter().all(|(_, n)| *n > 0), "{:?}", r.stored_records);
    let capsule_dir = stores.path().join(&r.capsule);
    assert!(capsule_dir.join("server-0").is_dir() && !capsule_dir.join("server-2").exists());
}

#[test]
fn faas_lambda_durability_with_two_of_three_down_fails_after_its_bound() {
    let (d, _stores) = deployment(3, vec![1, 2]);
    let t = Instant::now();
    let (r, outs) = run(&d);
    for o in &outs {
        let s = &o["sync"];
        assert_eq!(s["name"], "DurabilityError", "{o}");
        // One server acked at most: never reported durable on fewer than f + 1 = 2.
        assert!(s["acked"].as_u64().unwrap() <= 1, "{o}");
        assert_eq!(s["quorum"], 2, "{o}");
        assert_eq!(s["servers"], 3, "{o}");
        assert!(s["message"].as_str().unwrap().contains("sync"), "{o}");
        assert_eq!(o["put"]["name"], "DurabilityError", "{o}");
    }
    // Each lambda waited its 1.5 s bound (twice), then the workers their 2 s.
    assert!(t.elapsed() >= Duration::from_millis(3000), "{:?}", t.elapsed());
    assert!(!r.durable);
    assert!(r.durability.iter().all(|(_, e)| e.servers == 3 && e.error.is_some()), "{:?}", r.durability);
}

#[test]
fn faas_lambda_durability_without_servers_is_refused_and_reported() {
    let (d, _stores) = deployment(0, Vec::new());
    let (r, outs) = run(&d);
    for o in &outs {
        let m = o["sync"]["message"].as_str().unwrap();
        assert!(m.contains("no capsule servers"), "{o}");
    }
    assert!(!r.durable);
    assert!(r.durability.iter().all(|(_, e)| e.servers == 0 && e.error.is_some()));
}

//! Hardware attestation through the real launch path, with only the evidence source faked: the
//! leader, the workers and a capsule host run as `psl` processes with `--attest snp`, each
//! reading its reports from its own entry of a directory tree that behaves like configfs-tsm
//! (served by this test with SEV-SNP-format reports signed by a private AMD-shaped PKI whose ARK
//! the policy names as trust anchor). The client checks the leader, the leader the workers and
//! the host, all over TLS, with the production SNP verifier.
//!
//! - a worker whose tree gives genuine evidence gets keys and runs the job;
//! - a worker whose tree alters each report after signing gets none;
//! - a worker on the INSECURE sim backend gets none: the policy does not allow it;
//! - the same deployment, policy with `allow_insecure_sim = true`: the sim worker is admitted
//!   (the sim backend is refused only by policy, and allowed only in words).

mod common;

use common::{start, Proc};
use psl_faas::attest_testkit::{FakeSnpPlatform, FakeTsm, ReportSpec, TsmFault};
use psl_faas::net::{ClusterInfo, WorkerInfo};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn psl() -> &'static str {
    env!("CARGO_BIN_EXE_psl")
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples").join(name)
}

fn debug(control: SocketAddr) -> serde_json::Value {
    let mut s = TcpStream::connect(control).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"DEBUG\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// A change made to an SNP worker's report after it is signed.
type Tamper = fn(&mut Vec<u8>);

struct Cluster {
    _procs: Vec<Proc>,
    _fakes: Vec<FakeTsm>,
    info: ClusterInfo,
    cluster_file: PathBuf,
}

/// The policy: SNP only (plus `extra`), the test PKI's ARK, the platform's measurement.
fn policy(dir: &Path, p: &FakeSnpPlatform, extra: &str) -> PathBuf {
    std::fs::write(dir.join("ark.pem"), p.amd.ark_pem()).unwrap();
    let path = dir.join("policy.toml");
    let text = format!(
        "allowed_kinds = [\"snp\"]\n{extra}\n[hosts]\nrequire_attestation = true\n\n[snp]\ntrust_anchors = [\"ark.pem\"]\n\n[[snp.allow]]\nmeasurement = \"{}\"\nguest_policy = \"{:#x}\"\n",
        hex::encode(p.spec.measurement),
        p.spec.policy
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts router, scheduler, one capsule host, the leader and the workers. `workers`: for each,
/// `Some(tamper)` for an SNP worker (with that tamper of its reports), `None` for a sim worker.
fn cluster(dir: &Path, p: &Arc<FakeSnpPlatform>, policy: &Path, workers: &[Option<Option<Tamper>>]) -> Cluster {
    let tsm = dir.join("tsm");
    let tsm_s = tsm.display().to_string();
    let pol = policy.display().to_string();
    let mut fakes = vec![
        FakeTsm::start(&tsm, "leader", "sev_guest", TsmFault::None, p.maker(None)),
        FakeTsm::start(&tsm, "host0", "sev_guest", TsmFault::None, p.maker(None)),
        FakeTsm::start(&tsm, "coord0", "sev_guest", TsmFault::None, p.maker(None)),
    ];
    let mut procs = Vec::new();
    let router = start(dir, &["router", "--listen", "127.0.0.1:0"], "listening");
    let r = router.addr().to_string();
    procs.push(router);
    let sched = start(dir, &["scheduler", "--heartbeat-timeout-ms", "5000"], "scheduler");
    let scheduler = sched.addr();
    procs.push(sched);
    let host_dir = dir.join("host0");
    let hd = host_dir.display().to_string();
    let host = start(
        dir,
        &[
            "capsule-host",
            "--id",
            "0",
            "--dir",
            &hd,
            "--router",
            &r,
            "--attest",
            "snp",
            "--tsm-root",
            &tsm_s,
            "--tsm-entry",
            "host0",
        ],
        "capsule-host 0",
    );
    let host_addr = host.addr();
    procs.push(host);
    let ha = host_addr.to_string();
    // The job's coordinator runs on its own attested host.
    let coord = start(
        dir,
        &[
            "coordinator-host",
            "--id",
            "0",
            "--router",
            &r,
            "--attest",
            "snp",
            "--tsm-root",
            &tsm_s,
            "--tsm-entry",
            "coord0",
        ],
        "coordinator-host 0",
    );
    let ca = coord.addr().to_string();
    procs.push(coord);
    let leader = start(
        dir,
        &[
            "leader",
            "--router",
            &r,
            "--capsule-host",
            &ha,
            "--coordinator-host",
            &ca,
            "--attest",
            "snp",
            "--tsm-root",
            &tsm_s,
            "--tsm-entry",
            "leader",
            "--attest-policy",
            &pol,
            "--admit-wait-ms",
            "10000",
        ],
        "leader",
    );
    let leader_addr = leader.addr();
    procs.push(leader);
    let (s, l) = (scheduler.to_string(), leader_addr.to_string());
    std::fs::write(dir.join("sim.key"), hex::encode([0x42u8; 32])).unwrap();
    let mut infos = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        let id = (i + 1).to_string();
        let entry = format!("w{id}");
        let mut args =
            vec!["worker", "--id", &id, "--scheduler", &s, "--leader", &l, "--router", &r, "--attest-policy", &pol];
        let (tsm_args, sim_args);
        match w {
            Some(tamper) => {
                fakes.push(FakeTsm::start(&tsm, &entry, "sev_guest", TsmFault::None, p.maker(*tamper)));
                tsm_args = ["--attest", "snp", "--tsm-root", &tsm_s, "--tsm-entry", &entry];
                args.extend_from_slice(&tsm_args);
            }
            None => {
                sim_args = ["--attest", "sim", "--sim-platform-key", "sim.key"];
                args.extend_from_slice(&sim_args);
            }
        }
        let w = start(dir, &args, &format!("worker {id} control"));
        infos.push(WorkerInfo { id: i as u32 + 1, control: w.addr() });
        procs.push(w);
    }
    let info = ClusterInfo {
        scheduler,
        leader: leader_addr,
        fabric: psl_fabric::FabricSpec::router(r.parse().unwrap()),
        attestation_backend: "snp".into(),
        attest_policy: policy.to_path_buf(),
        workers: infos,
        capsule_hosts: vec![(0, host_addr, host_dir)],
        coordinator_hosts: Vec::new(),
        pids: Vec::new(),
    };
    let cluster_file = dir.join("cluster.json");
    std::fs::write(&cluster_file, serde_json::to_string(&info).unwrap()).unwrap();
    // Every worker registered before the job is submitted.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = TcpStream::connect(scheduler).unwrap();
        psl_faas::net::wire::write_msg(&mut c, &psl_faas::net::wire::Msg::Status).unwrap();
        if let psl_faas::net::wire::Msg::StatusReply { workers: w } = psl_faas::net::wire::read_msg(&mut c).unwrap() {
            if w.len() == workers.len() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "workers did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
    Cluster { _procs: procs, _fakes: fakes, info, cluster_file }
}

fn run_job(c: &Cluster, lambdas: u32) -> (bool, serde_json::Value, String) {
    let o = Command::new(psl())
        .arg("run")
        .arg(example("montecarlo.js"))
        .args(["--lambdas", &lambdas.to_string(), "--json", "--cluster"])
        .arg(&c.cluster_file)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o.status.success(), v, String::from_utf8_lossy(&o.stderr).into_owned())
}

// The signature is the testkit's tamper hook (`fn(&mut Vec<u8>)`).
#[allow(clippy::ptr_arg)]
fn flip_measurement(r: &mut Vec<u8>) {
    r[0x90] ^= 1;
}

#[test]
fn snp_workers_from_configfs_get_keys_altered_and_sim_evidence_get_none() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(FakeSnpPlatform::new(ReportSpec::default()));
    let pol = policy(dir.path(), &p, "");
    let c = cluster(dir.path(), &p, &pol, &[Some(None), Some(Some(flip_measurement)), None]);
    let (ok, v, err) = run_job(&c, 3);
    assert!(ok, "job failed: {err}\n{v}");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["attestation_backend"], "snp", "{v}");
    // Every lambda ran on worker 1, the one with genuine evidence.
    let lambdas = v["lambdas"].as_array().unwrap();
    assert_eq!(lambdas.len(), 3, "{v}");
    assert!(lambdas.iter().all(|l| l["worker"] == 1), "{v}");
    let refused = v["refused_workers"].as_array().unwrap();
    let why = |w: u64| refused.iter().find(|r| r[0] == w).map(|r| r[1].as_str().unwrap().to_string());
    let w2 = why(2).unwrap_or_else(|| panic!("worker 2 not refused: {v}"));
    assert!(w2.contains("signature"), "worker 2: {w2}");
    let w3 = why(3).unwrap_or_else(|| panic!("worker 3 not refused: {v}"));
    assert!(w3.contains("INSECURE sim") && w3.contains("allow_insecure_sim"), "worker 3: {w3}");
    // The capsule host attested before it got its key, and stored the job's records.
    assert!(v["stored_records"][0][1].as_u64().unwrap() > 0, "{v}");
    for w in &c.info.workers[1..] {
        let d = debug(w.control);
        assert_eq!(d["holds_keys"], false, "worker {}: {d}", w.id);
        assert_eq!(d["attested"], false, "worker {}: {d}", w.id);
    }
    // With only refused workers the job fails clearly, nobody holds a key.
    let dir2 = tempfile::tempdir().unwrap();
    let pol2 = policy(dir2.path(), &p, "");
    let c2 = cluster(dir2.path(), &p, &pol2, &[Some(Some(flip_measurement)), None]);
    let (ok, v, err) = run_job(&c2, 2);
    assert!(!ok || v["ok"] == false, "{v}");
    assert!(err.contains("attested worker") || v.to_string().contains("attested worker"), "{err}\n{v}");
    for w in &c2.info.workers {
        assert_eq!(debug(w.control)["holds_keys"], false);
    }
}

#[test]
fn the_sim_backend_is_admitted_only_by_a_policy_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(FakeSnpPlatform::new(ReportSpec::default()));
    // The sim worker's measurement: this build's, as `psl attest measure` prints it.
    let o = Command::new(psl()).args(["attest", "measure"]).output().unwrap();
    let m = String::from_utf8(o.stdout).unwrap();
    let m = m.lines().find_map(|l| l.strip_prefix("measurement = ")).unwrap().trim_matches('"').to_string();
    let platform = psl_faas::SimPlatform::from_secret(&[0x42; 32]).unwrap();
    let sim = format!(
        "allow_insecure_sim = true\n[sim]\nplatform_public = \"{}\"\n[[sim.allow]]\nmeasurement = \"{m}\"\n",
        hex::encode(platform.public().to_bytes())
    );
    let pol = policy(dir.path(), &p, &sim);
    let c = cluster(dir.path(), &p, &pol, &[None]);
    let (ok, v, err) = run_job(&c, 1);
    assert!(ok, "{err}\n{v}");
    assert_eq!(v["lambdas"][0]["worker"], 1, "{v}");
    assert!(err.contains("allow_insecure_sim = true"), "the client says it accepts the sim backend: {err}");
}

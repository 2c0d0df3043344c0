//! Values and reads for real lambdas, over real nodes: bytes cross the store bit for bit
//! (every byte value 0-255, written by one lambda and read by another on another worker),
//! JSON keeps its structure, strings stay strings, oversized values are refused with the limit
//! named, reads carry their versions, and a scan returns keys in order, including the keys a
//! bounded memtable evicted to CapsuleDB.

mod common;

use psl_capsule::{new_capsule, Author, Limits, Verifier};
use psl_capsuledb::role::{Role, RoleKeys, RoleOptions};
use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore};
use psl_crypto::OwnerKey;
use psl_faas::NodeKv;
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_sandbox::{run_lambda, LambdaSpec, SandboxLimits};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PROGRAM: &str = r#"
const me = lambda.id;
const all = new Uint8Array(256); for (let i = 0; i < 256; i++) all[i] = (i + me) & 255;
put("bytes/" + me, all);
putJSON("json/" + me, { id: me, list: [1, "two", { three: [3] }], nested: { ok: true, none: null } });
put("text/" + me, "lambda " + me + " ✓");
put("done/" + me, "1");
sync();
if (me === 0) {
  for (let round = 0; round < 200; round++) {
    let n = 0; for (let i = 0; i < lambda.count; i++) if (get("done/" + i) !== null) n++;
    if (n === lambda.count) break;
    sync();
  }
  sync();
  const report = { bytes: [], json: [], text: [], versions: [] };
  for (let i = 0; i < lambda.count; i++) {
    const b = get("bytes/" + i);
    let same = b instanceof Uint8Array && b.length === 256;
    for (let j = 0; same && j < 256; j++) if (b[j] !== ((j + i) & 255)) same = false;
    report.bytes.push(same);
    const j = getJSON("json/" + i);
    report.json.push(j.id === i && j.list[2].three[0] === 3 && j.nested.ok === true && j.nested.none === null);
    report.text.push(get("text/" + i) === "lambda " + i + " ✓");
    const e = getEntry("bytes/" + i);
    report.versions.push([e.type, e.lamport > 0, e.writer > 0]);
  }
  report.scan = scan("bytes/").map(e => e.key);
  report.scan_types = scan("", { limit: 1000 }).map(e => e.type).sort().join(",");
  try { put("big", new Uint8Array(1048576)); report.big = "stored"; } catch (e) { report.big = e.name + ": " + e.message; }
  emit(JSON.stringify(report));
}
"#;

#[test]
fn bytes_json_and_text_cross_workers_with_versions_and_limits() {
    let d = common::deployment(3, Vec::new());
    let r = common::run(&d, PROGRAM, 3, None);
    assert!(r.ok, "{:?}", r.lambdas);
    let v: serde_json::Value = serde_json::from_str(r.lambdas[0].emitted.last().unwrap()).unwrap();
    assert_eq!(v["bytes"], serde_json::json!([true, true, true]), "{v}");
    assert_eq!(v["json"], serde_json::json!([true, true, true]), "{v}");
    assert_eq!(v["text"], serde_json::json!([true, true, true]), "{v}");
    for e in v["versions"].as_array().unwrap() {
        assert_eq!(e, &serde_json::json!(["bytes", true, true]));
    }
    assert_eq!(v["scan"], serde_json::json!(["bytes/0", "bytes/1", "bytes/2"]));
    assert_eq!(v["scan_types"], "bytes,bytes,bytes,json,json,json,string,string,string,string,string,string");
    assert_eq!(
        v["big"],
        format!("RangeError: put: the value is 1048576 bytes, over the limit of {} bytes", (1 << 20) - 29)
    );
}

const KEYS: usize = 3_000;
const BOUND: usize = 200;

#[test]
fn a_scan_includes_the_keys_a_bounded_memtable_evicted_to_capsuledb() {
    let owner = OwnerKey::from_seed(&[23; 32]).unwrap();
    let app = owner.app(1).unwrap();
    let meta = new_capsule(&owner, 1, "scan-evicted", 0, Limits::default()).unwrap();
    let hub = InProcHub::new(FabricConfig::default()).unwrap();
    let db_writer = psl_scl::writer_index(30_000, 0, 15).unwrap();
    let role_opts = NodeOptions {
        node_id: 30_000,
        writers: 0,
        memtable_keys_max: Some(1024),
        capsuledb_role: Some(65_536),
        ..NodeOptions::default()
    }
    .shared_cores();
    let keys = NodeKeys::derive(&meta, &app, &role_opts).unwrap();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("capsuledb"));
    let role_node = Node::start(keys, ep, role_opts).unwrap();
    let stores: Vec<Arc<dyn BlockStore>> = vec![MemStore::new()];
    let config = Config { memtable_entries_max: 512, block_entries_max: 128, ..Config::default() };
    let author = Author::new(&meta, &app, db_writer).unwrap();
    let db = CapsuleDb::create(config, stores, Verifier::new(meta.clone(), Some(app.data_key())), author).unwrap();
    let role_keys = RoleKeys { writer: db_writer, signing: app.writer(db_writer).unwrap(), data_key: app.data_key() };
    let role = Role::start(role_node, db, role_keys, Vec::new(), RoleOptions::default()).unwrap();

    let opts = NodeOptions {
        node_id: 1,
        writers: 2,
        memtable_keys_max: Some(BOUND),
        capsuledb: Some(db_writer),
        db_get_timeout: Duration::from_secs(20),
        ..NodeOptions::default()
    }
    .shared_cores();
    let ep: Arc<dyn Fabric> = Arc::new(hub.endpoint("worker"));
    let node = Arc::new(Node::start(NodeKeys::derive(&meta, &app, &opts).unwrap(), ep, opts).unwrap());
    let kv = Arc::new(NodeKv { node: node.clone(), sync_timeout: Duration::from_secs(10) });
    // A lambda writes the keys (bytes and text, a few deleted or overwritten).
    let limits =
        SandboxLimits { cpu_time: Duration::from_secs(20), wall_time: Duration::from_secs(60), ..Default::default() };
    let writer = format!(
        r#"for (let i = 0; i < {KEYS}; i++) {{
             const k = "k/" + String(i).padStart(5, "0");
             if (i % 3 === 0) put(k, new Uint8Array([i & 255, (i >> 8) & 255, 0, 255])); else put(k, "v" + i);
           }}
           del("k/00007"); put("k/00008", "newest"); put("l/after", "not in the prefix");"#
    );
    let spec = |program: String| LambdaSpec { id: 0, count: 1, program: program.into(), input: None };
    let o = run_lambda(spec(writer), kv.clone(), limits);
    o.result.unwrap();
    // CapsuleDB takes every write into its blocks; the worker evicts down to its bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.memtable().held() > BOUND + BOUND / 2 {
        assert!(Instant::now() < deadline, "the worker still holds {} keys", node.memtable().held());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(node.memtable().evicted() as usize >= KEYS - 2 * BOUND, "evicted {}", node.memtable().evicted());
    // Another lambda pages through the prefix with a bounded limit.
    let reader = r#"
        let after = undefined, keys = [], bad = [], pages = 0;
        for (;;) {
          const page = scan("k/", { limit: 700, after: after });
          if (page.length === 0) break;
          pages++;
          for (const e of page) {
            const i = Number(e.key.slice(2));
            keys.push(e.key);
            const want = i === 8 ? "newest" : (i % 3 === 0 ? null : "v" + i);
            if (want === null) {
              if (!(e.value instanceof Uint8Array) || e.value[0] !== (i & 255) || e.value[1] !== ((i >> 8) & 255) || e.value[3] !== 255) bad.push(e.key);
            } else if (e.value !== want || e.type !== "string") bad.push(e.key);
            if (!(e.lamport > 0)) bad.push(e.key + " version");
          }
          after = page[page.length - 1].key;
        }
        let ordered = true; for (let i = 1; i < keys.length; i++) if (!(keys[i - 1] < keys[i])) ordered = false;
        emit(JSON.stringify({ n: keys.length, pages, ordered, bad: bad.slice(0, 5), has7: keys.includes("k/00007") }));
    "#;
    let o = run_lambda(spec(reader.into()), kv, limits);
    o.result.unwrap();
    let v: serde_json::Value = serde_json::from_str(&o.emitted[0]).unwrap();
    assert_eq!(v["n"], KEYS - 1, "every key but the deleted one: {v}");
    assert_eq!(v["ordered"], true, "{v}");
    assert_eq!(v["bad"], serde_json::json!([]), "{v}");
    assert_eq!(v["has7"], false, "{v}");
    assert!(v["pages"].as_u64().unwrap() >= 5, "{v}");
    let st = node.db_stats().unwrap();
    assert!(st.answers.load(std::sync::atomic::Ordering::Relaxed) >= 5, "the scans went through CapsuleDB");
    role.shutdown();
}

/// A lambda moves money between two accounts with `batch`, one atomic record per transfer,
/// while a lambda on another worker scans the accounts: every scan sees the sum whole, and
/// the transfer count agrees with what was moved (never half a transfer). Bad batches throw
/// and write nothing.
const TRANSFERS: &str = r#"
const me = lambda.id;
if (me === 0) {
  batch([{ put: "acct/a", value: "100" }, { put: "acct/b", value: "0" }]);
  for (let i = 1; i <= 100; i++) {
    batch([{ put: "acct/a", value: String(100 - i) }, { put: "acct/b", value: String(i) }, { put: "acct/n", value: String(i) }]);
  }
  batch([{ put: "stop", value: "1" }, { del: "acct/gone" }]);
  const errs = [];
  for (const bad of [[], "x", [{ put: "bad/1", value: "1" }, { nope: 1 }], [{ put: "bad/2", value: "1", del: "bad/2" }]]) {
    try { batch(bad); errs.push("stored"); } catch (e) { errs.push(e.name); }
  }
  sync();
  emit(JSON.stringify({ errs, bad: scan("bad/").length, a: get("acct/a"), b: get("acct/b") }));
} else {
  let checks = 0, broken = [];
  const until = Date.now() + 20000;
  while (get("stop") === null && Date.now() < until) {
    const m = {};
    for (const e of scan("acct/")) m[e.key] = Number(e.value);
    if ("acct/a" in m) {
      checks++;
      if (m["acct/a"] + m["acct/b"] !== 100 || ("acct/n" in m && m["acct/n"] !== m["acct/b"])) broken.push(JSON.stringify(m));
    }
  }
  emit(JSON.stringify({ checks, broken, stopped: get("stop") !== null }));
}
"#;

#[test]
fn a_batch_of_transfers_is_never_seen_half_applied_on_another_worker() {
    let d = common::deployment(2, Vec::new());
    let r = common::run(&d, TRANSFERS, 2, None);
    assert!(r.ok, "{:?}", r.lambdas);
    let writer: serde_json::Value = serde_json::from_str(r.lambdas[0].emitted.last().unwrap()).unwrap();
    assert_eq!(writer["errs"], serde_json::json!(["RangeError", "TypeError", "TypeError", "TypeError"]), "{writer}");
    assert_eq!((writer["bad"].as_u64(), writer["a"].as_str(), writer["b"].as_str()), (Some(0), Some("0"), Some("100")));
    let reader: serde_json::Value = serde_json::from_str(r.lambdas[1].emitted.last().unwrap()).unwrap();
    assert_eq!(reader["broken"], serde_json::json!([]), "{reader}");
    assert_eq!(reader["stopped"], serde_json::json!(true), "{reader}");
}

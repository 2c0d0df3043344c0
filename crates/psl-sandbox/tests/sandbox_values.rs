//! The lambda API for real programs: values as text, JSON or bytes (type kept across the
//! store, bytes bit for bit), size limits with clear errors, versions of what was read, scans
//! in key order with a bounded limit, and durable writes whose shortfall is a thrown
//! `DurabilityError` naming the acks.

use psl_sandbox::{
    spawn_lambda, HostError, KvEntry, KvHost, KvValue, LambdaOutcome, LambdaSpec, MapHost, SandboxLimits,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn run(src: &str, host: Arc<dyn KvHost>) -> LambdaOutcome {
    let limits =
        SandboxLimits { cpu_time: Duration::from_secs(5), wall_time: Duration::from_secs(20), ..Default::default() };
    spawn_lambda(LambdaSpec { id: 0, count: 1, program: src.into(), input: None }, host, limits).unwrap().join()
}

fn ok(src: &str, host: Arc<dyn KvHost>) -> Vec<String> {
    let o = run(src, host);
    o.result.unwrap_or_else(|e| panic!("{e}; emitted {:?}", o.emitted));
    o.emitted
}

#[test]
fn bytes_survive_bit_for_bit_and_come_back_as_uint8array() {
    let host = Arc::new(MapHost::new());
    let out = ok(
        r#"const b = new Uint8Array(256); for (let i = 0; i < 256; i++) b[i] = i;
           put("all", b);
           const back = get("all");
           emit(back instanceof Uint8Array);
           emit(back.length);
           let same = true; for (let i = 0; i < 256; i++) if (back[i] !== i) same = false;
           emit(same);
           // A view's own bytes (offset and length kept), and an ArrayBuffer, are bytes too.
           put("view", b.subarray(250, 253));
           emit(Array.from(get("view")).join(","));
           put("ab", b.buffer.slice(0, 2));
           emit(Array.from(get("ab")).join(","));
           put("empty", new Uint8Array(0));
           emit(get("empty").length);
           emit(getEntry("all").type);
           try { getJSON("all"); } catch (e) { emit(e.name + ": " + e.message); }
           try { put("x", new Int16Array(2)); } catch (e) { emit(e.name); }"#,
        host.clone(),
    );
    assert_eq!(out[..7], ["true", "256", "true", "250,251,252", "0,1", "0", "bytes"]);
    assert!(out[7].starts_with("TypeError: getJSON: the value of \"all\" is bytes"), "{}", out[7]);
    assert_eq!(out[8], "TypeError");
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(host.snapshot()["all"], KvValue::Bytes(all));
}

#[test]
fn json_keeps_its_structure_and_strings_stay_strings() {
    let host = Arc::new(MapHost::new());
    let out = ok(
        r#"const v = { a: [1, 2.5, -3e10, null, true], s: "ünï\u0000cödé", o: { deep: { er: [] } } };
           putJSON("j", v);
           emit(JSON.stringify(getJSON("j")) === JSON.stringify(v));
           emit(typeof get("j"));
           emit(getEntry("j").type);
           put("s", "123");
           emit(typeof get("s") + " " + getEntry("s").type + " " + getJSON("s"));
           put("n", 42);
           emit(get("n") === "42");
           try { putJSON("u", undefined); } catch (e) { emit(e.name); }
           put("t", "not json");
           try { getJSON("t"); } catch (e) { emit(e.name); }
           emit(get("missing") === null && getEntry("missing") === null && getJSON("missing") === null);"#,
        host.clone(),
    );
    assert_eq!(out, ["true", "string", "json", "string string 123", "true", "TypeError", "SyntaxError", "true"]);
    assert!(matches!(&host.snapshot()["j"], KvValue::Json(t) if t.contains("ünï")));
}

#[test]
fn oversized_values_are_refused_with_the_limit_named() {
    let host = Arc::new(MapHost::new());
    let max = SandboxLimits::default().value_bytes_max;
    let out = ok(
        &format!(
            r#"put("at", "x".repeat({max}));
               emit(get("at").length);
               for (const v of ["x".repeat({over}), new Uint8Array({over})]) {{
                 try {{ put("big", v); emit("stored"); }} catch (e) {{ emit(e.name + ": " + e.message); }}
               }}
               try {{ putJSON("bigj", "x".repeat({max})); }} catch (e) {{ emit(e.name); }}
               emit(get("big") === null);"#,
            over = max + 1
        ),
        host,
    );
    assert_eq!(out[0], max.to_string());
    for m in &out[1..3] {
        assert_eq!(*m, format!("RangeError: put: the value is {} bytes, over the limit of {max} bytes", max + 1));
    }
    // The JSON text of a string has its two quotes: over by two.
    assert_eq!(out[3], "RangeError");
    assert_eq!(out[4], "true");
}

#[test]
fn scans_are_in_key_order_bounded_and_resumable_with_versions() {
    let host = Arc::new(MapHost::new());
    let out = ok(
        r#"for (const k of ["p/c", "p/a", "q/x", "p/b", "o/z", "p/d"]) put(k, "v" + k);
           put("p/a", new Uint8Array([1]));
           del("p/d");
           const s = scan("p/");
           emit(s.map(e => e.key).join(","));
           emit(s[0].type + " " + s[1].value);
           emit(s.every(e => typeof e.lamport === "number" && typeof e.writer === "number"));
           emit(scan("p/", { limit: 2 }).map(e => e.key).join(","));
           emit(scan("p/", { limit: 2, after: "p/b" }).map(e => e.key).join(","));
           emit(scan("").length);
           const e1 = getEntry("p/c"); put("p/c", "again"); const e2 = getEntry("p/c");
           emit(e2.lamport > e1.lamport);
           for (const bad of [0, 1001, 1.5, "x"]) { try { scan("p/", { limit: bad }); emit("no"); } catch (e) { emit(e.name); } }"#,
        host,
    );
    assert_eq!(out[0], "p/a,p/b,p/c");
    assert_eq!(out[1], "bytes vp/b");
    assert_eq!(out[2], "true");
    assert_eq!(out[3], "p/a,p/b");
    assert_eq!(out[4], "p/c");
    assert_eq!(out[5], "5");
    assert_eq!(out[6], "true");
    assert_eq!(out[7..], ["RangeError", "RangeError", "RangeError", "RangeError"]);
}

/// A store whose capsule servers ack only `acked` of three.
struct Servers {
    map: MapHost,
    acked: usize,
    waits: AtomicUsize,
}

impl KvHost for Servers {
    fn put(&self, key: &str, value: &KvValue) -> Result<(), HostError> {
        self.map.put(key, value)
    }
    fn get(&self, key: &str) -> Result<Option<KvEntry>, HostError> {
        self.map.get(key)
    }
    fn del(&self, key: &str) -> Result<(), HostError> {
        self.map.del(key)
    }
    fn batch(&self, ops: &[(String, Option<KvValue>)]) -> Result<(), HostError> {
        self.map.batch(ops)
    }
    fn sync(&self) -> Result<(), HostError> {
        Ok(())
    }
    fn sync_durable(&self, timeout: Duration) -> Result<(), HostError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        if self.acked >= 2 {
            return Ok(());
        }
        Err(HostError::NotDurable {
            message: format!("only {} of the 3 capsule servers acked within {timeout:?}; 2 must", self.acked),
            acked_by: self.acked,
            quorum: 2,
            servers: 3,
        })
    }
    fn scan(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<KvEntry>, HostError> {
        self.map.scan(prefix, after, limit)
    }
}

#[test]
fn durable_writes_wait_and_a_shortfall_throws_the_ack_count() {
    let good = Arc::new(Servers { map: MapHost::new(), acked: 2, waits: AtomicUsize::new(0) });
    let out = ok(
        r#"put("a", "1", { durable: true }); putJSON("b", [1], { durable: true }); del("a", { durable: true });
           sync({ durable: true, timeoutMs: 50 }); sync(); put("c", "2", { durable: false }); emit("ok");"#,
        good.clone(),
    );
    assert_eq!(out, ["ok"]);
    assert_eq!(good.waits.load(Ordering::Relaxed), 4);
    let bad = Arc::new(Servers { map: MapHost::new(), acked: 1, waits: AtomicUsize::new(0) });
    let out = ok(
        r#"try { sync({ durable: true, timeoutMs: 1500 }); } catch (e) {
             emit([e.name, e.acked, e.quorum, e.servers, e instanceof Error].join(" ")); emit(e.message); }
           try { put("k", "v", { durable: true, timeoutMs: 0 }); } catch (e) { emit(e.name); }
           try { put("k", "v", { durable: true, timeoutMs: NaN }); } catch (e) { emit(e.name); }"#,
        bad.clone(),
    );
    assert_eq!(out[0], "DurabilityError 1 2 3 true");
    assert_eq!(out[1], "sync: only 1 of the 3 capsule servers acked within 1.5s; 2 must");
    assert_eq!(out[2], "RangeError");
    assert_eq!(out[3], "RangeError");
    // A wait past any Duration (Infinity, 1e300) is clamped to the limit's maximum, not a panic.
    let out = ok(
        r#"sync({ durable: true, timeoutMs: Infinity }); sync({ durable: true, timeoutMs: 1e300 }); emit("ok");"#,
        good.clone(),
    );
    assert_eq!(out, ["ok"]);
    // Uncaught, it ends the lambda with the numbers in the message.
    let o = run(r#"put("k", "v", { durable: true });"#, bad);
    let e = o.result.unwrap_err();
    assert_eq!(e.reason.kind(), "threw");
    assert!(e.to_string().contains("DurabilityError: put: only 1 of the 3"), "{e}");
    // The in-memory map promises no durability at all.
    let o = run(r#"sync({ durable: true });"#, Arc::new(MapHost::new()));
    assert!(o.result.unwrap_err().to_string().contains("nothing can be made durable"));
}

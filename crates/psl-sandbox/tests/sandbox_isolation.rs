//! The sandbox: the host API is the only capability, limits stop runaway lambdas, one lambda's
//! failure does not disturb the others.

use psl_sandbox::{spawn_lambda, KvHost, KvValue, LambdaOutcome, LambdaSpec, MapHost, SandboxLimits};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn limits() -> SandboxLimits {
    SandboxLimits {
        memory_bytes: 16 << 20,
        cpu_time: Duration::from_millis(300),
        wall_time: Duration::from_secs(5),
        ..SandboxLimits::default()
    }
}

fn run(id: u32, src: &str, host: Arc<MapHost>) -> LambdaOutcome {
    spawn_lambda(LambdaSpec { id, count: 1, program: src.into(), input: Some("in".into()) }, host, limits())
        .unwrap()
        .join()
}

#[test]
fn sandbox_host_api_and_json_helper_work() {
    let host = Arc::new(MapHost::new());
    let o = run(
        3,
        r#"put("a", "1"); putJSON("j", {x: [1,2]}); emit(get("a")); emit(getJSON("j").x.length);
           emit(get("missing") === null); del("a"); emit(get("a")); sync(); log("hi", 2, lambda.id, lambda.count, lambda.input);"#,
        host.clone(),
    );
    o.result.unwrap();
    assert_eq!(o.emitted, vec!["1", "2", "true", "null"]);
    assert_eq!(o.logs, vec!["hi 2 3 1 in"]);
    assert_eq!(host.get("j").unwrap().map(|e| e.value), Some(KvValue::Json(r#"{"x":[1,2]}"#.into())));
    assert!(o.first_op_at.is_some());
}

#[test]
fn sandbox_globals_hold_only_the_host_api_and_builtins() {
    let host = Arc::new(MapHost::new());
    let o = run(
        0,
        r#"const names = Object.getOwnPropertyNames(globalThis);
           for (const bad of ["require", "std", "os", "process", "setTimeout", "setInterval", "fetch",
                              "XMLHttpRequest", "print", "scriptArgs", "module", "exports", "Deno", "Bun"]) {
             if (names.includes(bad)) throw new Error("global " + bad + " exists");
           }
           emit(names.sort().join(","));"#,
        host,
    );
    o.result.unwrap();
    eprintln!("globals: {}", o.emitted[0]);
}

#[test]
fn sandbox_refuses_require_std_os_import_and_eval_escapes() {
    let host = Arc::new(MapHost::new());
    let cases = [
        ("require", r#"require("fs")"#),
        ("std", r#"std.open("/etc/passwd", "r")"#),
        ("os", r#"os.exec(["/bin/sh"])"#),
        ("eval-require", r#"eval("require('child_process')")"#),
        ("function-this", r#"const g = Function("return this")(); g.os.exec(["ls"])"#),
        ("indirect-eval", r#"(0, eval)("std").loadFile("/etc/passwd")"#),
        ("constructor", r#"(function(){}).constructor("return process")().exit(1)"#),
        ("static-import", r#"import * as std from "std";"#),
        ("atomics-wait", r#"Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0)"#),
    ];
    for (name, src) in cases {
        let o = run(1, src, host.clone());
        let e = o.result.expect_err(name);
        assert_eq!(e.lambda, 1);
        assert_eq!(e.reason.kind(), "threw", "{name}: {e}");
        eprintln!("{name}: {e}");
    }
    // Dynamic import has no loader: the promise rejects; the lambda observes the rejection.
    let o = run(
        2,
        r#"import("std").then(() => emit("loaded"), (e) => emit("refused: " + e));
           import("./x.js").then(() => emit("loaded"), (e) => emit("refused: " + e));"#,
        host.clone(),
    );
    o.result.unwrap();
    assert_eq!(o.emitted.len(), 2);
    assert!(o.emitted.iter().all(|e| e.starts_with("refused")), "{:?}", o.emitted);
    // Host functions cannot be replaced by the lambda.
    let o = run(4, r#""use strict"; put = function(){}; "#, host);
    assert_eq!(o.result.unwrap_err().reason.kind(), "threw");
}

#[test]
fn sandbox_runaway_lambdas_are_stopped_and_others_finish() {
    let host = Arc::new(MapHost::new());
    let t0 = Instant::now();
    let hs: Vec<_> = [
        (10, "for(;;){}"),
        (11, "let a = []; for(;;) { a.push(new Array(100000).fill(1.5)); }"),
        (12, "let m = new Map(); for (let i = 0; ; i++) m.set(i, 'v' + i);"),
        (13, "function f(n) { return f(n + 1) + 1; } f(0);"),
        (14, "try { for(;;){} } catch (e) { emit('caught'); } for(;;){}"),
        (15, "throw new TypeError('boom');"),
        (16, "let n = 0; for (let i = 0; i < 100000; i++) n += i; put('ok', String(n)); emit(n);"),
    ]
    .into_iter()
    .map(|(id, src)| {
        // The two allocating lambdas get CPU time to spare, so that what stops them is the
        // memory limit under test, not the CPU limit on a slow or loaded machine (debug QuickJS
        // fills 16 MiB in about the 300 ms the others get).
        let lim = if id == 11 || id == 12 {
            SandboxLimits { cpu_time: Duration::from_secs(4), ..limits() }
        } else {
            limits()
        };
        spawn_lambda(LambdaSpec { id, count: 7, program: src.into(), input: None }, host.clone(), lim).unwrap()
    })
    .collect();
    let outs: Vec<LambdaOutcome> = hs.into_iter().map(|h| h.join()).collect();
    assert!(t0.elapsed() < Duration::from_secs(10));
    let kinds: Vec<_> = outs.iter().map(|o| o.result.as_ref().err().map(|e| e.reason.kind())).collect();
    for o in &outs {
        eprintln!("{}: {:?} {:?}", o.id, o.result, o.emitted);
    }
    assert_eq!(kinds[0], Some("cpu-time"));
    assert_eq!(kinds[1], Some("memory"));
    assert_eq!(kinds[2], Some("memory"));
    assert_eq!(kinds[3], Some("threw")); // stack overflow is an exception
    assert_eq!(kinds[4], Some("cpu-time"));
    assert!(outs[4].emitted.is_empty(), "the interrupt cannot be caught");
    assert_eq!(kinds[5], Some("threw"));
    assert!(outs[5].result.as_ref().unwrap_err().to_string().contains("lambda 15"));
    assert_eq!(kinds[6], None);
    assert_eq!(outs[6].emitted, vec!["4999950000"]);
    assert_eq!(host.get("ok").unwrap().map(|e| e.value), Some(KvValue::Text("4999950000".into())));
}

#[test]
fn sandbox_refuses_oversized_program_and_limits_emits() {
    let host = Arc::new(MapHost::new());
    let big = "x".repeat(limits().program_bytes_max + 1);
    let o = run(5, &big, host.clone());
    assert_eq!(o.result.unwrap_err().reason.kind(), "refused");
    let o = run(6, "for (let i = 0; i < 20000; i++) emit(i);", host);
    let e = o.result.unwrap_err();
    assert!(e.to_string().contains("emit limit"), "{e}");
    assert_eq!(o.emitted.len(), limits().emits_max);
}

//! In one job, lambdas that loop forever, allocate without bound, call require, touch std/os
//! or eval around the host API are stopped or refused; the others finish normally.
mod common;

const PROGRAM: &str = r#"
switch (lambda.id) {
  case 0: for (;;) {}
  case 1: { const a = []; for (;;) a.push(new Array(100000).fill(lambda.id)); }
  case 2: require("fs").readFileSync("/etc/passwd");
  case 3: std.loadFile("/etc/passwd") + os.exec(["/bin/sh"]);
  case 4: (0, eval)("Function('return this')()").os.exec(["ls"]);
  default: put("ok/" + lambda.id, "1"); emit("fine " + lambda.id);
}
"#;

#[test]
fn faas_misbehaving_lambdas_are_stopped_others_complete() {
    let d = common::deployment(7, vec![]);
    let r = common::run(&d, PROGRAM, 7, None);
    assert!(!r.ok);
    let kind = |i: usize| r.lambdas[i].error_kind.as_deref();
    assert_eq!(kind(0), Some("cpu-time"));
    assert_eq!(kind(1), Some("memory"));
    for i in 2..=4 {
        assert_eq!(kind(i), Some("threw"), "lambda {i}: {:?}", r.lambdas[i].error);
    }
    assert!(r.lambdas[2].error.as_ref().unwrap().contains("lambda 2"));
    assert!(r.lambdas[2].error.as_ref().unwrap().contains("require is not defined"));
    for i in 5..7 {
        assert_eq!(kind(i), None);
        assert_eq!(r.lambdas[i].emitted, vec![format!("fine {i}")]);
    }
}

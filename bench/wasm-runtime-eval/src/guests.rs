//! The guest modules, in WAT, converted with the `wat` crate at run time (no wasm32 target).
//! Every runtime runs exactly the same bytes.

/// The small module: one imported host function, one page of memory, a data segment.
/// - `run()`: one host call (`get(0, 3)` over the bytes "key"), answering 3 + b'k' = 110.
/// - `calls(n)`: `n` host calls in a loop; `nocalls(n)`: the same loop with the call replaced
///   by a one-byte memory load, to separate the loop's cost from the call's.
/// - `grow(pages)`: `memory.grow`, to check the memory limit.
/// - `spin()`: an endless loop, to check the CPU limit (fuel, epoch).
pub const SMALL: &str = r#"
(module
  (import "env" "get" (func $get (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "key")
  (func (export "run") (result i32)
    (call $get (i32.const 0) (i32.const 3)))
  (func (export "calls") (param $n i32) (result i32)
    (local $acc i32)
    (block $done
      (loop $l
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $acc (i32.add (local.get $acc) (call $get (i32.const 0) (i32.const 3))))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $l)))
    (local.get $acc))
  (func (export "nocalls") (param $n i32) (result i32)
    (local $acc i32)
    (block $done
      (loop $l
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $acc (i32.add (local.get $acc) (i32.load8_u (i32.and (local.get $n) (i32.const 0xffff)))))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $l)))
    (local.get $acc))
  (func (export "grow") (param $pages i32) (result i32)
    (memory.grow (local.get $pages)))
  (func (export "spin")
    (loop $l (br $l))))
"#;

/// What `run()` answers: the key's length (3) plus its first byte (b'k').
pub const RUN_ANSWER: i32 = 3 + b'k' as i32;

/// The Monte Carlo inner loop of `examples/montecarlo.js`, instruction for instruction:
/// xorshift32 (`s ^= s << 13; s ^= s >>> 17; s ^= s << 5`), `x = s / 2^32` (here a multiply by
/// 2^-32, which is exact and so bit-identical to JS's division), the same for `y`, and a count
/// of `x*x + y*y <= 1`. `mc(n, seed)` answers `inside`.
pub fn montecarlo() -> String {
    let rand = |v: &str| {
        format!(
            "(local.set $s (i32.xor (local.get $s) (i32.shl (local.get $s) (i32.const 13))))
        (local.set $s (i32.xor (local.get $s) (i32.shr_u (local.get $s) (i32.const 17))))
        (local.set $s (i32.xor (local.get $s) (i32.shl (local.get $s) (i32.const 5))))
        (local.set ${v} (f64.mul (f64.convert_i32_u (local.get $s)) (f64.const 0x1p-32)))"
        )
    };
    format!(
        r#"
(module
  (func (export "mc") (param $n i32) (param $seed i32) (result i32)
    (local $s i32) (local $i i32) (local $inside i32) (local $x f64) (local $y f64)
    (local.set $s (local.get $seed))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        {x}
        {y}
        (if (f64.le (f64.add (f64.mul (local.get $x) (local.get $x))
                             (f64.mul (local.get $y) (local.get $y)))
                    (f64.const 1))
          (then (local.set $inside (i32.add (local.get $inside) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (local.get $inside)))
"#,
        x = rand("x"),
        y = rand("y")
    )
}

/// The same loop natively (the baseline); `n` and `seed` go through `black_box` at the caller.
#[inline(never)]
pub fn native_mc(n: u32, seed: u32) -> u32 {
    let mut s = seed;
    let mut inside = 0u32;
    let mut rand = || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s as f64 / 4294967296.0
    };
    for _ in 0..n {
        let x = rand();
        let y = rand();
        if x * x + y * y <= 1.0 {
            inside += 1;
        }
    }
    inside
}

/// The seed of lambda 0 in `montecarlo.js`: `(0 + 1) * 2654435761 >>> 0`.
pub const SEED: u32 = 2654435761;

/// A synthetic larger module for compile throughput: `funcs` functions, each a variant of the
/// Monte Carlo loop with different shift constants plus some integer work and a call to its
/// neighbour, so no two bodies are alike. About 190 bytes of code per function.
pub fn big(funcs: usize) -> String {
    let mut w = String::from("(module\n  (memory (export \"memory\") 1)\n");
    for k in 0..funcs {
        let (a, b, c) = (1 + k % 29, 1 + (k * 7) % 31, 1 + (k * 13) % 23);
        let call = if k + 1 < funcs {
            format!("(call $f{} (i32.and (local.get $inside) (i32.const 3)) (local.get $s))", k + 1)
        } else {
            "(i32.const 0)".to_string()
        };
        w.push_str(&format!(
            r#"  (func $f{k} (export "f{k}") (param $n i32) (param $seed i32) (result i32)
    (local $s i32) (local $i i32) (local $inside i32) (local $x f64) (local $y f64)
    (local.set $s (local.get $seed))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i32.xor (local.get $s) (i32.shl (local.get $s) (i32.const {a}))))
        (local.set $s (i32.xor (local.get $s) (i32.shr_u (local.get $s) (i32.const {b}))))
        (local.set $s (i32.xor (local.get $s) (i32.shl (local.get $s) (i32.const {c}))))
        (local.set $x (f64.mul (f64.convert_i32_u (local.get $s)) (f64.const 0x1p-32)))
        (local.set $y (f64.sqrt (f64.add (local.get $x) (f64.const {k}))))
        (i32.store (i32.and (local.get $s) (i32.const 0xfffc))
                   (i32.add (i32.load (i32.and (local.get $i) (i32.const 0xfffc))) (local.get $s)))
        (if (f64.le (f64.mul (local.get $x) (local.get $y)) (f64.const 0.5))
          (then (local.set $inside (i32.add (local.get $inside) (i32.const 1))))
          (else (local.set $inside (i32.sub (local.get $inside) (i32.rotl (local.get $s) (i32.const {a}))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (i32.add (local.get $inside) {call}))
"#
        ));
    }
    w.push_str(")\n");
    w
}

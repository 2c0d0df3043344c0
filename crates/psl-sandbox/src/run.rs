//! Running one lambda: a fresh QuickJS runtime and context, the host API, the limits.

use crate::host::{HostError, KvEntry, KvHost};
use crate::limits::SandboxLimits;
use crate::value::KvValue;
use rquickjs::function::{Opt, Rest};
use rquickjs::{Array, Coerced, Context, Ctx, Exception, Function, Object, Runtime, TypedArray, Value};
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run: the program, the lambda's identity within its job, the job input.
#[derive(Clone)]
pub struct LambdaSpec {
    /// This lambda's index within its job, `0..count` (the lambda's `lambda.id`).
    pub id: u32,
    /// How many lambdas the job runs (the lambda's `lambda.count`).
    pub count: u32,
    /// The JavaScript source to evaluate (at most [`SandboxLimits::program_bytes_max`] bytes).
    pub program: Arc<str>,
    /// The job input, seen as `lambda.input` (`null` when `None`).
    pub input: Option<Arc<str>>,
}

impl fmt::Debug for LambdaSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The program and input are the user's confidential data: never printed.
        write!(f, "LambdaSpec(id={}, count={}, program={} bytes)", self.id, self.count, self.program.len())
    }
}

/// Why a lambda stopped before finishing normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Used more CPU time than allowed (interrupted; JS cannot catch this).
    CpuTime {
        /// The CPU-time limit that was exceeded.
        limit: Duration,
    },
    /// Ran longer than allowed on the wall clock (interrupted).
    WallTime {
        /// The wall-clock limit that was exceeded.
        limit: Duration,
    },
    /// Hit the memory limit.
    Memory {
        /// The memory limit that was hit, in bytes.
        limit: usize,
    },
    /// The program threw (or failed to compile) and did not catch it.
    Threw {
        /// The exception's text (or the compile error).
        message: String,
    },
    /// The program was refused before it ran.
    Refused {
        /// Why it was refused (e.g. the program or input is over its size limit).
        why: String,
    },
    /// The sandbox itself failed (could not make a runtime, thread died).
    Sandbox {
        /// What failed.
        why: String,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::CpuTime { limit } => write!(f, "CPU-time limit of {limit:?} exceeded"),
            StopReason::WallTime { limit } => write!(f, "wall-clock limit of {limit:?} exceeded"),
            StopReason::Memory { limit } => write!(f, "memory limit of {limit} bytes exceeded"),
            StopReason::Threw { message } => write!(f, "uncaught exception: {message}"),
            StopReason::Refused { why } => write!(f, "refused: {why}"),
            StopReason::Sandbox { why } => write!(f, "sandbox failure: {why}"),
        }
    }
}

impl StopReason {
    /// A stable short name (for JSON output and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            StopReason::CpuTime { .. } => "cpu-time",
            StopReason::WallTime { .. } => "wall-time",
            StopReason::Memory { .. } => "memory",
            StopReason::Threw { .. } => "threw",
            StopReason::Refused { .. } => "refused",
            StopReason::Sandbox { .. } => "sandbox",
        }
    }
}

/// A lambda that did not finish normally: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lambda {lambda} stopped: {reason}")]
pub struct LambdaError {
    /// The lambda's id ([`LambdaSpec::id`]).
    pub lambda: u32,
    /// Why it stopped.
    pub reason: StopReason,
}

/// Everything a lambda produced, however it ended.
#[derive(Debug, Clone)]
pub struct LambdaOutcome {
    /// The lambda's id ([`LambdaSpec::id`]).
    pub id: u32,
    /// The values passed to `emit`, as strings, in call order (also those before a stop).
    pub emitted: Vec<String>,
    /// The `log` lines kept, in call order (see [`SandboxLimits::log_lines_max`]).
    pub logs: Vec<String>,
    /// `Ok` if the program ran to its end, else why it stopped.
    pub result: Result<(), LambdaError>,
    /// When the lambda started (before its runtime was built).
    pub started_at: Instant,
    /// When the lambda made its first host call (`put`/`get`/`del`/`sync`), if it made one.
    pub first_op_at: Option<Instant>,
    /// When the lambda ended (however it ended).
    pub finished_at: Instant,
    /// CPU time the lambda's thread used.
    pub cpu: Duration,
    /// How many host calls (`put`/`get`/`del`/`sync`/`scan`, ...) the lambda made.
    pub host_ops: u64,
}

/// A lambda running on its own thread.
pub struct LambdaHandle {
    id: u32,
    started_at: Instant,
    thread: std::thread::JoinHandle<LambdaOutcome>,
}

impl LambdaHandle {
    /// The lambda's id ([`LambdaSpec::id`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Waits for the lambda. A thread that panicked becomes a `Sandbox` error, never a panic here.
    pub fn join(self) -> LambdaOutcome {
        let id = self.id;
        let started_at = self.started_at;
        self.thread.join().unwrap_or_else(|_| LambdaOutcome {
            id,
            emitted: Vec::new(),
            logs: Vec::new(),
            result: Err(LambdaError {
                lambda: id,
                reason: StopReason::Sandbox { why: "lambda thread panicked".into() },
            }),
            started_at,
            first_op_at: None,
            finished_at: Instant::now(),
            cpu: Duration::ZERO,
            host_ops: 0,
        })
    }
}

/// Starts `spec` on a new thread (named `lambda-ID`) with its own QuickJS runtime.
pub fn spawn_lambda(spec: LambdaSpec, host: Arc<dyn KvHost>, limits: SandboxLimits) -> std::io::Result<LambdaHandle> {
    let id = spec.id;
    let started_at = Instant::now();
    let thread = std::thread::Builder::new()
        .name(format!("lambda-{id}"))
        .stack_size(limits.thread_stack_bytes.max(limits.stack_bytes + (1 << 20)))
        .spawn(move || run_lambda(spec, host, limits))?;
    Ok(LambdaHandle { id, started_at, thread })
}

/// CPU time consumed by the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; it has no other effect.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

#[derive(Default)]
struct State {
    emitted: Vec<String>,
    emit_bytes: usize,
    logs: Vec<String>,
    first_op: Option<Instant>,
    host_ops: u64,
    interrupted: Option<StopReason>,
}

const PRELUDE: &str = r#"
(function () {
  "use strict";
  const g = globalThis;
  // Atomics.wait would block the thread where no interrupt can reach it: not offered.
  delete g.Atomics;
  delete g.SharedArrayBuffer;
  for (const name of ["put", "get", "getEntry", "del", "batch", "sync", "scan", "putJSON", "getJSON", "emit", "log"]) {
    Object.defineProperty(g, name, { value: g[name], writable: false, configurable: false });
  }
  Object.freeze(g.lambda);
})();
"#;

/// Runs `spec` on the calling thread to completion or to a limit.
pub fn run_lambda(spec: LambdaSpec, host: Arc<dyn KvHost>, limits: SandboxLimits) -> LambdaOutcome {
    let started_at = Instant::now();
    let cpu0 = thread_cpu();
    let state = Rc::new(RefCell::new(State::default()));
    let result = run_inner(&spec, host, &limits, state.clone(), started_at, cpu0);
    let st = std::mem::take(&mut *state.borrow_mut());
    let result = result.map_err(|reason| LambdaError { lambda: spec.id, reason });
    if let Err(e) = &result {
        tracing::debug!("{e}");
    }
    LambdaOutcome {
        id: spec.id,
        emitted: st.emitted,
        logs: st.logs,
        result,
        started_at,
        first_op_at: st.first_op,
        finished_at: Instant::now(),
        cpu: thread_cpu().saturating_sub(cpu0),
        host_ops: st.host_ops,
    }
}

fn run_inner(
    spec: &LambdaSpec,
    host: Arc<dyn KvHost>,
    limits: &SandboxLimits,
    state: Rc<RefCell<State>>,
    started_at: Instant,
    cpu0: Duration,
) -> Result<(), StopReason> {
    if spec.program.len() > limits.program_bytes_max {
        return Err(StopReason::Refused {
            why: format!("program is {} bytes, over the limit of {}", spec.program.len(), limits.program_bytes_max),
        });
    }
    if let Some(i) = &spec.input {
        if i.len() > limits.input_bytes_max {
            return Err(StopReason::Refused {
                why: format!("input is {} bytes, over the limit of {}", i.len(), limits.input_bytes_max),
            });
        }
    }
    let sandbox = |e: rquickjs::Error| StopReason::Sandbox { why: e.to_string() };
    let rt = Runtime::new().map_err(sandbox)?;
    rt.set_memory_limit(limits.memory_bytes);
    rt.set_max_stack_size(limits.stack_bytes);
    {
        let st = state.clone();
        let (cpu_limit, wall_limit) = (limits.cpu_time, limits.wall_time);
        let wall_deadline = started_at + wall_limit;
        rt.set_interrupt_handler(Some(Box::new(move || {
            let mut s = st.borrow_mut();
            if s.interrupted.is_some() {
                return true;
            }
            if Instant::now() >= wall_deadline {
                s.interrupted = Some(StopReason::WallTime { limit: wall_limit });
                return true;
            }
            if thread_cpu().saturating_sub(cpu0) >= cpu_limit {
                s.interrupted = Some(StopReason::CpuTime { limit: cpu_limit });
                return true;
            }
            false
        })));
    }
    let ctx = Context::full(&rt).map_err(sandbox)?;
    let outcome = ctx.with(|ctx| -> Result<(), StopReason> {
        install(&ctx, spec, host, limits, state.clone()).map_err(|e| classify(&ctx, e, &state, limits))?;
        ctx.eval::<(), _>(PRELUDE).map_err(|e| classify(&ctx, e, &state, limits))?;
        ctx.eval::<(), _>(spec.program.as_bytes().to_vec()).map_err(|e| classify(&ctx, e, &state, limits))?;
        Ok(())
    });
    if let Err(StopReason::Threw { message }) = &outcome {
        // An allocation that fails while building the exception leaves a bare value behind;
        // the allocator's count tells what happened.
        let used = rt.memory_usage().malloc_size.max(0) as usize;
        if used + (256 << 10) >= limits.memory_bytes {
            tracing::debug!("lambda {} threw '{message}' at the memory limit", spec.id);
            return Err(StopReason::Memory { limit: limits.memory_bytes });
        }
    }
    outcome?;
    // Promise jobs (async functions) queued by the program run under the same limits.
    while rt.is_job_pending() {
        match rt.execute_pending_job() {
            Ok(_) => {}
            Err(job) => {
                let ctx = job.0;
                let reason = ctx.with(|ctx| classify(&ctx, rquickjs::Error::Exception, &state, limits));
                return Err(reason);
            }
        }
    }
    if let Some(r) = state.borrow_mut().interrupted.take() {
        return Err(r);
    }
    Ok(())
}

/// Turns a failed evaluation into the reason the lambda stopped.
fn classify(ctx: &Ctx<'_>, e: rquickjs::Error, state: &Rc<RefCell<State>>, limits: &SandboxLimits) -> StopReason {
    if let Some(r) = state.borrow_mut().interrupted.take() {
        return r;
    }
    let message = match e {
        rquickjs::Error::Exception => match ctx.catch() {
            v if v.is_exception() || v.is_object() => match Exception::from_value(v.clone()) {
                Ok(ex) => {
                    let m = ex.message().unwrap_or_default();
                    let name: String =
                        ex.get::<_, Coerced<String>>("name").map(|c| c.0).unwrap_or_else(|_| "Error".into());
                    format!("{name}: {m}")
                }
                Err(_) => coerce(v),
            },
            v => coerce(v),
        },
        rquickjs::Error::Allocation => return StopReason::Memory { limit: limits.memory_bytes },
        other => other.to_string(),
    };
    if message.contains("out of memory") {
        return StopReason::Memory { limit: limits.memory_bytes };
    }
    StopReason::Threw { message: truncate(message, 4096) }
}

fn coerce(v: Value<'_>) -> String {
    match v.get::<Coerced<String>>() {
        Ok(s) => s.0,
        Err(_) => "(a value that cannot be shown)".into(),
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn note_op(state: &Rc<RefCell<State>>) {
    let mut s = state.borrow_mut();
    s.host_ops += 1;
    if s.first_op.is_none() {
        s.first_op = Some(Instant::now());
    }
}

fn install<'js>(
    ctx: &Ctx<'js>,
    spec: &LambdaSpec,
    host: Arc<dyn KvHost>,
    limits: &SandboxLimits,
    state: Rc<RefCell<State>>,
) -> rquickjs::Result<()> {
    let g = ctx.globals();
    let lambda = Object::new(ctx.clone())?;
    lambda.set("id", spec.id)?;
    lambda.set("count", spec.count)?;
    match &spec.input {
        Some(i) => lambda.set("input", i.as_ref())?,
        None => lambda.set("input", Value::new_null(ctx.clone()))?,
    }
    g.set("lambda", lambda)?;
    install_writes(ctx, &g, &host, limits, &state)?;
    install_reads(ctx, &g, &host, limits, &state)?;
    install_sync_and_output(ctx, &g, host, limits, state)
}

/// `put`, `putJSON` and `del`.
fn install_writes<'js>(
    ctx: &Ctx<'js>,
    g: &Object<'js>,
    host: &Arc<dyn KvHost>,
    limits: &SandboxLimits,
    state: &Rc<RefCell<State>>,
) -> rquickjs::Result<()> {
    let lim = *limits;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "put",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, key: Coerced<String>, value: Value<'js>, opts: Opt<Value<'js>>| {
                note_op(&st);
                let v = to_kv(&ctx, "put", value)?;
                write(&ctx, &*h, &lim, "put", &key.0, Some(v), opts.0)
            },
        )?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "putJSON",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, key: Coerced<String>, value: Value<'js>, opts: Opt<Value<'js>>| {
                note_op(&st);
                let text = ctx.json_stringify(value)?.ok_or_else(|| {
                    Exception::throw_type(
                        &ctx,
                        "putJSON: the value has no JSON form (undefined, a function or a symbol)",
                    )
                })?;
                write(&ctx, &*h, &lim, "putJSON", &key.0, Some(KvValue::Json(text.to_string()?)), opts.0)
            },
        )?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "del",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, key: Coerced<String>, opts: Opt<Value<'js>>| {
            note_op(&st);
            write(&ctx, &*h, &lim, "del", &key.0, None, opts.0)
        })?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "batch",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, ops: Value<'js>, opts: Opt<Value<'js>>| {
            note_op(&st);
            batch(&ctx, &*h, &lim, ops, opts.0)
        })?,
    )?;
    Ok(())
}

/// `batch([{put: key, value: v} | {del: key}, ...], {durable})`: every op or none, atomically
/// (`KvHost::batch`); a value as `put` takes it.
fn batch<'js>(
    ctx: &Ctx<'js>,
    h: &dyn KvHost,
    lim: &SandboxLimits,
    ops: Value<'js>,
    opts: Option<Value<'js>>,
) -> rquickjs::Result<()> {
    let what = "batch";
    let o = opts_object(ctx, what, opts)?;
    let durable = durable_wait(ctx, lim, what, o.as_ref())?;
    let arr = ops.into_array().ok_or_else(|| {
        Exception::throw_type(ctx, "batch: give an array of {put: key, value} and {del: key} objects")
    })?;
    if arr.is_empty() || arr.len() > crate::host::BATCH_OPS_MAX {
        return Err(Exception::throw_range(
            ctx,
            &format!("batch: 1 to {} ops, not {}", crate::host::BATCH_OPS_MAX, arr.len()),
        ));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, op) in arr.iter::<Value<'js>>().enumerate() {
        let op =
            op?.into_object().ok_or_else(|| Exception::throw_type(ctx, &format!("batch: op {i} is not an object")))?;
        let put: Option<Coerced<String>> = op.get("put")?;
        let del: Option<Coerced<String>> = op.get("del")?;
        match (put, del) {
            (Some(k), None) => {
                let v = to_kv(ctx, what, op.get::<_, Value<'js>>("value")?)?;
                check_value_len(ctx, &format!("batch: op {i}"), lim, &v)?;
                out.push((k.0, Some(v)));
            }
            (None, Some(k)) => out.push((k.0, None)),
            _ => {
                return Err(Exception::throw_type(ctx, &format!("batch: op {i} must name exactly one of put and del")))
            }
        }
    }
    h.batch(&out).map_err(|e| throw_host(ctx, what, e))?;
    if let Some(t) = durable {
        h.sync_durable(t).map_err(|e| throw_host(ctx, what, e))?;
    }
    Ok(())
}

/// `get`, `getJSON`, `getEntry` and `scan`.
fn install_reads<'js>(
    ctx: &Ctx<'js>,
    g: &Object<'js>,
    host: &Arc<dyn KvHost>,
    limits: &SandboxLimits,
    state: &Rc<RefCell<State>>,
) -> rquickjs::Result<()> {
    let lim = *limits;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "get",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, key: Coerced<String>| -> rquickjs::Result<Value<'js>> {
            note_op(&st);
            match h.get(&key.0).map_err(|e| throw_host(&ctx, "get", e))? {
                Some(e) => to_js(&ctx, &e.value),
                None => Ok(Value::new_null(ctx)),
            }
        })?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "getJSON",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, key: Coerced<String>| -> rquickjs::Result<Value<'js>> {
            note_op(&st);
            match h.get(&key.0).map_err(|e| throw_host(&ctx, "getJSON", e))?.map(|e| e.value) {
                Some(KvValue::Json(t)) | Some(KvValue::Text(t)) => ctx.json_parse(t),
                Some(KvValue::Bytes(_)) => Err(Exception::throw_type(
                    &ctx,
                    &format!("getJSON: the value of {:?} is bytes, not JSON (read it with get)", key.0),
                )),
                None => Ok(Value::new_null(ctx)),
            }
        })?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "getEntry",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, key: Coerced<String>| -> rquickjs::Result<Value<'js>> {
            note_op(&st);
            match h.get(&key.0).map_err(|e| throw_host(&ctx, "getEntry", e))? {
                Some(e) => Ok(entry_obj(&ctx, &e)?.into_value()),
                None => Ok(Value::new_null(ctx)),
            }
        })?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "scan",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, prefix: Coerced<String>, opts: Opt<Value<'js>>| -> rquickjs::Result<Array<'js>> {
                note_op(&st);
                let o = opts_object(&ctx, "scan", opts.0)?;
                let limit = match o.as_ref().map(|o| o.get::<_, Value>("limit")).transpose()? {
                    Some(v) if !v.is_undefined() && !v.is_null() => {
                        let n = v.as_number().unwrap_or(f64::NAN);
                        if !(n >= 1.0 && n <= lim.scan_limit_max as f64 && n.fract() == 0.0) {
                            return Err(Exception::throw_range(
                                &ctx,
                                &format!("scan: limit must be an integer in 1 ..= {}", lim.scan_limit_max),
                            ));
                        }
                        n as usize
                    }
                    _ => lim.scan_limit_default,
                };
                let after = match o.as_ref().map(|o| o.get::<_, Value>("after")).transpose()? {
                    Some(v) if !v.is_undefined() && !v.is_null() => Some(v.get::<Coerced<String>>()?.0),
                    _ => None,
                };
                let found = h.scan(&prefix.0, after.as_deref(), limit).map_err(|e| throw_host(&ctx, "scan", e))?;
                let out = Array::new(ctx.clone())?;
                for (i, e) in found.iter().take(limit).enumerate() {
                    out.set(i, entry_obj(&ctx, e)?)?;
                }
                Ok(out)
            },
        )?,
    )?;
    Ok(())
}

/// `sync`, `emit` and `log`.
fn install_sync_and_output<'js>(
    ctx: &Ctx<'js>,
    g: &Object<'js>,
    host: Arc<dyn KvHost>,
    limits: &SandboxLimits,
    state: Rc<RefCell<State>>,
) -> rquickjs::Result<()> {
    let lim = *limits;
    let (h, st) = (host, state.clone());
    g.set(
        "sync",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, opts: Opt<Value<'js>>| -> rquickjs::Result<()> {
            note_op(&st);
            let o = opts_object(&ctx, "sync", opts.0)?;
            match durable_wait(&ctx, &lim, "sync", o.as_ref())? {
                Some(t) => h.sync_durable(t),
                None => h.sync(),
            }
            .map_err(|e| throw_host(&ctx, "sync", e))
        })?,
    )?;
    let (st, lim) = (state.clone(), *limits);
    g.set(
        "emit",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, value: Coerced<String>| -> rquickjs::Result<()> {
            let mut s = st.borrow_mut();
            if s.emitted.len() >= lim.emits_max || s.emit_bytes + value.0.len() > lim.emit_bytes_max {
                return Err(Exception::throw_range(
                    &ctx,
                    &format!("emit limit reached ({} results or {} bytes)", lim.emits_max, lim.emit_bytes_max),
                ));
            }
            s.emit_bytes += value.0.len();
            s.emitted.push(value.0);
            Ok(())
        })?,
    )?;
    let (st, lim) = (state, *limits);
    g.set(
        "log",
        Function::new(ctx.clone(), move |parts: Rest<Coerced<String>>| {
            let mut s = st.borrow_mut();
            if s.logs.len() < lim.log_lines_max {
                let line = parts.0.into_iter().map(|c| c.0).collect::<Vec<_>>().join(" ");
                s.logs.push(truncate(line, lim.log_line_bytes_max));
            }
        })?,
    )?;
    Ok(())
}

/// A JS value to store: a `Uint8Array` (or `Uint8ClampedArray`) or `ArrayBuffer` is bytes,
/// another typed array or a `DataView` is refused (its bytes depend on the platform's
/// endianness: pass a `Uint8Array` over its buffer), anything else is converted to a string.
fn to_kv<'js>(ctx: &Ctx<'js>, what: &str, v: Value<'js>) -> rquickjs::Result<KvValue> {
    if let Some(o) = v.as_object() {
        let copy = |raw: Option<std::ptr::NonNull<[u8]>>| -> rquickjs::Result<KvValue> {
            let raw = raw.ok_or_else(|| Exception::throw_type(ctx, &format!("{what}: the buffer is detached")))?;
            // SAFETY: `raw` points at the buffer's bytes, valid until JavaScript runs again; it is
            // copied here at once, before any call back into the engine.
            Ok(KvValue::Bytes(unsafe { raw.as_ref() }.to_vec()))
        };
        if let Some(a) = o.as_typed_array::<u8>() {
            return copy(a.as_raw());
        }
        if let Some(a) = o.as_typed_array::<rquickjs::U8Clamped>() {
            return copy(a.as_raw());
        }
        if let Some(b) = o.as_array_buffer() {
            return copy(b.as_raw());
        }
        let other_view = o.is_typed_array::<i8>()
            || o.is_typed_array::<i16>()
            || o.is_typed_array::<u16>()
            || o.is_typed_array::<i32>()
            || o.is_typed_array::<u32>()
            || o.is_typed_array::<f32>()
            || o.is_typed_array::<f64>()
            || o.is_typed_array::<i64>()
            || o.is_typed_array::<u64>()
            || o.get::<_, Object>("constructor")
                .and_then(|c| c.get::<_, String>("name"))
                .is_ok_and(|n| n == "DataView");
        if other_view {
            return Err(Exception::throw_type(
                ctx,
                &format!(
                    "{what}: bytes are a Uint8Array or an ArrayBuffer (wrap other views: new Uint8Array(v.buffer))"
                ),
            ));
        }
    }
    Ok(KvValue::Text(v.get::<Coerced<String>>()?.0))
}

/// A stored value as JS: text and JSON as their string, bytes as a fresh `Uint8Array`.
fn to_js<'js>(ctx: &Ctx<'js>, v: &KvValue) -> rquickjs::Result<Value<'js>> {
    match v {
        KvValue::Text(s) | KvValue::Json(s) => Ok(rquickjs::String::from_str(ctx.clone(), s)?.into_value()),
        KvValue::Bytes(b) => Ok(TypedArray::<u8>::new(ctx.clone(), b.clone())?.into_value()),
    }
}

/// `{ key, value, type, lamport, writer }`. `lamport` is a number: exact below 2^53.
fn entry_obj<'js>(ctx: &Ctx<'js>, e: &KvEntry) -> rquickjs::Result<Object<'js>> {
    let o = Object::new(ctx.clone())?;
    o.set("key", e.key.as_str())?;
    o.set("value", to_js(ctx, &e.value)?)?;
    o.set("type", e.value.kind())?;
    o.set("lamport", e.lamport as f64)?;
    o.set("writer", e.writer)?;
    Ok(o)
}

/// The options argument: an object, or absent (`undefined`/`null`).
fn opts_object<'js>(ctx: &Ctx<'js>, what: &str, v: Option<Value<'js>>) -> rquickjs::Result<Option<Object<'js>>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_undefined() || v.is_null() => Ok(None),
        Some(v) => match v.into_object() {
            Some(o) => Ok(Some(o)),
            None => Err(Exception::throw_type(ctx, &format!("{what}: options must be an object"))),
        },
    }
}

/// `Some(bound)` when the options ask for durability (`durable: true`), the bound from
/// `timeoutMs` (1 ms to the limit's maximum) or the default.
fn durable_wait<'js>(
    ctx: &Ctx<'js>,
    lim: &SandboxLimits,
    what: &str,
    o: Option<&Object<'js>>,
) -> rquickjs::Result<Option<std::time::Duration>> {
    let Some(o) = o else { return Ok(None) };
    if !o.get::<_, Coerced<bool>>("durable")?.0 {
        return Ok(None);
    }
    let t: Value = o.get("timeoutMs")?;
    if t.is_undefined() || t.is_null() {
        return Ok(Some(lim.durable_timeout));
    }
    let ms = t.as_number().unwrap_or(f64::NAN);
    if ms.is_nan() || ms < 1.0 {
        return Err(Exception::throw_range(ctx, &format!("{what}: timeoutMs must be a number of milliseconds >= 1")));
    }
    // `from_secs_f64` panics past Duration's range (and on infinity): clamp first.
    let max = lim.durable_timeout_max;
    Ok(Some(if ms / 1e3 < max.as_secs_f64() { std::time::Duration::from_secs_f64(ms / 1e3) } else { max }))
}

/// A put (`value` some) or delete, then the durability wait if the options ask for it.
fn write<'js>(
    ctx: &Ctx<'js>,
    h: &dyn KvHost,
    lim: &SandboxLimits,
    what: &str,
    key: &str,
    value: Option<KvValue>,
    opts: Option<Value<'js>>,
) -> rquickjs::Result<()> {
    let o = opts_object(ctx, what, opts)?;
    let durable = durable_wait(ctx, lim, what, o.as_ref())?;
    match &value {
        Some(v) => {
            check_value_len(ctx, what, lim, v)?;
            h.put(key, v)
        }
        None => h.del(key),
    }
    .map_err(|e| throw_host(ctx, what, e))?;
    if let Some(t) = durable {
        h.sync_durable(t).map_err(|e| throw_host(ctx, what, e))?;
    }
    Ok(())
}

/// A `RangeError` naming `what` and the limit when `v` is over [`SandboxLimits::value_bytes_max`].
fn check_value_len(ctx: &Ctx<'_>, what: &str, lim: &SandboxLimits, v: &KvValue) -> rquickjs::Result<()> {
    if v.payload_len() > lim.value_bytes_max {
        return Err(Exception::throw_range(
            ctx,
            &format!("{what}: the value is {} bytes, over the limit of {} bytes", v.payload_len(), lim.value_bytes_max),
        ));
    }
    Ok(())
}

/// A host failure as a JS exception: an `Error` naming the call, or, for a durability wait
/// that fell short, a `DurabilityError` with `acked`, `quorum` and `servers`.
fn throw_host(ctx: &Ctx<'_>, what: &str, e: HostError) -> rquickjs::Error {
    match e {
        HostError::Failed(m) => Exception::throw_message(ctx, &format!("{what}: {m}")),
        HostError::NotDurable { message, acked_by, quorum, servers } => {
            let made = (|| -> rquickjs::Result<Value<'_>> {
                let ex = Exception::from_message(ctx.clone(), &format!("{what}: {message}"))?;
                ex.set("name", "DurabilityError")?;
                ex.set("acked", acked_by as u32)?;
                ex.set("quorum", quorum as u32)?;
                ex.set("servers", servers)?;
                Ok(ex.into_value())
            })();
            match made {
                Ok(v) => ctx.throw(v),
                Err(e) => e,
            }
        }
    }
}

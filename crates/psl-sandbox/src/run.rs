//! Running one lambda: a fresh QuickJS runtime and context, the host API, the limits.

use crate::host::KvHost;
use crate::limits::SandboxLimits;
use rquickjs::function::Rest;
use rquickjs::{Coerced, Context, Ctx, Exception, Function, Object, Runtime, Value};
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run: the program, the lambda's identity within its job, the job input.
#[derive(Clone)]
pub struct LambdaSpec {
    pub id: u32,
    pub count: u32,
    pub program: Arc<str>,
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
    CpuTime { limit: Duration },
    /// Ran longer than allowed on the wall clock (interrupted).
    WallTime { limit: Duration },
    /// Hit the memory limit.
    Memory { limit: usize },
    /// The program threw (or failed to compile) and did not catch it.
    Threw { message: String },
    /// The program was refused before it ran.
    Refused { why: String },
    /// The sandbox itself failed (could not make a runtime, thread died).
    Sandbox { why: String },
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lambda {lambda} stopped: {reason}")]
pub struct LambdaError {
    pub lambda: u32,
    pub reason: StopReason,
}

/// Everything a lambda produced, however it ended.
#[derive(Debug, Clone)]
pub struct LambdaOutcome {
    pub id: u32,
    pub emitted: Vec<String>,
    pub logs: Vec<String>,
    pub result: Result<(), LambdaError>,
    pub started_at: Instant,
    /// When the lambda made its first host call (`put`/`get`/`del`/`sync`), if it made one.
    pub first_op_at: Option<Instant>,
    pub finished_at: Instant,
    pub cpu: Duration,
    pub host_ops: u64,
}

/// A lambda running on its own thread.
pub struct LambdaHandle {
    id: u32,
    started_at: Instant,
    thread: std::thread::JoinHandle<LambdaOutcome>,
}

impl LambdaHandle {
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
  const put = g.put, get = g.get;
  // Atomics.wait would block the thread where no interrupt can reach it: not offered.
  delete g.Atomics;
  delete g.SharedArrayBuffer;
  Object.defineProperty(g, "putJSON", { value: function putJSON(k, v) { return put(k, JSON.stringify(v)); } });
  Object.defineProperty(g, "getJSON", { value: function getJSON(k) { const s = get(k); return s === null ? null : JSON.parse(s); } });
  for (const name of ["put", "get", "del", "sync", "emit", "log"]) {
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

    let (h, st) = (host.clone(), state.clone());
    g.set(
        "put",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, key: Coerced<String>, value: Coerced<String>| -> rquickjs::Result<()> {
                note_op(&st);
                h.put(&key.0, &value.0).map_err(|e| Exception::throw_message(&ctx, &format!("put: {e}")))
            },
        )?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "get",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, key: Coerced<String>| -> rquickjs::Result<Value<'js>> {
            note_op(&st);
            match h.get(&key.0).map_err(|e| Exception::throw_message(&ctx, &format!("get: {e}")))? {
                Some(v) => Ok(rquickjs::String::from_str(ctx.clone(), &v)?.into_value()),
                None => Ok(Value::new_null(ctx)),
            }
        })?,
    )?;
    let (h, st) = (host.clone(), state.clone());
    g.set(
        "del",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, key: Coerced<String>| -> rquickjs::Result<()> {
            note_op(&st);
            h.del(&key.0).map_err(|e| Exception::throw_message(&ctx, &format!("del: {e}")))
        })?,
    )?;
    let (h, st) = (host, state.clone());
    g.set(
        "sync",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>| -> rquickjs::Result<()> {
            note_op(&st);
            h.sync().map_err(|e| Exception::throw_message(&ctx, &format!("sync: {e}")))
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

//! The wasmtime side: Cranelift JIT, `StoreLimits` for memory, fuel or epochs for CPU.

use crate::guests;
use crate::report::{Limit, Params, RtReport};
use crate::stats::{dist, median};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::{
    Caller, Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Memory, Module,
    PoolingAllocationConfig, Store, StoreLimits, StoreLimitsBuilder, Trap,
};

type R<T> = wasmtime::Result<T>;

pub struct Host {
    limits: StoreLimits,
    mem: Option<Memory>,
}

fn engine(limit: Limit, pooling: bool) -> R<Engine> {
    let mut c = Config::new();
    match limit {
        Limit::None => {}
        Limit::Fuel => {
            c.consume_fuel(true);
        }
        Limit::Epoch => {
            c.epoch_interruption(true);
        }
    }
    if pooling {
        // A small pool: slots are reserved up front (virtual memory), reused per instance.
        let mut p = PoolingAllocationConfig::new();
        p.total_memories(16).total_tables(16).total_core_instances(16).max_memory_size(64 << 20);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(p));
    }
    Engine::new(&c)
}

fn linker(engine: &Engine) -> R<Linker<Host>> {
    let mut l = Linker::<Host>::new(engine);
    l.func_wrap("env", "get", |caller: Caller<'_, Host>, ptr: i32, len: i32| -> i32 {
        match caller.data().mem {
            Some(m) => crate::host_get(m.data(&caller), ptr, len),
            None => -1,
        }
    })?;
    Ok(l)
}

/// A fresh store as a lambda would get it: 64 MiB memory limit, the CPU budget armed.
fn store(engine: &Engine, limit: Limit, fuel: u64) -> R<Store<Host>> {
    let limits = StoreLimitsBuilder::new().memory_size(64 << 20).instances(1).build();
    let mut s = Store::new(engine, Host { limits, mem: None });
    s.limiter(|h| &mut h.limits);
    match limit {
        Limit::None => {}
        Limit::Fuel => s.set_fuel(fuel)?,
        Limit::Epoch => s.set_epoch_deadline(1 << 40),
    }
    Ok(s)
}

fn wire_memory(s: &mut Store<Host>, inst: &wasmtime::Instance) {
    let m = inst.get_memory(&mut *s, "memory");
    s.data_mut().mem = m;
}

/// Bumps the engine's epoch every 10 ms while alive (what a real deployment would run).
struct Ticker(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);
impl Ticker {
    fn start(engine: &Engine) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let (e, st) = (engine.clone(), stop.clone());
        let h = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
                e.increment_epoch();
            }
        });
        Ticker(stop, Some(h))
    }
}
impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

enum How<'a> {
    Compile(&'a [u8]),
    Module(&'a Module),
    Pre(&'a InstancePre<Host>),
}

/// One instantiation: (store + instantiate, that + one call + drop).
fn once(engine: &Engine, linker: &Linker<Host>, how: &How) -> R<(Duration, Duration)> {
    let t = Instant::now();
    let mut s = store(engine, Limit::Fuel, 10_000_000)?;
    let inst = match how {
        How::Compile(wasm) => {
            let m = Module::new(engine, wasm)?;
            linker.instantiate(&mut s, &m)?
        }
        How::Module(m) => linker.instantiate(&mut s, m)?,
        How::Pre(p) => p.instantiate(&mut s)?,
    };
    wire_memory(&mut s, &inst);
    let d_inst = t.elapsed();
    let run = inst.get_typed_func::<(), i32>(&mut s, "run")?;
    let r = run.call(&mut s, ())?;
    drop(s);
    let d_cycle = t.elapsed();
    assert_eq!(r, guests::RUN_ANSWER);
    Ok((d_inst, d_cycle))
}

fn inst_series(rep: &mut RtReport, name: &str, n: usize, engine: &Engine, linker: &Linker<Host>, how: How) -> R<()> {
    for _ in 0..n.min(50) {
        once(engine, linker, &how)?;
    }
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (i, c) = once(engine, linker, &how)?;
        a.push(i);
        b.push(c);
    }
    rep.inst.push((name.to_string(), dist(a), dist(b)));
    Ok(())
}

pub fn run(p: &Params) -> R<RtReport> {
    let mut rep = RtReport::new("wasmtime", &crate::wasmtime_version());
    let small = wat::parse_str(guests::SMALL)?;
    let mc = wat::parse_str(guests::montecarlo())?;

    // Instantiation (fuel engine: the production-like configuration, same as wasmi's).
    {
        let e = engine(Limit::Fuel, false)?;
        let l = linker(&e)?;
        let module = Module::new(&e, &small)?;
        let pre = l.instantiate_pre(&module)?;
        inst_series(&mut rep, "compile + instantiate", p.compile_iters, &e, &l, How::Compile(&small))?;
        inst_series(&mut rep, "instantiate (Linker, pre-compiled Module)", p.inst_iters, &e, &l, How::Module(&module))?;
        inst_series(&mut rep, "instantiate (InstancePre)", p.inst_iters, &e, &l, How::Pre(&pre))?;
        let ep = engine(Limit::Fuel, true)?;
        let lp = linker(&ep)?;
        let prep = lp.instantiate_pre(&Module::new(&ep, &small)?)?;
        inst_series(&mut rep, "instantiate (InstancePre, pooling allocator)", p.inst_iters, &ep, &lp, How::Pre(&prep))?;
    }

    // Compile throughput on the small, the Monte Carlo and the synthetic large module.
    {
        let e = engine(Limit::Fuel, false)?;
        let big = wat::parse_str(guests::big(p.big_funcs))?;
        for (name, bytes) in [("small", &small), ("montecarlo", &mc), ("big", &big)] {
            let mut v = Vec::new();
            for _ in 0..p.compile_reps {
                let t = Instant::now();
                let m = Module::new(&e, bytes)?;
                v.push(t.elapsed().as_secs_f64() * 1e3);
                drop(m);
            }
            rep.compile.push((format!("{name} ({} B)", bytes.len()), "Module::new (Cranelift, 1 thread)".into(), median(v)));
        }
    }

    for limit in [Limit::None, Limit::Fuel, Limit::Epoch] {
        let e = engine(limit, false)?;
        let _ticker = (limit == Limit::Epoch).then(|| Ticker::start(&e));
        let l = linker(&e)?;

        // Host calls.
        let m = Module::new(&e, &small)?;
        let mut s = store(&e, limit, u64::MAX)?;
        let inst = l.instantiate(&mut s, &m)?;
        wire_memory(&mut s, &inst);
        let calls = inst.get_typed_func::<i32, i32>(&mut s, "calls")?;
        let nocalls = inst.get_typed_func::<i32, i32>(&mut s, "nocalls")?;
        let n = p.host_calls;
        let mut vc = Vec::new();
        let mut vn = Vec::new();
        let f0 = s.get_fuel().ok();
        assert_eq!(calls.call(&mut s, n as i32)?, (n as i32).wrapping_mul(guests::RUN_ANSWER));
        let fuel_per_call = f0.zip(s.get_fuel().ok()).map(|(a, b)| (a - b) as f64 / n as f64);
        for _ in 0..p.reps {
            let t = Instant::now();
            std::hint::black_box(calls.call(&mut s, n as i32)?);
            vc.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
            let t = Instant::now();
            std::hint::black_box(nocalls.call(&mut s, n as i32)?);
            vn.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        }
        rep.hostcall.push((limit, median(vc), median(vn), fuel_per_call));

        // Monte Carlo.
        let m = Module::new(&e, &mc)?;
        let mut s = store(&e, limit, u64::MAX)?;
        let inst = l.instantiate(&mut s, &m)?;
        let f = inst.get_typed_func::<(i32, i32), i32>(&mut s, "mc")?;
        let mut v = Vec::new();
        let mut inside = 0;
        let mut fuel_per_point = None;
        for _ in 0..p.reps {
            let f0 = s.get_fuel().ok();
            let t = Instant::now();
            inside = f.call(&mut s, (p.points as i32, guests::SEED as i32))? as u32;
            v.push(t.elapsed().as_secs_f64() * 1e9 / p.points as f64);
            fuel_per_point = f0.zip(s.get_fuel().ok()).map(|(a, b)| (a - b) as f64 / p.points as f64);
        }
        rep.mc.push((limit, median(v), inside, fuel_per_point));
    }

    limits(&mut rep, &small)?;
    Ok(rep)
}

/// Checks that each limit stops a guest: fuel and epochs against `spin()`, the store's memory
/// limit against `grow()`.
fn limits(rep: &mut RtReport, small: &[u8]) -> R<()> {
    // Fuel: 100 M units.
    let e = engine(Limit::Fuel, false)?;
    let l = linker(&e)?;
    let m = Module::new(&e, small)?;
    let mut s = store(&e, Limit::Fuel, 100_000_000)?;
    let inst = l.instantiate(&mut s, &m)?;
    let spin = inst.get_typed_func::<(), ()>(&mut s, "spin")?;
    let t = Instant::now();
    let err = spin.call(&mut s, ()).expect_err("spin ends only by a trap");
    let ok = err.downcast_ref::<Trap>() == Some(&Trap::OutOfFuel);
    rep.limits.push(("fuel: spin() with 100M fuel".into(), ok, format!("trapped after {:.1} ms: {}", t.elapsed().as_secs_f64() * 1e3, trap(&err))));

    // Epoch: a deadline of 5 ticks of 10 ms.
    let e = engine(Limit::Epoch, false)?;
    let ticker = Ticker::start(&e);
    let l = linker(&e)?;
    let m = Module::new(&e, small)?;
    let mut s = store(&e, Limit::Epoch, 0)?;
    s.set_epoch_deadline(5);
    let inst = l.instantiate(&mut s, &m)?;
    let spin = inst.get_typed_func::<(), ()>(&mut s, "spin")?;
    let t = Instant::now();
    let err = spin.call(&mut s, ()).expect_err("spin ends only by a trap");
    let ok = err.downcast_ref::<Trap>() == Some(&Trap::Interrupt);
    rep.limits.push(("epoch: spin() with a deadline of 5 ticks x 10 ms".into(), ok, format!("trapped after {:.1} ms: {}", t.elapsed().as_secs_f64() * 1e3, trap(&err))));
    drop(ticker);

    // Memory: 64 MiB = 1024 pages; the module starts with 1.
    let e = engine(Limit::None, false)?;
    let l = linker(&e)?;
    let m = Module::new(&e, small)?;
    let mut s = store(&e, Limit::None, 0)?;
    let inst = l.instantiate(&mut s, &m)?;
    let grow = inst.get_typed_func::<i32, i32>(&mut s, "grow")?;
    let a = grow.call(&mut s, 1023)?;
    let b = grow.call(&mut s, 1)?;
    rep.limits.push((
        "memory: StoreLimits 64 MiB; grow(1023) then grow(1)".into(),
        a == 1 && b == -1,
        format!("grow(1023) = {a} (old size), grow(1) = {b} (refused)"),
    ));
    Ok(())
}

fn trap(err: &wasmtime::Error) -> String {
    err.downcast_ref::<Trap>().map(|t| t.to_string()).unwrap_or_else(|| err.to_string())
}

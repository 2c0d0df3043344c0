//! The wasmi side: an interpreter (register bytecode), `StoreLimits` for memory, fuel for CPU.

use crate::guests;
use crate::report::{Limit, Params, RtReport};
use crate::stats::{dist, median};
use std::time::{Duration, Instant};
use wasmi::{
    Caller, CompilationMode, Config, Engine, Linker, Memory, Module, Store, StoreLimits,
    StoreLimitsBuilder, TrapCode,
};

type R<T> = Result<T, wasmi::Error>;

pub struct Host {
    limits: StoreLimits,
    mem: Option<Memory>,
}

fn engine(limit: Limit, mode: CompilationMode) -> Engine {
    let mut c = Config::default();
    c.compilation_mode(mode);
    if limit == Limit::Fuel {
        c.consume_fuel(true);
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

/// A fresh store as a lambda would get it: 64 MiB memory limit, the fuel budget armed.
fn store(engine: &Engine, limit: Limit, fuel: u64) -> R<Store<Host>> {
    let limits = StoreLimitsBuilder::new().memory_size(64 << 20).instances(1).build();
    let mut s = Store::new(engine, Host { limits, mem: None });
    s.limiter(|h| &mut h.limits);
    if limit == Limit::Fuel {
        s.set_fuel(fuel)?;
    }
    Ok(s)
}

fn wire_memory(s: &mut Store<Host>, inst: &wasmi::Instance) {
    let m = inst.get_memory(&*s, "memory");
    s.data_mut().mem = m;
}

enum How<'a> {
    Parse(&'a [u8]),
    Module(&'a Module),
}

fn once(engine: &Engine, linker: &Linker<Host>, how: &How) -> R<(Duration, Duration)> {
    let t = Instant::now();
    let mut s = store(engine, Limit::Fuel, 10_000_000)?;
    let inst = match how {
        How::Parse(wasm) => {
            let m = Module::new(engine, wasm)?;
            linker.instantiate_and_start(&mut s, &m)?
        }
        How::Module(m) => linker.instantiate_and_start(&mut s, m)?,
    };
    wire_memory(&mut s, &inst);
    let d_inst = t.elapsed();
    let run = inst.get_typed_func::<(), i32>(&s, "run")?;
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
    let mut rep = RtReport::new("wasmi", &crate::wasmi_version());
    let wat = |s: &str| wat::parse_str(s).map_err(|e| wasmi::Error::new(e.to_string()));
    let small = wat(guests::SMALL)?;
    let mc = wat(guests::montecarlo().as_str())?;

    // Instantiation (fuel engine, default lazy translation).
    {
        let e = engine(Limit::Fuel, CompilationMode::LazyTranslation);
        let l = linker(&e)?;
        let module = Module::new(&e, &small)?;
        inst_series(&mut rep, "parse + validate + instantiate", p.inst_iters, &e, &l, How::Parse(&small))?;
        inst_series(&mut rep, "instantiate (pre-parsed Module)", p.inst_iters, &e, &l, How::Module(&module))?;
    }

    // Parse/validate/translate throughput.
    {
        let big = wat(guests::big(p.big_funcs).as_str())?;
        for (mode_name, mode) in [
            ("Module::new (validate, lazy translation: default)", CompilationMode::LazyTranslation),
            ("Module::new (validate + translate eagerly)", CompilationMode::Eager),
        ] {
            let e = engine(Limit::Fuel, mode);
            for (name, bytes) in [("small", &small), ("montecarlo", &mc), ("big", &big)] {
                let mut v = Vec::new();
                for _ in 0..p.compile_reps {
                    let t = Instant::now();
                    let m = Module::new(&e, bytes)?;
                    v.push(t.elapsed().as_secs_f64() * 1e3);
                    drop(m);
                }
                rep.compile.push((format!("{name} ({} B)", bytes.len()), mode_name.into(), median(v)));
            }
        }
    }

    for limit in [Limit::None, Limit::Fuel] {
        let e = engine(limit, CompilationMode::LazyTranslation);
        let l = linker(&e)?;

        let m = Module::new(&e, &small)?;
        let mut s = store(&e, limit, u64::MAX)?;
        let inst = l.instantiate_and_start(&mut s, &m)?;
        wire_memory(&mut s, &inst);
        let calls = inst.get_typed_func::<i32, i32>(&s, "calls")?;
        let nocalls = inst.get_typed_func::<i32, i32>(&s, "nocalls")?;
        let n = p.host_calls;
        let f0 = s.get_fuel().ok();
        assert_eq!(calls.call(&mut s, n as i32)?, (n as i32).wrapping_mul(guests::RUN_ANSWER));
        let fuel_per_call = f0.zip(s.get_fuel().ok()).map(|(a, b)| (a - b) as f64 / n as f64);
        let (mut vc, mut vn) = (Vec::new(), Vec::new());
        for _ in 0..p.reps {
            let t = Instant::now();
            std::hint::black_box(calls.call(&mut s, n as i32)?);
            vc.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
            let t = Instant::now();
            std::hint::black_box(nocalls.call(&mut s, n as i32)?);
            vn.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        }
        rep.hostcall.push((limit, median(vc), median(vn), fuel_per_call));

        let m = Module::new(&e, &mc)?;
        let mut s = store(&e, limit, u64::MAX)?;
        let inst = l.instantiate_and_start(&mut s, &m)?;
        let f = inst.get_typed_func::<(i32, i32), i32>(&s, "mc")?;
        let (mut v, mut inside, mut fuel_per_point) = (Vec::new(), 0, None);
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

fn limits(rep: &mut RtReport, small: &[u8]) -> R<()> {
    let e = engine(Limit::Fuel, CompilationMode::LazyTranslation);
    let l = linker(&e)?;
    let m = Module::new(&e, small)?;
    let mut s = store(&e, Limit::Fuel, 100_000_000)?;
    let inst = l.instantiate_and_start(&mut s, &m)?;
    let spin = inst.get_typed_func::<(), ()>(&s, "spin")?;
    let t = Instant::now();
    let err = spin.call(&mut s, ()).expect_err("spin ends only by a trap");
    let ok = err.as_trap_code() == Some(TrapCode::OutOfFuel);
    rep.limits.push(("fuel: spin() with 100M fuel".into(), ok, format!("trapped after {:.1} ms: {err}", t.elapsed().as_secs_f64() * 1e3)));

    let e = engine(Limit::None, CompilationMode::LazyTranslation);
    let l = linker(&e)?;
    let m = Module::new(&e, small)?;
    let mut s = store(&e, Limit::None, 0)?;
    let inst = l.instantiate_and_start(&mut s, &m)?;
    let grow = inst.get_typed_func::<i32, i32>(&s, "grow")?;
    let a = grow.call(&mut s, 1023)?;
    let b = grow.call(&mut s, 1)?;
    rep.limits.push((
        "memory: StoreLimits 64 MiB; grow(1023) then grow(1)".into(),
        a == 1 && b == -1,
        format!("grow(1023) = {a} (old size), grow(1) = {b} (refused)"),
    ));
    Ok(())
}

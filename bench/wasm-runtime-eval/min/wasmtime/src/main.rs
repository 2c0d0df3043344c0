//! Minimal wasmtime embedding as PSL would link it: compile the guest with Cranelift, a store
//! with a memory limit and fuel, one host function reading guest memory, one call.
#[path = "../../guest.rs"]
mod guest;

use wasmtime::{Caller, Config, Engine, Linker, Memory, Module, Store, StoreLimits, StoreLimitsBuilder};

struct Host {
    limits: StoreLimits,
    mem: Option<Memory>,
}

fn main() -> wasmtime::Result<()> {
    let mut cfg = Config::new();
    cfg.consume_fuel(true);
    let engine = Engine::new(&cfg)?;
    let module = Module::new(&engine, guest::GUEST)?;
    let mut linker = Linker::<Host>::new(&engine);
    linker.func_wrap("env", "get", |caller: Caller<'_, Host>, ptr: i32, len: i32| -> i32 {
        match caller.data().mem {
            Some(m) => guest::host_get(m.data(&caller), ptr, len),
            None => -1,
        }
    })?;
    let limits = StoreLimitsBuilder::new().memory_size(64 << 20).build();
    let mut store = Store::new(&engine, Host { limits, mem: None });
    store.limiter(|h| &mut h.limits);
    store.set_fuel(1_000_000)?;
    let instance = linker.instantiate(&mut store, &module)?;
    let mem = instance.get_memory(&mut store, "memory").ok_or_else(|| wasmtime::format_err!("no memory"))?;
    store.data_mut().mem = Some(mem);
    let run = instance.get_typed_func::<(), i32>(&mut store, "run")?;
    println!("wasmtime: run() = {}", run.call(&mut store, ())?);
    Ok(())
}

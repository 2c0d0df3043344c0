//! Minimal wasmi embedding as PSL would link it: validate and translate the guest, a store
//! with a memory limit and fuel, one host function reading guest memory, one call.
#[path = "../../guest.rs"]
mod guest;

use wasmi::{Caller, Config, Engine, Linker, Memory, Module, Store, StoreLimits, StoreLimitsBuilder};

struct Host {
    limits: StoreLimits,
    mem: Option<Memory>,
}

fn main() -> Result<(), wasmi::Error> {
    let mut cfg = Config::default();
    cfg.consume_fuel(true);
    let engine = Engine::new(&cfg);
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
    let instance = linker.instantiate_and_start(&mut store, &module)?;
    let mem = instance.get_memory(&store, "memory").ok_or_else(|| wasmi::Error::new("no memory"))?;
    store.data_mut().mem = Some(mem);
    let run = instance.get_typed_func::<(), i32>(&store, "run")?;
    println!("wasmi: run() = {}", run.call(&mut store, ())?);
    Ok(())
}

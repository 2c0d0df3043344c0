//! Baseline with no runtime: the host function called natively on a buffer.
#[path = "../../guest.rs"]
mod guest;

fn main() {
    let mut mem = vec![0u8; 65536];
    mem[..3].copy_from_slice(b"key");
    let mem = std::hint::black_box(mem);
    println!("native: get() = {} (guest {} bytes)", guest::host_get(&mem, 0, 3), guest::GUEST.len());
}

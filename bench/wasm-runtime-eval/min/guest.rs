// The guest every minimal binary runs, as hand-assembled wasm bytes (no `wat` dependency):
//
// (module
//   (import "env" "get" (func $get (param i32 i32) (result i32)))
//   (memory (export "memory") 1)
//   (func (export "run") (result i32) (call $get (i32.const 0) (i32.const 3)))
//   (data (i32.const 0) "key"))
#[allow(dead_code)]
pub const GUEST: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x0b, 0x02, 0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f, 0x60, 0x00, 0x01, 0x7f, // types
    0x02, 0x0b, 0x01, 0x03, b'e', b'n', b'v', 0x03, b'g', b'e', b't', 0x00, 0x00, // import env.get
    0x03, 0x02, 0x01, 0x01, // one function of type 1
    0x05, 0x03, 0x01, 0x00, 0x01, // memory: min 1 page
    0x07, 0x10, 0x02, 0x06, b'm', b'e', b'm', b'o', b'r', b'y', 0x02, 0x00, 0x03, b'r', b'u', b'n', 0x00,
    0x01, // exports
    0x0a, 0x0a, 0x01, 0x08, 0x00, 0x41, 0x00, 0x41, 0x03, 0x10, 0x00, 0x0b, // code
    0x0b, 0x09, 0x01, 0x00, 0x41, 0x00, 0x0b, 0x03, b'k', b'e', b'y', // data "key" at 0
];

/// The host function's body, shared by every binary: bounds-checked read of `len` bytes at
/// `ptr`, answering the length plus the first byte (so the read cannot be optimized away).
#[allow(dead_code)]
pub fn host_get(mem: &[u8], ptr: i32, len: i32) -> i32 {
    let (p, l) = (ptr as u32 as usize, len as u32 as usize);
    match p.checked_add(l).and_then(|end| mem.get(p..end)) {
        Some(key) if !key.is_empty() => key.len() as i32 + key[0] as i32,
        Some(_) => 0,
        None => -1,
    }
}

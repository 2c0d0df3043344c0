//! CapsuleDB's directory store log (`records.log`) as a damaged or hostile disk could leave it:
//! the scan at open never panics, every byte is either in a good frame or counted as skipped,
//! and a good frame appended after any garbage is found.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_capsuledb::store::scan_log;

fuzz_target!(|data: &[u8]| {
    let (records, damaged, skipped) = scan_log(data);
    assert!(skipped <= data.len());
    assert!(records <= data.len() / 44);
    assert!(damaged <= data.len());
    // A whole frame ("PSLB", len, hash, crc32 over len ‖ hash ‖ bytes) after the garbage.
    let body = b"fuzz";
    let hash = [0x5Au8; 32];
    let mut h = crc32fast::Hasher::new();
    h.update(&(body.len() as u32).to_le_bytes());
    h.update(&hash);
    h.update(body);
    let mut log = data.to_vec();
    log.extend_from_slice(b"PSLB");
    log.extend_from_slice(&(body.len() as u32).to_le_bytes());
    log.extend_from_slice(&hash);
    log.extend_from_slice(&h.finalize().to_le_bytes());
    log.extend_from_slice(body);
    let (records2, _, _) = scan_log(&log);
    assert!(records2 >= 1, "a good frame after garbage is found");
});

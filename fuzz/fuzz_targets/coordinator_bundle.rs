//! A coordinator host's decoders (`psl_faas::coordinator`): its key bundle, its rotation
//! bundles (both opened from the leader's sealed bytes) and the key statements the leader
//! sends over TLS. No bytes panic any of them; a decoded statement list re-encodes to a list
//! that decodes to the same statements.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_faas::coordinator::{
    decode_statements, encode_statements, parse_grant_bundle, parse_rotation_bundle, RotationStage,
};
use psl_faas::program::JobId;

fuzz_target!(|data: &[u8]| {
    // The job id is taken from the input, so that the checks past it are reached.
    let job = JobId(data.get(..16).and_then(|j| j.try_into().ok()).unwrap_or([0; 16]));
    for rank in 0..3u8 {
        let _ = parse_grant_bundle(data, job, 0, rank);
    }
    for stage in [
        RotationStage::Prepare { refuse_if_begun: false },
        RotationStage::Prepare { refuse_if_begun: true },
        RotationStage::Finish,
    ] {
        let _ = parse_rotation_bundle(data, job, 0, 1, stage);
    }
    if let Ok(list) = decode_statements(data) {
        let again = encode_statements(&list).expect("a decoded list is within the bound");
        assert_eq!(decode_statements(&again).expect("re-encoded").len(), list.len());
    }
});

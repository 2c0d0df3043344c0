//! Fabric frame decoder: never panics, never yields a frame over the limit, and the incremental
//! decoder (fed in arbitrary pieces) agrees with the one-shot decoder, errors included.
//! Input: 2 bytes of limit (LE), 1 byte of piece size, then the stream.
#![no_main]
use libfuzzer_sys::fuzz_target;
use psl_fabric::frame::{decode, encode, FrameDecoder, FRAME_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let max = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let piece = usize::from(data[2]).max(1);
    let stream = &data[3..];

    let mut whole = Vec::new();
    let mut whole_err = None;
    let mut rest = stream;
    loop {
        match decode(rest, max) {
            Ok(Some((payload, used))) => {
                assert!(payload.len() <= max);
                assert_eq!(used, FRAME_HEADER_BYTES + payload.len());
                whole.push(payload.to_vec());
                rest = &rest[used..];
            }
            Ok(None) => break,
            Err(e) => {
                whole_err = Some(e);
                break;
            }
        }
    }

    let mut dec = FrameDecoder::new(max);
    let mut pieces = Vec::new();
    let mut piece_err = None;
    for chunk in stream.chunks(piece) {
        if let Err(e) = dec.feed_all(chunk, &mut pieces) {
            piece_err = Some(e);
            break;
        }
    }
    assert_eq!(whole_err, piece_err);
    assert_eq!(pieces.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), whole);
    if whole_err.is_none() {
        assert_eq!(dec.buffered(), rest.len());
    }

    // Re-encoding the frames gives back exactly the bytes they were decoded from.
    let mut again = Vec::new();
    for p in &whole {
        again.extend(encode(p, max).expect("a decoded frame is within the limit"));
    }
    assert_eq!(&again[..], &stream[..again.len()]);
});

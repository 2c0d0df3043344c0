//! Wire framing of the TCP fabric: `u32 LE length ‖ payload`.
//!
//! The length counts payload bytes only and must not exceed the link's `frame_bytes_max`. A
//! zero-length frame is a heartbeat: it keeps an idle link alive and is never delivered.
//!
//! Decoding never panics and never allocates more than the announced length, which is checked
//! against the limit as soon as the 4 header bytes are in, before anything is allocated. The
//! body buffer grows with the bytes that actually arrive (doubling, capped at the announced
//! length), so a peer that announces 16 MiB and sends nothing costs 64 KiB, not 16 MiB. After an
//! error the stream cannot be resynchronised (nothing marks where the next frame starts): the
//! [`FrameDecoder`] keeps returning the same error and the link must be closed.

use bytes::Bytes;

/// Bytes of the length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;

/// First allocation for a frame body; it grows as bytes arrive.
const BODY_CHUNK: usize = 64 << 10;

/// A frame that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length (announced in a header, or of a payload to encode) is over the limit.
    #[error("frame length {len} exceeds frame_bytes_max {max}")]
    TooLarge {
        /// The frame's length, in bytes.
        len: u64,
        /// The limit (`frame_bytes_max`), in bytes.
        max: usize,
    },
}

/// The 4-byte header of a `len`-byte payload.
pub fn encode_header(len: usize, max: usize) -> Result<[u8; FRAME_HEADER_BYTES], FrameError> {
    if len > max || len > u32::MAX as usize {
        return Err(FrameError::TooLarge { len: len as u64, max });
    }
    Ok((len as u32).to_le_bytes())
}

/// One whole frame (header and payload) in a new buffer.
pub fn encode(payload: &[u8], max: usize) -> Result<Vec<u8>, FrameError> {
    let header = encode_header(payload.len(), max)?;
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Decodes the frame at the start of `buf`: `Ok(Some((payload, consumed)))` when it is complete,
/// `Ok(None)` when more bytes are needed, an error as soon as the header announces too much.
pub fn decode(buf: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(header) = buf.first_chunk::<FRAME_HEADER_BYTES>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len: len as u64, max });
    }
    let end = FRAME_HEADER_BYTES + len;
    match buf.get(FRAME_HEADER_BYTES..end) {
        Some(payload) => Ok(Some((payload, end))),
        None => Ok(None),
    }
}

/// Incremental decoder for a byte stream that arrives in arbitrary pieces.
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    header: [u8; FRAME_HEADER_BYTES],
    header_have: usize,
    /// The body being filled and its announced length, once the header is complete.
    body: Option<(Vec<u8>, usize)>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder refusing frames longer than `max` payload bytes.
    pub fn new(max: usize) -> Self {
        FrameDecoder { max, header: [0; FRAME_HEADER_BYTES], header_have: 0, body: None, failed: None }
    }

    /// The limit this decoder enforces.
    pub fn max(&self) -> usize {
        self.max
    }

    /// True between frames (no partial frame buffered).
    pub fn is_idle(&self) -> bool {
        self.header_have == 0 && self.body.is_none()
    }

    /// Bytes of the current partial frame held (header and body).
    pub fn buffered(&self) -> usize {
        self.header_have + self.body.as_ref().map_or(0, |(b, _)| b.len())
    }

    /// Consumes a prefix of `input`. Returns how many bytes were consumed and the frame's payload
    /// if one was completed; call again with the rest of `input` until it is all consumed. Stops
    /// right after a completed frame. An empty payload is a heartbeat.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Bytes>), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut used = 0;
        if self.body.is_none() {
            let take = (FRAME_HEADER_BYTES - self.header_have).min(input.len());
            self.header[self.header_have..self.header_have + take].copy_from_slice(&input[..take]);
            self.header_have += take;
            used += take;
            if self.header_have < FRAME_HEADER_BYTES {
                return Ok((used, None));
            }
            let len = u32::from_le_bytes(self.header) as usize;
            if len > self.max {
                let e = FrameError::TooLarge { len: len as u64, max: self.max };
                self.failed = Some(e.clone());
                return Err(e);
            }
            self.body = Some((Vec::with_capacity(len.min(BODY_CHUNK)), len));
        }
        let (body, len) = self.body.as_mut().expect("set above");
        let len = *len;
        let take = (len - body.len()).min(input.len() - used);
        if body.capacity() - body.len() < take {
            // Grow by doubling, never past the announced length.
            let target = (body.capacity() * 2).max(body.len() + take).min(len);
            body.reserve_exact(target - body.len());
        }
        body.extend_from_slice(&input[used..used + take]);
        used += take;
        if body.len() < len {
            return Ok((used, None));
        }
        let (body, _) = self.body.take().expect("set above");
        self.header_have = 0;
        Ok((used, Some(Bytes::from(body))))
    }

    /// Feeds all of `input`, appending every completed payload (heartbeats included) to `out`.
    pub fn feed_all(&mut self, mut input: &[u8], out: &mut Vec<Bytes>) -> Result<(), FrameError> {
        while !input.is_empty() {
            let (used, frame) = self.feed(input)?;
            input = &input[used..];
            out.extend(frame);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_is_u32_le_length() {
        assert_eq!(encode(b"abc", 16).unwrap(), [3, 0, 0, 0, b'a', b'b', b'c']);
        assert_eq!(encode(b"", 16).unwrap(), [0, 0, 0, 0]);
        assert_eq!(encode_header(0x0102_0304, usize::MAX).unwrap(), [4, 3, 2, 1]);
    }

    #[test]
    fn encode_refuses_over_limit() {
        assert_eq!(encode(&[0; 17], 16), Err(FrameError::TooLarge { len: 17, max: 16 }));
        assert!(encode(&[0; 16], 16).is_ok());
        assert!(encode_header(u32::MAX as usize + 1, usize::MAX).is_err());
    }

    #[test]
    fn decode_needs_whole_frame() {
        let f = encode(b"hello", 16).unwrap();
        for cut in 0..f.len() {
            assert_eq!(decode(&f[..cut], 16), Ok(None), "cut at {cut}");
        }
        assert_eq!(decode(&f, 16), Ok(Some((&b"hello"[..], 9))));
    }

    #[test]
    fn oversize_header_is_refused_before_the_body_arrives() {
        let header = 17u32.to_le_bytes();
        assert_eq!(decode(&header, 16), Err(FrameError::TooLarge { len: 17, max: 16 }));
        let mut d = FrameDecoder::new(16);
        assert_eq!(d.feed(&header[..3]), Ok((3, None)));
        assert_eq!(d.feed(&header[3..]), Err(FrameError::TooLarge { len: 17, max: 16 }));
        // Poisoned: the stream cannot be resynchronised.
        assert!(d.feed(&encode(b"x", 16).unwrap()).is_err());
    }

    #[test]
    fn max_u32_header_allocates_nothing_large() {
        let mut d = FrameDecoder::new(usize::MAX);
        let (used, frame) = d.feed(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
        assert_eq!((used, frame), (7, None));
        assert_eq!(d.buffered(), 7);
        assert!(d.body.as_ref().unwrap().0.capacity() <= BODY_CHUNK);
    }

    #[test]
    fn heartbeat_is_an_empty_frame() {
        let mut d = FrameDecoder::new(16);
        let mut out = Vec::new();
        d.feed_all(&[0, 0, 0, 0, 1, 0, 0, 0, 7], &mut out).unwrap();
        assert_eq!(out, vec![Bytes::new(), Bytes::from_static(&[7])]);
        assert!(d.is_idle());
    }

    #[test]
    fn body_capacity_never_exceeds_announced_length() {
        let len = 300_000;
        let payload = vec![5u8; len];
        let f = encode(&payload, len).unwrap();
        let mut d = FrameDecoder::new(len);
        let mut rest = &f[..];
        let mut got = None;
        while !rest.is_empty() {
            let n = rest.len().min(7_777);
            let (used, frame) = d.feed(&rest[..n]).unwrap();
            if let Some((b, l)) = &d.body {
                assert!(b.capacity() <= *l);
            }
            rest = &rest[used..];
            if frame.is_some() {
                got = frame;
            }
        }
        assert_eq!(got.unwrap(), payload);
    }

    fn frames_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..20)
    }

    proptest! {
        #[test]
        fn roundtrip_in_any_pieces(frames in frames_strategy(), cuts in prop::collection::vec(1usize..64, 1..50)) {
            let mut stream = Vec::new();
            for f in &frames {
                stream.extend(encode(f, 200).unwrap());
            }
            let mut d = FrameDecoder::new(200);
            let mut out = Vec::new();
            let mut rest = &stream[..];
            let mut i = 0;
            while !rest.is_empty() {
                let n = cuts[i % cuts.len()].min(rest.len());
                i += 1;
                d.feed_all(&rest[..n], &mut out).unwrap();
                rest = &rest[n..];
            }
            prop_assert!(d.is_idle());
            prop_assert_eq!(out.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), frames.clone());
            // The one-shot decoder agrees.
            let mut whole = Vec::new();
            let mut rest = &stream[..];
            while let Some((p, used)) = decode(rest, 200).unwrap() {
                whole.push(p.to_vec());
                rest = &rest[used..];
            }
            prop_assert!(rest.is_empty());
            prop_assert_eq!(whole, frames);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_respect_the_limit(
            data in prop::collection::vec(any::<u8>(), 0..600),
            max in 0usize..300,
            piece in 1usize..40,
        ) {
            let mut d = FrameDecoder::new(max);
            let mut rest = &data[..];
            while !rest.is_empty() {
                let n = piece.min(rest.len());
                match d.feed(&rest[..n]) {
                    Ok((used, frame)) => {
                        prop_assert!(used <= n);
                        prop_assert!(used > 0);
                        if let Some(f) = frame { prop_assert!(f.len() <= max); }
                        if let Some((b, l)) = &d.body {
                            prop_assert!(b.capacity() <= *l);
                            prop_assert!(*l <= max);
                        }
                        rest = &rest[used..];
                    }
                    Err(FrameError::TooLarge { len, max: m }) => {
                        prop_assert!(len as usize > max);
                        prop_assert_eq!(m, max);
                        break;
                    }
                }
            }
        }
    }
}

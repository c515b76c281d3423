//! What a loadgen record body carries, so a consumer can time it and a verifier can place
//! it without any state shared with the producer.
//!
//! ```text
//! 0        4              8                     16                    24          len
//! +--------+--------------+---------------------+---------------------+-----------+
//! | "NLG1" | stream (u32) | index (u64)         | send time (u64)     | filler    |
//! +--------+--------------+---------------------+---------------------+-----------+
//! ```
//!
//! Little-endian. `stream` is the stream's number in the run, `index` counts the stream's
//! records in the order they were sent (0, 1, 2, ...), `send time` is the intended send
//! time in Unix nanoseconds (the schedule's, in open loop, so a stall shows in end-to-end
//! latency too). The filler is a fixed byte pattern: records differ in their header.

pub const MAGIC: [u8; 4] = *b"NLG1";
const STREAM_AT: usize = 4;
const INDEX_AT: usize = STREAM_AT + 4;
const SENT_AT: usize = INDEX_AT + 8;
pub const HEADER_LEN: usize = SENT_AT + 8;

/// The header fields of a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Payload {
    pub stream: u32,
    pub index: u64,
    pub sent_unix_ns: u64,
}

impl Payload {
    /// Writes a body of `len` bytes (at least [`HEADER_LEN`]) into `out`, replacing it.
    pub fn write(&self, len: usize, filler: &[u8], out: &mut Vec<u8>) {
        debug_assert!(len >= HEADER_LEN && filler.len() >= len - HEADER_LEN);
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.stream.to_le_bytes());
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.sent_unix_ns.to_le_bytes());
        out.extend_from_slice(&filler[..len.saturating_sub(HEADER_LEN)]);
    }

    /// The header of a body loadgen wrote; None for any other body.
    pub fn parse(body: &[u8]) -> Option<Payload> {
        if body.len() < HEADER_LEN || body[..4] != MAGIC {
            return None;
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut stream = [0u8; 4];
        stream.copy_from_slice(&body[STREAM_AT..INDEX_AT]);
        Some(Payload {
            stream: u32::from_le_bytes(stream),
            index: u64_at(INDEX_AT),
            sent_unix_ns: u64_at(SENT_AT),
        })
    }
}

/// The filler pattern, long enough for any body.
pub fn filler(max_len: usize) -> Vec<u8> {
    (0..max_len).map(|i| (i % 251) as u8).collect()
}

/// FNV-1a over a body: the digest a hash chain links.
pub fn digest(body: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in body {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One link of a stream's hash chain: the previous link, the record's seq_num and its
/// body's digest. Producer and verifier compute the same chain over the same records in
/// seq_num order; any loss, duplicate, reordering or foreign record changes its end.
pub fn chain(previous: u64, seq_num: u64, digest: u64) -> u64 {
    let mut h = previous ^ 0x9e37_79b9_7f4a_7c15;
    for word in [seq_num, digest] {
        h = (h ^ word).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let p = Payload { stream: 7, index: 1 << 40, sent_unix_ns: 123_456_789 };
        let filler = filler(100);
        let mut body = Vec::new();
        p.write(100, &filler, &mut body);
        assert_eq!(body.len(), 100);
        assert_eq!(Payload::parse(&body), Some(p));
        p.write(HEADER_LEN, &filler, &mut body);
        assert_eq!(Payload::parse(&body), Some(p));
        assert_eq!(Payload::parse(&body[..HEADER_LEN - 1]), None);
        assert_eq!(Payload::parse(b"hello, this is not a loadgen record"), None);
    }

    #[test]
    fn the_chain_depends_on_order() {
        let (a, b) = (digest(b"a"), digest(b"b"));
        let in_order = chain(chain(0, 0, a), 1, b);
        assert_ne!(in_order, chain(chain(0, 0, b), 1, a));
        assert_ne!(in_order, chain(chain(0, 1, a), 0, b));
        assert_eq!(in_order, chain(chain(0, 0, a), 1, b));
    }
}

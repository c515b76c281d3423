//! A request body's bytes as they arrive, in order, kept until they are taken.
//!
//! hyper hands a body over in pieces that are slices of its read buffer, and a piece
//! keeps the whole buffer it was read into alive (8 KiB or more). Body memory counts a
//! piece's bytes, so a client that sends a body a byte at a time (one-byte chunks) would
//! hold a read buffer per byte it counts. A piece under [`KEPT_PIECE_BYTES_MIN`] is
//! therefore copied into a buffer of the server's own, beside the small pieces before it;
//! a larger one is kept as it came, so a body sent in large writes reaches the chunk
//! buffer with no copy on the way (a piece that large keeps a read buffer hyper filled
//! at least that much of, since hyper grows its buffer only on reads that fill it).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// The smallest piece kept as hyper read it; smaller ones are copied.
pub const KEPT_PIECE_BYTES_MIN: usize = 16 << 10;

/// Body bytes read and not yet taken.
#[derive(Default)]
pub struct Arrived {
    pieces: VecDeque<Bytes>,
    /// Small pieces after the last kept one, copied together.
    gathering: BytesMut,
    len: usize,
}

impl Arrived {
    /// The bytes arrived and not yet taken.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, piece: Bytes) {
        self.len += piece.len();
        if piece.len() < KEPT_PIECE_BYTES_MIN {
            // Room for the largest small piece, so that gathering grows by whole buffers.
            self.gathering.reserve(KEPT_PIECE_BYTES_MIN);
            self.gathering.extend_from_slice(&piece);
            if self.gathering.len() >= KEPT_PIECE_BYTES_MIN {
                self.seal();
            }
        } else {
            self.seal();
            self.pieces.push_back(piece);
        }
    }

    /// The gathered small pieces, as a piece of their own after the pieces before them.
    fn seal(&mut self) {
        if !self.gathering.is_empty() {
            self.pieces.push_back(self.gathering.split().freeze());
        }
    }

    /// The first `n` bytes, as slices of the pieces (no copy). `n <= self.len()`.
    pub fn take(&mut self, mut n: usize) -> Vec<Bytes> {
        assert!(n <= self.len, "take {n} of {} bytes", self.len);
        self.seal();
        self.len -= n;
        let mut taken = Vec::new();
        while n > 0 {
            let front = self.pieces.front_mut().expect("n <= len");
            if front.len() <= n {
                n -= front.len();
                taken.push(self.pieces.pop_front().expect("a front"));
            } else {
                taken.push(front.split_to(n));
                n = 0;
            }
        }
        taken
    }

    /// Everything arrived, taken.
    pub fn take_all(&mut self) -> Vec<Bytes> {
        self.take(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pieces_are_gathered_and_large_ones_kept_in_order() {
        let mut arrived = Arrived::default();
        let large = Bytes::from(vec![7u8; KEPT_PIECE_BYTES_MIN]);
        for byte in 0..3u8 {
            arrived.push(Bytes::from(vec![byte]));
        }
        arrived.push(large.clone());
        arrived.push(Bytes::from_static(b"xy"));
        assert_eq!(arrived.len(), 3 + KEPT_PIECE_BYTES_MIN + 2);
        let taken = arrived.take(4);
        assert_eq!(taken.concat(), [0, 1, 2, 7]);
        assert_eq!(taken.len(), 2, "the three small pieces went into one");
        let rest = arrived.take_all();
        assert_eq!(rest.len(), 2);
        assert_eq!(rest[0].as_ptr(), large[1..].as_ptr(), "the large piece is not copied");
        assert_eq!(&rest[1][..], b"xy");
        assert!(arrived.is_empty());
    }

    #[test]
    fn a_body_sent_a_byte_at_a_time_is_held_in_few_pieces() {
        let mut arrived = Arrived::default();
        let body: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        for byte in &body {
            arrived.push(Bytes::copy_from_slice(std::slice::from_ref(byte)));
        }
        assert!(arrived.pieces.len() <= body.len() / KEPT_PIECE_BYTES_MIN + 1);
        assert_eq!(arrived.take_all().concat(), body);
    }
}

//! A request body's bytes as they arrive, in order, kept until they are taken.
//!
//! hyper hands a body over in pieces that are slices of its read buffer, and a piece
//! keeps the whole buffer it was read into alive (8 KiB to about 400 KiB). Body memory
//! counts a piece's bytes, so a client that sends a body a byte at a time (one-byte
//! chunks) would hold a read buffer per byte it counts. A piece under
//! [`KEPT_PIECE_BYTES_MIN`] is therefore copied into a buffer of the server's own, beside
//! the small pieces before it; so is a large piece next to a small one, on either side,
//! since the buffer it shares with them may be mostly their chunk framing, which nothing
//! counts. Only a large piece between large ones is kept as it came: its buffer holds
//! body bytes that are counted, and a body sent in large writes reaches the chunk buffer
//! with no copy on the way.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// The smallest piece kept as hyper read it; smaller ones are copied.
pub const KEPT_PIECE_BYTES_MIN: usize = 16 << 10;

/// Body bytes read and not yet taken.
#[derive(Default)]
pub struct Arrived {
    pieces: VecDeque<Bytes>,
    /// Pieces copied since the last kept one, together.
    gathering: BytesMut,
    len: usize,
    /// The last piece that arrived was kept as it came, and is the last of `pieces`.
    last_kept: bool,
    /// The last piece that arrived was small.
    last_small: bool,
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
        let small = piece.len() < KEPT_PIECE_BYTES_MIN;
        if small && self.last_kept {
            // The large piece before it is next to a small one now: copied too.
            let kept = self.pieces.pop_back().expect("the last piece kept");
            self.copy(&kept);
        }
        if small || self.last_small {
            self.copy(&piece);
        } else {
            self.seal();
            self.pieces.push_back(piece);
        }
        self.last_kept = !small && !self.last_small;
        self.last_small = small;
    }

    fn copy(&mut self, piece: &[u8]) {
        // Room for the largest small piece, so that gathering grows by whole buffers.
        self.gathering.reserve(KEPT_PIECE_BYTES_MIN.max(piece.len()));
        self.gathering.extend_from_slice(piece);
        if self.gathering.len() >= KEPT_PIECE_BYTES_MIN {
            self.seal();
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
        // The back piece stays where it is unless everything is taken.
        self.last_kept &= self.len > 0;
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

    fn large(byte: u8) -> Bytes {
        Bytes::from(vec![byte; KEPT_PIECE_BYTES_MIN])
    }

    /// Whether `piece` is (a slice of) `of`, not a copy.
    fn kept(piece: &Bytes, of: &Bytes) -> bool {
        let range = of.as_ptr_range();
        range.contains(&piece.as_ptr())
    }

    #[test]
    fn large_pieces_between_large_ones_are_kept_and_the_rest_copied_in_order() {
        let mut arrived = Arrived::default();
        let (a, b, c, d) = (large(1), large(2), large(3), large(4));
        arrived.push(a.clone());
        arrived.push(b.clone());
        for byte in 5..8u8 {
            arrived.push(Bytes::from(vec![byte]));
        }
        arrived.push(c.clone());
        arrived.push(d.clone());
        let pieces = arrived.take_all();
        let expected = [&a[..], &b[..], &[5, 6, 7], &c[..], &d[..]].concat();
        assert_eq!(pieces.concat(), expected);
        assert!(kept(&pieces[0], &a), "between the body's start and a large piece");
        // b is next to the small pieces after it, c to those before it: both copied.
        assert!(pieces.iter().all(|p| !kept(p, &b) && !kept(p, &c)));
        assert!(kept(pieces.last().expect("d"), &d), "between a large piece and the end");
        assert!(arrived.is_empty());
    }

    #[test]
    fn a_piece_taken_apart_keeps_its_place() {
        let mut arrived = Arrived::default();
        let a = large(1);
        arrived.push(a.clone());
        assert_eq!(arrived.take(1).concat(), [1]);
        arrived.push(Bytes::from_static(b"xy"));
        let rest = arrived.take_all().concat();
        assert_eq!(rest.len(), KEPT_PIECE_BYTES_MIN + 1);
        assert_eq!(&rest[KEPT_PIECE_BYTES_MIN - 2..], [1, b'x', b'y']);
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

//! Bytes in order, held in pieces that are never joined: how an append body that arrived
//! in several reads is validated and framed into a chunk with no copy to join it.

use std::borrow::Cow;

use s3::Bytes;

/// Bytes in order, in one or more pieces: the records of an append body
/// (`framing::FramedBody`). Reading a run of them borrows it where it lies in one piece,
/// and copies only what spans two.
#[derive(Clone, Copy, Debug)]
pub struct Pieces<'a> {
    first: &'a [u8],
    rest: &'a [Bytes],
    len: usize,
}

impl<'a> Pieces<'a> {
    pub(crate) fn over(pieces: &'a [Bytes]) -> Self {
        match pieces.split_first() {
            Some((first, rest)) => Self::new(first, rest),
            None => Self::from(&[][..]),
        }
    }

    pub(crate) fn new(first: &'a [u8], rest: &'a [Bytes]) -> Self {
        Self { first, rest, len: first.len() + rest.iter().map(Bytes::len).sum::<usize>() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each piece in order (the first may be empty).
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let rest = self.rest;
        std::iter::once(self.first).chain(rest.iter().map(|piece| &piece[..]))
    }

    /// The next `n` bytes, or `None` if fewer are left.
    pub fn take(&mut self, n: usize) -> Option<Cow<'a, [u8]>> {
        if n > self.len {
            return None;
        }
        while self.first.is_empty()
            && let Some((next, rest)) = self.rest.split_first()
        {
            (self.first, self.rest) = (&next[..], rest);
        }
        self.len -= n;
        if let Some((run, tail)) = self.first.split_at_checked(n) {
            self.first = tail;
            return Some(Cow::Borrowed(run));
        }
        let mut run = Vec::with_capacity(n);
        while run.len() < n {
            if self.first.is_empty() {
                let (next, rest) = self.rest.split_first().expect("n was at most the length");
                (self.first, self.rest) = (&next[..], rest);
            }
            let (part, tail) = self.first.split_at(self.first.len().min(n - run.len()));
            run.extend_from_slice(part);
            self.first = tail;
        }
        Some(Cow::Owned(run))
    }
}

impl<'a> From<&'a [u8]> for Pieces<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        Self { first: bytes, rest: &[], len: bytes.len() }
    }
}

/// Pieces are equal when their bytes are, however they are cut.
impl PartialEq for Pieces<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().flatten().eq(other.iter().flatten())
    }
}

impl Eq for Pieces<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However the bytes are cut into pieces and read in runs, the runs are the bytes,
        /// and a run within one piece is borrowed.
        #[test]
        fn runs_read_across_pieces_are_the_bytes(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            cuts in prop::collection::vec(0usize..300, 0..6),
            runs in prop::collection::vec(0usize..80, 0..12),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let whole = Bytes::from(bytes.clone());
            let mut pieces = Vec::new();
            let mut spans = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                pieces.push(whole.slice(at..cut));
                spans.push(at..cut);
                at = cut;
            }
            let mut reader = Pieces::over(&pieces);
            prop_assert_eq!(reader.len(), bytes.len());
            prop_assert!(reader == Pieces::from(&bytes[..]), "equal however cut");
            let mut read = Vec::new();
            for run in runs {
                let start = read.len();
                match reader.take(run) {
                    Some(got) => {
                        prop_assert_eq!(got.len(), run);
                        let in_one = spans.iter().any(|s| s.start <= start && start + run <= s.end);
                        match &got {
                            Cow::Borrowed(b) if run > 0 => {
                                prop_assert_eq!(b.as_ptr(), whole[start..].as_ptr(), "in place");
                            }
                            Cow::Borrowed(_) => {}
                            Cow::Owned(_) => prop_assert!(!in_one, "copied only across pieces"),
                        }
                        read.extend_from_slice(&got);
                        prop_assert_eq!(reader.len(), bytes.len() - read.len());
                    }
                    None => prop_assert!(run > bytes.len() - start, "refused only past the end"),
                }
            }
            prop_assert_eq!(&read[..], &bytes[..read.len()]);
        }
    }
}

//! Verification: the producer's ledger of what was acknowledged where, and the checker
//! that reads a stream back and says what is lost, duplicated, out of place or foreign.
//!
//! Both sides compute a hash chain (payload.rs) in seq_num order: the producer over the
//! records the server acknowledged, the checker over every record it reads. The detailed
//! counts say what went wrong; the chain is the summary that nothing else did.

use std::collections::BTreeMap;

use crate::payload::{self, Payload};

/// Acknowledged records of one batch: seq_nums `seq_num..seq_num+count` hold the
/// stream's records `index..index+count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    pub seq_num: u64,
    pub index: u64,
    pub count: u64,
}

/// What the producer knows about one stream.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Records sent: indices `0..sent`.
    pub sent: u64,
    acked: Vec<Acked>,
    /// Each acknowledged batch's records' digests, by the batch's seq_num: the chain is
    /// computed over them at the end, and each record read back is checked against its
    /// own (so a body that differs is named even when the chain cannot be compared).
    digests: BTreeMap<u64, Vec<u64>>,
}

/// The end of a ledger: the chain over every acknowledged record in seq_num order
/// (across any gap a failed append left), the acknowledged batches sorted by seq_num,
/// and their records' digests by batch seq_num.
type Finished = (u64, Vec<Acked>, BTreeMap<u64, Vec<u64>>);

impl Ledger {
    /// An acknowledged batch, with its records' digests (empty when not verifying).
    pub fn acked(&mut self, seq_num: u64, index: u64, digests: Vec<u64>) {
        self.acked.push(Acked { seq_num, index, count: digests.len() as u64 });
        self.digests.insert(seq_num, digests);
    }

    pub fn finish(mut self) -> Finished {
        let mut chain = 0;
        for (seq_num, digests) in &self.digests {
            for (i, d) in digests.iter().enumerate() {
                chain = payload::chain(chain, seq_num + i as u64, *d);
            }
        }
        self.acked.sort_by_key(|a| a.seq_num);
        (chain, self.acked, self.digests)
    }
}

/// How one stream read back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub records_read: u64,
    pub ok: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub foreign: u64,
    /// Records at their acknowledged place whose bytes differ from what was sent.
    pub corrupt: u64,
    /// Records of failed appends that landed after all (not an error by itself).
    pub unacknowledged_present: u64,
    pub chain_matches: bool,
    /// The first few problems, with seq_nums.
    pub examples: Vec<String>,
    /// Why the read-back stopped before the stream's tail, if it did: only what it read
    /// is judged (records acknowledged below where it got and not found are lost; the
    /// chain is not compared).
    pub incomplete: Option<String>,
}

impl Verdict {
    /// Read to the tail and nothing wrong: verified.
    pub fn clean(&self) -> bool {
        self.incomplete.is_none() && !self.failed()
    }

    /// Something wrong found: lost, duplicated, out of place, foreign or corrupt records,
    /// or (read to the tail, every append answered) a chain that differs. An incomplete
    /// read-back that found nothing wrong in what it read has not failed: it has not
    /// verified.
    pub fn failed(&self) -> bool {
        self.lost > 0
            || self.duplicates > 0
            || self.reordered > 0
            || self.foreign > 0
            || self.corrupt > 0
            || (self.incomplete.is_none()
                && !self.chain_matches
                && self.unacknowledged_present == 0)
    }
}

const EXAMPLES_MAX: usize = 5;

/// Checks one stream's records, fed in seq_num order.
pub struct Checker {
    stream: u32,
    sent: u64,
    by_seq: Vec<Acked>,
    by_index: Vec<Acked>,
    at: usize,
    seen: Vec<u64>,
    expected_chain: u64,
    digests: BTreeMap<u64, Vec<u64>>,
    chain: u64,
    verdict: Verdict,
}

impl Checker {
    pub fn new(stream: u32, ledger: Ledger) -> Self {
        let sent = ledger.sent;
        let (expected_chain, by_seq, digests) = ledger.finish();
        let mut by_index = by_seq.clone();
        by_index.sort_by_key(|a| a.index);
        Self {
            stream,
            sent,
            by_seq,
            by_index,
            at: 0,
            seen: vec![0; sent.div_ceil(64) as usize],
            expected_chain,
            digests,
            chain: 0,
            verdict: Verdict::default(),
        }
    }

    fn example(&mut self, text: String) {
        if self.verdict.examples.len() < EXAMPLES_MAX {
            self.verdict.examples.push(text);
        }
    }

    /// The index acknowledged at `seq_num`, and the digest of what was sent there, if
    /// any.
    fn expected_at(&mut self, seq_num: u64) -> Option<(u64, Option<u64>)> {
        while let Some(a) = self.by_seq.get(self.at) {
            if seq_num >= a.seq_num + a.count {
                self.at += 1;
                continue;
            }
            let offset = seq_num.checked_sub(a.seq_num)?;
            let digest = self.digests.get(&a.seq_num).and_then(|d| d.get(offset as usize));
            return Some((a.index + offset, digest.copied()));
        }
        None
    }

    /// Where `index` was acknowledged, if it was.
    fn acked_seq(&self, index: u64) -> Option<u64> {
        let i = self.by_index.partition_point(|a| a.index + a.count <= index);
        self.by_index.get(i).filter(|a| index >= a.index).map(|a| a.seq_num + (index - a.index))
    }

    pub fn record(&mut self, seq_num: u64, body: &[u8]) {
        self.verdict.records_read += 1;
        let digest = payload::digest(body);
        self.chain = payload::chain(self.chain, seq_num, digest);
        let ours = Payload::parse(body).filter(|p| p.stream == self.stream && p.index < self.sent);
        let expected = self.expected_at(seq_num);
        let Some(p) = ours else {
            self.verdict.foreign += 1;
            self.example(format!("seq_num {seq_num}: a record loadgen did not write"));
            return;
        };
        let (word, bit) = ((p.index / 64) as usize, 1u64 << (p.index % 64));
        if self.seen[word] & bit != 0 {
            self.verdict.duplicates += 1;
            self.example(format!("seq_num {seq_num}: record {} again", p.index));
            return;
        }
        self.seen[word] |= bit;
        if let Some((index, sent)) = expected
            && index == p.index
        {
            if sent.is_some_and(|sent| sent != digest) {
                self.verdict.corrupt += 1;
                self.example(format!("seq_num {seq_num}: record {index} is not what was sent"));
            } else {
                self.verdict.ok += 1;
            }
        } else if let Some(acked_at) = self.acked_seq(p.index) {
            self.verdict.reordered += 1;
            self.example(format!(
                "seq_num {seq_num}: record {} was acknowledged at seq_num {acked_at}",
                p.index
            ));
        } else {
            self.verdict.unacknowledged_present += 1;
        }
    }

    /// The verdict of a read-back that reached the tail: every acknowledged record not
    /// read is lost.
    pub fn finish(self) -> Verdict {
        self.judge(u64::MAX, None)
    }

    /// The verdict of a read-back that stopped at `read_to` (every record below it read)
    /// for `why`: acknowledged records below it that were not read are lost; those above
    /// it, and the chain, are not judged.
    pub fn finish_incomplete(self, read_to: u64, why: String) -> Verdict {
        self.judge(read_to, Some(why))
    }

    fn judge(mut self, read_to: u64, incomplete: Option<String>) -> Verdict {
        let mut lost_examples = Vec::new();
        for a in &self.by_seq {
            for i in 0..a.count.min(read_to.saturating_sub(a.seq_num)) {
                let index = a.index + i;
                if self.seen[(index / 64) as usize] & (1u64 << (index % 64)) == 0 {
                    self.verdict.lost += 1;
                    if lost_examples.len() < EXAMPLES_MAX {
                        lost_examples.push(format!(
                            "record {index}, acknowledged at seq_num {}, is missing",
                            a.seq_num + i
                        ));
                    }
                }
            }
        }
        for e in lost_examples {
            self.example(e);
        }
        self.verdict.chain_matches = self.chain == self.expected_chain;
        if incomplete.is_none() && !self.verdict.chain_matches && self.verdict.examples.is_empty() {
            self.example("the hash chain differs".into());
        }
        self.verdict.incomplete = incomplete;
        self.verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(stream: u32, index: u64) -> Vec<u8> {
        let mut out = Vec::new();
        Payload { stream, index, sent_unix_ns: 0 }.write(40, &payload::filler(40), &mut out);
        out
    }

    /// A ledger of `batches` batches of 2 records from seq_num 0, and the bodies by index.
    fn ledger(batches: u64) -> (Ledger, Vec<Vec<u8>>) {
        let mut ledger = Ledger { sent: batches * 2, ..Ledger::default() };
        let bodies: Vec<Vec<u8>> = (0..batches * 2).map(|i| body(3, i)).collect();
        for b in 0..batches {
            let i = (b * 2) as usize;
            ledger.acked(
                b * 2,
                b * 2,
                vec![payload::digest(&bodies[i]), payload::digest(&bodies[i + 1])],
            );
        }
        (ledger, bodies)
    }

    fn check(ledger: Ledger, read: &[(u64, Vec<u8>)]) -> Verdict {
        let mut c = Checker::new(3, ledger);
        for (seq, body) in read {
            c.record(*seq, body);
        }
        c.finish()
    }

    #[test]
    fn a_faithful_stream_is_clean() {
        let (ledger, bodies) = ledger(3);
        let read: Vec<_> = bodies.into_iter().enumerate().map(|(i, b)| (i as u64, b)).collect();
        let v = check(ledger, &read);
        assert!(v.clean(), "{v:?}");
        assert_eq!(v.ok, 6);
    }

    #[test]
    fn loss_duplicate_reorder_and_foreign_are_each_named() {
        let (l, bodies) = ledger(2);
        let lost =
            check(l, &[(0, bodies[0].clone()), (1, bodies[1].clone()), (2, bodies[2].clone())]);
        assert_eq!((lost.lost, lost.clean()), (1, false));

        let (l, bodies) = ledger(1);
        let dup =
            check(l, &[(0, bodies[0].clone()), (1, bodies[1].clone()), (2, bodies[1].clone())]);
        assert_eq!((dup.duplicates, dup.clean()), (1, false));

        let (l, bodies) = ledger(1);
        let swapped = check(l, &[(0, bodies[1].clone()), (1, bodies[0].clone())]);
        assert_eq!((swapped.reordered, swapped.clean()), (2, false));

        let (l, bodies) = ledger(1);
        let extra = check(l, &[(0, bodies[0].clone()), (1, bodies[1].clone()), (2, b"x".to_vec())]);
        assert_eq!((extra.foreign, extra.clean()), (1, false));
        assert!(extra.examples[0].contains("seq_num 2"), "{:?}", extra.examples);
    }

    /// A record at its acknowledged place whose body differs is named, also when records
    /// of failed appends are present (the chain then cannot be compared).
    #[test]
    fn a_body_that_differs_is_named_even_where_the_chain_cannot_say() {
        let (l, bodies) = ledger(1);
        let mut altered = bodies[1].clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        // Record 2 was sent (index within `sent`) but never acknowledged: present anyway.
        let l = Ledger { sent: 3, ..l };
        let v = check(l, &[(0, bodies[0].clone()), (1, altered), (2, body(3, 2))]);
        assert_eq!((v.ok, v.corrupt, v.unacknowledged_present), (1, 1, 1), "{v:?}");
        assert!(!v.clean());
        assert!(v.examples[0].contains("seq_num 1: record 1 is not what was sent"), "{v:?}");
    }

    /// A read-back cut short judges what it read: records acknowledged below where it got
    /// and not found are lost, the rest is not called lost, and the result is not clean
    /// without having failed.
    #[test]
    fn an_incomplete_read_back_judges_only_what_it_read() {
        let (l, bodies) = ledger(3);
        let read: Vec<_> = bodies.iter().take(3).cloned().enumerate().collect();
        let mut c = Checker::new(3, l);
        for (seq, body) in &read {
            c.record(*seq as u64, body);
        }
        let v = c.finish_incomplete(3, "the server went away".into());
        assert_eq!((v.ok, v.lost), (3, 0), "{v:?}");
        assert!(!v.failed() && !v.clean(), "{v:?}");

        // Record 1 missing below where the read got: lost, incomplete or not.
        let (l, bodies) = ledger(3);
        let mut c = Checker::new(3, l);
        c.record(0, &bodies[0]);
        c.record(2, &bodies[2]);
        let v = c.finish_incomplete(3, "the server went away".into());
        assert_eq!((v.ok, v.lost), (2, 1), "{v:?}");
        assert!(v.failed(), "{v:?}");
    }

    #[test]
    fn out_of_order_acks_chain_the_same() {
        let (a, bodies) = ledger(2);
        let mut b = Ledger { sent: 4, ..Ledger::default() };
        let d = |i: usize| payload::digest(&bodies[i]);
        b.acked(2, 2, vec![d(2), d(3)]);
        b.acked(0, 0, vec![d(0), d(1)]);
        assert_eq!(a.finish(), b.finish());
    }
}

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::Code;
use crate::aligned::AlignedBuf;
use crate::batch;
use crate::framing::{AppendBuilder, AppendConditions, AppendFrame};
use crate::limits::Limits;
use crate::options::TimestampingMode;

const ID: StreamId = StreamId([9; 16]);
/// Small chunks so tests cross chunk boundaries often (an express stream's sizes).
const CHUNK_TARGET: ChunkSizes = ChunkSizes { start: 4096, max: 4096 };
/// Chunks that start at what their first batch needs and grow (a standard stream's).
const GROWING: ChunkSizes = ChunkSizes { start: 0, max: 16 << 10 };

/// A leader plus the "storage" its durable chunks go to (location = first seq_num).
struct Harness {
    leader: Leader<AlignedBuf, u64>,
    sizes: ChunkSizes,
    stored: HashMap<u64, Rc<dyn ChunkSource>>,
    budget_left: u64,
    now_ms: u64,
}

struct Batch {
    body: Vec<u8>,
    frame_bytes: Vec<u8>,
}

fn framed(bodies: &[&[u8]]) -> Batch {
    let mut builder = AppendBuilder::new();
    for body in bodies {
        builder.push::<&[u8], &[u8]>(&[], body).expect("fits");
    }
    Batch { body: Vec::new(), frame_bytes: builder.finish(&AppendConditions::default()) }
}

impl Harness {
    fn new(options: StreamOptions) -> Self {
        Self::with_chunks(options, Vec::new(), String::new())
    }

    fn with_chunks(options: StreamOptions, chunks: Vec<DurableChunk<u64>>, token: String) -> Self {
        let leader = Leader::new(LeaderInit {
            id: ID,
            options,
            fencing_token: token,
            trim_seq_num: 0,
            trim_timestamp: 0,
            chunks,
            now_ms: 1_000,
        });
        let stored = HashMap::new();
        Self { leader, sizes: CHUNK_TARGET, stored, budget_left: u64::MAX, now_ms: 1_000 }
    }

    fn append_with(
        &mut self,
        bodies: &[&[u8]],
        offered: &[Option<i64>],
        match_seq_num: Option<u64>,
        fencing_token: Option<&str>,
    ) -> Result<Sequenced> {
        let batch = framed(bodies);
        let frame = AppendFrame::decode(&batch.frame_bytes).expect("valid");
        let summary = batch::validate(frame.lengths, frame.data, &Limits::default())?;
        let offered: Offered = if offered.is_empty() {
            std::iter::repeat_n(None, bodies.len()).collect()
        } else {
            offered.iter().copied().collect()
        };
        let input = AppendInput {
            lengths: frame.lengths,
            data: frame.data,
            summary,
            offered,
            match_seq_num,
            fencing_token,
        };
        let budget = &mut self.budget_left;
        let _ = &batch.body;
        self.leader.append(
            &input,
            self.now_ms,
            self.sizes,
            &mut |bytes| {
                if bytes > *budget {
                    return Err(Error::MemoryBudgetExhausted {
                        budget_bytes: 0,
                        retry_after_ms: 10,
                    });
                }
                *budget -= bytes;
                Ok(())
            },
            &mut AlignedBuf::with_capacity,
        )
    }

    fn append(&mut self, bodies: &[&[u8]]) -> Sequenced {
        self.append_with(bodies, &[], None, None).expect("append accepted")
    }

    /// Makes everything sequenced durable, in order, as the shard would.
    fn flush(&mut self) {
        for chunk in self.leader.take_sealed(|_| 0) {
            let header = *chunk.header();
            let source: Rc<dyn ChunkSource> = Rc::new(chunk);
            self.stored.insert(header.first_seq_num, Rc::clone(&source));
            self.leader.on_durable(DurableChunk::new(&header, header.first_seq_num, Some(source)));
        }
    }

    fn locate(&mut self, start: ReadStart, clamp: bool) -> Result<u64> {
        loop {
            match self.leader.locate(start, clamp)? {
                Step::Ready(seq) => return Ok(seq),
                Step::Load { first_seq_num, location } => self.load(first_seq_num, location),
            }
        }
    }

    fn load(&mut self, first_seq_num: u64, location: u64) {
        let chunk = Rc::clone(&self.stored[&location]);
        assert!(self.leader.install_loaded(first_seq_num, chunk) > 0);
    }

    /// Reads one page: (seq_num, timestamp, body) of each record, and the next seq.
    fn page(&mut self, from: u64, limits: PageLimits) -> (Vec<(u64, u64, Vec<u8>)>, Page) {
        self.page_loading(from, limits, usize::MAX)
    }

    /// [`Harness::page`], loading at most `loads_max` chunks for it, as the shard does.
    fn page_loading(
        &mut self,
        from: u64,
        limits: PageLimits,
        loads_max: usize,
    ) -> (Vec<(u64, u64, Vec<u8>)>, Page) {
        let mut loads = 0;
        loop {
            match self.leader.page(from, limits, loads < loads_max) {
                Step::Ready(page) => {
                    let records = page
                        .parts
                        .iter()
                        .flat_map(|part| {
                            let records = part.records();
                            records
                                .iter()
                                .map(|(seq, ts, stored)| {
                                    (
                                        seq,
                                        ts,
                                        record::decode(stored).expect("valid").body().to_vec(),
                                    )
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect();
                    return (records, page);
                }
                Step::Load { first_seq_num, location } => {
                    loads += 1;
                    self.load(first_seq_num, location);
                }
            }
        }
    }
}

const ALL: PageLimits = PageLimits { records: u64::MAX, bytes: u64::MAX, until: None };

fn bodies(range: Range<u64>) -> Vec<Vec<u8>> {
    range.map(|i| format!("record-{i}").into_bytes()).collect()
}

#[test]
fn batches_take_unbroken_ranges_and_are_invisible_until_durable() {
    let mut h = Harness::new(StreamOptions::default());
    let first = h.append(&[b"a", b"b"]);
    let second = h.append(&[b"c"]);
    assert_eq!((first.start.seq_num, first.end.seq_num), (0, 2));
    assert_eq!((second.start.seq_num, second.end.seq_num), (2, 3));
    assert_eq!(h.leader.next_seq_num(), 3);
    assert_eq!(h.leader.tail(), Tail::default(), "nothing is visible before it is durable");
    assert_eq!(h.page(0, ALL).0, vec![]);
    h.flush();
    assert_eq!(h.leader.tail(), Tail { seq_num: 3, timestamp: 1_000 });
    let (records, page) = h.page(0, ALL);
    assert_eq!(records.iter().map(|r| r.2.clone()).collect::<Vec<_>>(), [b"a", b"b", b"c"]);
    assert_eq!(page.next_seq_num, 3);
    assert!(h.leader.is_settled());
}

#[test]
fn one_stamp_per_batch_capped_and_never_decreasing() {
    let mut h = Harness::new(StreamOptions::default());
    // Offered stamps: the largest wins, capped at arrival (1000).
    let a = h.append_with(&[b"x", b"y"], &[Some(10), Some(20)], None, None).expect("ok");
    assert_eq!(a.start.timestamp, 20);
    let b = h.append_with(&[b"z"], &[Some(5_000)], None, None).expect("ok");
    assert_eq!(b.start.timestamp, 1_000, "capped at arrival");
    let c = h.append_with(&[b"w"], &[Some(3)], None, None).expect("ok");
    assert_eq!(c.start.timestamp, 1_000, "raised to the previous stamp");
    h.flush();
    let (records, _) = h.page(0, ALL);
    assert_eq!(records.iter().map(|r| r.1).collect::<Vec<_>>(), [20, 20, 1_000, 1_000]);
}

#[test]
fn timestamping_rules_refuse_whole_batches() {
    let options =
        StreamOptions { timestamping_mode: TimestampingMode::ClientRequire, ..Default::default() };
    let mut h = Harness::new(options);
    let err = h.append_with(&[b"a", b"b"], &[Some(1), None], None, None).expect_err("missing");
    assert_eq!(err, Error::TimestampRequired { index: 1 });
    assert_eq!(h.leader.next_seq_num(), 0, "a refused batch leaves no trace");
    let mut h =
        Harness::new(StreamOptions { timestamping_mode: TimestampingMode::Arrival, ..options });
    assert_eq!(
        h.append_with(&[b"a"], &[Some(1)], None, None),
        Err(Error::TimestampNotAllowed { index: 0 })
    );
}

#[test]
fn match_seq_num_counts_batches_not_yet_durable() {
    let mut h = Harness::new(StreamOptions::default());
    h.append(&[b"a", b"b"]);
    assert_eq!(
        h.append_with(&[b"c"], &[], Some(0), None),
        Err(Error::SeqNumMismatch { match_seq_num: 0, next_seq_num: 2 })
    );
    let ok = h.append_with(&[b"c"], &[], Some(2), None).expect("matches the in-flight count");
    assert_eq!(ok.start.seq_num, 2);
    // A retry of the same conditional append is refused: exactly once.
    assert_eq!(
        h.append_with(&[b"c"], &[], Some(2), None).map_err(|e| e.code()),
        Err(Code::FailedPrecondition)
    );
}

#[test]
fn fencing_tokens_and_producer_policy() {
    let mut h = Harness::new(StreamOptions::default());
    // An explicit empty token matches a stream whose token was never set.
    h.append_with(&[b"a"], &[], None, Some("")).expect("empty matches unset");
    h.leader.check_fence(Some("")).expect("expected matches");
    h.leader.set_fencing_token("w1".into());
    assert_eq!(
        h.append_with(&[b"b"], &[], None, Some("old")),
        Err(Error::FencingTokenMismatch { field: "fencing_token", current: "w1".into() })
    );
    h.append_with(&[b"b"], &[], None, Some("w1")).expect("current token");
    h.append_with(&[b"c"], &[], None, None).expect("policy any accepts no token");
    assert_eq!(
        h.leader.check_fence(Some("w0")),
        Err(Error::FencingTokenMismatch { field: "expected", current: "w1".into() })
    );

    let options = StreamOptions { producer_policy: ProducerPolicy::Fenced, ..Default::default() };
    let mut h = Harness::with_chunks(options, Vec::new(), "w2".into());
    assert_eq!(
        h.append_with(&[b"a"], &[], None, None),
        Err(Error::FencingTokenMissing { current: "w2".into() })
    );
    h.append_with(&[b"a"], &[], None, Some("w2")).expect("holder of the token");
}

#[test]
fn checks_run_in_the_documented_order() {
    let options = StreamOptions { throughput_max_bytes_per_second: 1, ..Default::default() };
    let mut h = Harness::with_chunks(options, Vec::new(), "t".into());
    h.append_with(&[b"a"], &[], None, None).expect("full bucket passes one batch");
    // Wrong token and wrong match and over the throughput cap: fencing wins.
    let err = h.append_with(&[b"b"], &[], Some(9), Some("x")).expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.fencing_token().is_some());
    // Right token, wrong match, over the cap: match wins.
    let err = h.append_with(&[b"b"], &[], Some(9), Some("t")).expect_err("refused");
    assert_eq!(err.next_seq_num(), Some(1));
    // Only over the cap: throughput.
    let err = h.append_with(&[b"b"], &[], Some(1), Some("t")).expect_err("refused");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.retry_after_ms().is_some());
    assert_eq!(h.leader.next_seq_num(), 1, "refusals leave no trace");
}

#[test]
fn memory_budget_refusal_leaves_no_trace() {
    let mut h = Harness::new(StreamOptions::default());
    // A record's stored bytes and its directory entry (12 bytes) count.
    h.budget_left = 16;
    assert_eq!(
        h.append_with(&[b"1234"], &[], None, None).map_err(|e| e.code()),
        Err(Code::ResourceExhausted)
    );
    assert_eq!(h.leader.next_seq_num(), 0);
    h.append_with(&[b"123"], &[], None, None).expect("1 + 3 + 12 bytes fit the budget");
}

#[test]
fn batches_larger_than_a_chunk_start_new_chunks_and_stay_in_order() {
    let mut h = Harness::new(StreamOptions::default());
    let big = vec![7u8; 3000];
    for _ in 0..5 {
        h.append(&[&big, b"s"]);
    }
    let sealed = h.leader.take_sealed(|_| 0);
    assert!(sealed.len() >= 3, "a 4 KiB target holds one big batch per chunk");
    let mut expected = 0;
    for chunk in sealed {
        let header = *chunk.header();
        assert_eq!(header.first_seq_num, expected);
        expected += u64::from(header.record_count);
        let source: Rc<dyn ChunkSource> = Rc::new(chunk);
        h.stored.insert(header.first_seq_num, Rc::clone(&source));
        h.leader.on_durable(DurableChunk::new(&header, header.first_seq_num, Some(source)));
    }
    assert_eq!(h.leader.tail().seq_num, 10);
    assert_eq!(h.page(0, ALL).0.len(), 10);
}

/// A stream whose class changed has chunks on two paths to durability (the journal, a
/// bundle) that do not keep each other's order: one on the new path waits, sealed,
/// until those in flight on the old are durable.
#[test]
fn chunks_go_out_on_one_path_at_a_time() {
    let mut h = Harness::new(StreamOptions::default());
    let make_durable = |h: &mut Harness, chunk: SealedChunk<AlignedBuf>| {
        let header = *chunk.header();
        h.leader.on_durable(DurableChunk::new(&header, header.first_seq_num, None));
    };
    h.append(&[b"old"]);
    let old = h.leader.take_sealed(|_| 1);
    assert_eq!(old.len(), 1);
    h.append(&[b"new"]);
    assert!(h.leader.take_sealed(|_| 0).is_empty(), "held back while the old path has one");
    assert!(h.leader.has_unflushed() && h.leader.has_in_flight());
    // Held back unsealed: the open chunk goes on filling.
    h.append(&[b"more"]);
    assert!(h.leader.take_sealed(|_| 0).is_empty());
    old.into_iter().for_each(|chunk| make_durable(&mut h, chunk));
    let new = h.leader.take_sealed(|_| 0);
    let taken: Vec<(u64, u32)> =
        new.iter().map(|c| (c.header().first_seq_num, c.header().record_count)).collect();
    assert_eq!(taken, [(1, 2)], "in order, once the old path is done");
    assert!(!h.leader.has_unflushed());
    new.into_iter().for_each(|chunk| make_durable(&mut h, chunk));
    assert_eq!(h.leader.tail().seq_num, 3);
    // On one path, any number go out at once.
    h.append(&[b"a"]);
    assert_eq!(h.leader.take_sealed(|_| 0).len(), 1);
    h.append(&[b"b"]);
    assert_eq!(h.leader.take_sealed(|_| 0).len(), 1);
}

#[test]
fn a_growing_chunk_holds_about_what_it_needs_and_seals_at_its_max() {
    let mut h = Harness::new(StreamOptions::default());
    h.sizes = GROWING;
    h.append(&[b"a"]);
    let capacity = |h: &Harness| h.leader.open.as_ref().map(ChunkBuilder::capacity);
    assert_eq!(capacity(&h), Some(4096), "one small record: one page, not the max");
    let body = [5u8; 1000];
    for n in 1..=14 {
        h.append(&[&body]);
        let needed = ChunkBuilder::<AlignedBuf>::capacity_for(n + 1, 2 + 1001 * n);
        let capacity = capacity(&h).expect("open");
        assert!(
            capacity >= needed && capacity <= (2 * needed).max(4096),
            "{capacity} for {needed}"
        );
    }
    assert!(h.leader.sealed.is_empty(), "15 records fit 16 KiB: nothing sealed yet");
    h.append(&[&body, &body, &body]);
    assert_eq!(h.leader.sealed.len(), 1, "a batch past the max seals the chunk before it");
    assert_eq!(h.leader.sealed[0].header().record_count, 15);
    assert_eq!(capacity(&h), Some(4096), "the next chunk starts small again");
}

/// A class change seals the open chunk: a batch under the new class never grows it into
/// a buffer of the other class's path.
#[test]
fn a_class_change_seals_the_open_chunk() {
    let mut h = Harness::new(StreamOptions::default());
    h.sizes = GROWING;
    h.append(&[b"a"]);
    let express =
        StreamOptions { class: crate::options::StorageClass::Express, ..StreamOptions::default() };
    h.leader.set_options(express, h.now_ms);
    assert!(h.leader.open.is_none() && h.leader.sealed.len() == 1, "sealed as it was built");
    h.leader.set_options(express, h.now_ms);
    assert_eq!(h.leader.sealed.len(), 1, "the same class seals nothing");
    h.append(&[b"b"]);
    assert_eq!(h.leader.open.as_ref().map(ChunkBuilder::len), Some(1), "a chunk of its own");
}

#[test]
#[should_panic(expected = "sequence order")]
fn durability_out_of_order_is_a_bug() {
    let mut h = Harness::new(StreamOptions::default());
    h.append(&[&[1u8; 3000]]);
    h.append(&[&[2u8; 3000]]);
    let mut sealed = h.leader.take_sealed(|_| 0);
    let second = sealed.pop().expect("two chunks");
    let header = *second.header();
    h.leader.on_durable(DurableChunk::new(&header, 1, None));
}

#[test]
fn locating_starts() {
    let mut h = Harness::new(StreamOptions::default());
    for (i, body) in bodies(0..6).iter().enumerate() {
        h.now_ms = 1_000 + 10 * i as u64;
        h.append(&[body]);
        if i % 2 == 1 {
            h.flush(); // several chunks
        }
    }
    assert_eq!(h.locate(ReadStart::SeqNum(0), false), Ok(0));
    assert_eq!(h.locate(ReadStart::SeqNum(6), false), Ok(6), "exactly the tail is an empty page");
    let past = h.locate(ReadStart::SeqNum(7), false).expect_err("past the tail");
    assert_eq!(past.tail(), Some(Tail { seq_num: 6, timestamp: 1_050 }));
    assert_eq!(past.code(), Code::OutOfRange);
    assert_eq!(h.locate(ReadStart::SeqNum(7), true), Ok(6), "clamp starts at the tail");
    assert_eq!(h.locate(ReadStart::TailOffset(2), false), Ok(4));
    assert_eq!(h.locate(ReadStart::TailOffset(100), false), Ok(0));
    assert_eq!(h.locate(ReadStart::Timestamp(0), false), Ok(0));
    assert_eq!(h.locate(ReadStart::Timestamp(1_020), false), Ok(2));
    assert_eq!(h.locate(ReadStart::Timestamp(1_021), false), Ok(3));
    assert_eq!(
        h.locate(ReadStart::Timestamp(9_999), false),
        Ok(6),
        "after the last stamp: the tail"
    );
    // Below the watermark: the first retained record.
    h.leader.set_trim(h.leader.trim_target(3));
    assert_eq!(h.locate(ReadStart::SeqNum(1), false), Ok(3));
    assert_eq!(h.locate(ReadStart::Timestamp(0), false), Ok(3));
    assert_eq!(h.locate(ReadStart::TailOffset(100), false), Ok(3));
}

#[test]
fn page_bounds() {
    let mut h = Harness::new(StreamOptions::default());
    for (i, body) in bodies(0..10).iter().enumerate() {
        h.now_ms = 1_000 + i as u64;
        h.append(&[body]);
    }
    h.flush();
    let (records, page) = h.page(2, PageLimits { records: 3, ..ALL });
    assert_eq!(records.iter().map(|r| r.0).collect::<Vec<_>>(), [2, 3, 4]);
    assert_eq!(page.next_seq_num, 5);
    // "record-N" is 8 content bytes: a budget of 20 holds two.
    let (records, page) = h.page(0, PageLimits { bytes: 20, ..ALL });
    assert_eq!(records.len(), 2);
    assert_eq!(page.content_bytes, 16);
    // A budget met exactly still takes the record that meets it.
    let (records, _) = h.page(0, PageLimits { bytes: 16, ..ALL });
    assert_eq!(records.len(), 2);
    // The first record is returned even when it alone is over the budget.
    let (records, _) = h.page(0, PageLimits { bytes: 1, ..ALL });
    assert_eq!(records.len(), 1);
    let (records, page) = h.page(0, PageLimits { until: Some(1_004), ..ALL });
    assert_eq!(records.len(), 4);
    assert!(page.reached_until);
    let (records, page) = h.page(10, ALL);
    assert!(records.is_empty());
    assert_eq!((page.next_seq_num, page.tail.seq_num), (10, 10));
}

#[test]
fn trim_moves_forward_only_and_never_past_the_tail() {
    let mut h = Harness::new(StreamOptions::default());
    h.append(&[b"a", b"b", b"c"]);
    assert_eq!(h.leader.trim_target(2), 0, "nothing is durable yet: the tail is 0");
    h.flush();
    assert_eq!(h.leader.trim_target(100), 3, "clamped to the tail");
    h.leader.set_trim(2);
    assert_eq!(h.leader.trim_target(1), 2, "never backward");
    assert_eq!(h.page(0, ALL).0.iter().map(|r| r.0).collect::<Vec<_>>(), [2]);
}

#[test]
fn evicted_chunks_are_loaded_back() {
    let mut h = Harness::new(StreamOptions::default());
    for body in bodies(0..4) {
        h.append(&[&body]);
        h.flush();
    }
    // Four records of 1 + 8 stored bytes, and a directory entry each.
    assert_eq!(h.leader.cached_bytes(), 4 * (9 + 12));
    let freed: u64 = (0..4).filter_map(|seq| h.leader.evict(seq)).sum();
    assert_eq!(freed, 4 * (9 + 12));
    assert_eq!(h.leader.evict(0), None, "already evicted");
    assert_eq!(h.leader.cached_bytes(), 0);
    // Two loads per page: each page is two stored chunks here, and ends at the next one
    // not in memory (a page with no records yet loads one whatever the bound).
    for loads_max in [2, 0] {
        let mut from = 0;
        let mut pages = Vec::new();
        while from < 4 {
            let (records, page) = h.page_loading(from, ALL, loads_max);
            pages.push(records.into_iter().map(|r| r.0).collect::<Vec<_>>());
            from = page.next_seq_num;
        }
        if loads_max == 2 {
            assert_eq!(pages, [vec![0, 1], vec![2, 3]]);
            (0..4).for_each(|seq| _ = h.leader.evict(seq));
        } else {
            assert_eq!(pages, [vec![0], vec![1], vec![2], vec![3]]);
        }
    }
    // Once loaded, one page covers them all, loading nothing.
    assert_eq!(h.page_loading(0, ALL, 0).0.len(), 4);
}

#[test]
fn a_moved_chunk_is_found_where_it_went() {
    let mut h = Harness::new(StreamOptions::default());
    for body in bodies(0..2) {
        h.append(&[&body]);
        h.flush();
    }
    let first = *h.leader.location_of(0).expect("held");
    assert_eq!(h.leader.location_of(1), Some(&(first + 1)), "each chunk its own location");
    assert_eq!(h.leader.location_of(2), None, "none past the tail");
    assert!(h.leader.relocate(0, 1000, None), "cached");
    assert_eq!(h.leader.location_of(0), Some(&1000));
    h.leader.set_trim(1);
    assert_eq!(h.leader.location_of(0), None, "trimmed away");
}

#[test]
fn recovery_continues_exactly_where_the_chunks_end() {
    let mut h = Harness::new(StreamOptions::default());
    h.append(&[b"a", b"b"]);
    h.flush();
    let chunk = Rc::clone(&h.stored[&0]);
    let header = ChunkHeader {
        stream_id: ID,
        first_seq_num: 0,
        record_count: 2,
        data_len: 4,
        last_timestamp: 1_000,
        data_crc: 0,
        directory_crc: 0,
    };
    let mut again = Harness::with_chunks(
        StreamOptions::default(),
        vec![DurableChunk::new(&header, 0, Some(chunk))],
        "tok".into(),
    );
    assert_eq!(again.leader.tail(), Tail { seq_num: 2, timestamp: 1_000 });
    again.now_ms = 500; // a clock that went backwards still never lowers a stamp
    let next = again.append_with(&[b"c"], &[], None, Some("tok")).expect("continues");
    assert_eq!(next.start, Position { seq_num: 2, timestamp: 1_000 });
}

#[test]
fn numbering_stops_before_u64_max() {
    let header = ChunkHeader {
        stream_id: ID,
        first_seq_num: SEQ_NUM_MAX - 1,
        record_count: 1,
        data_len: 1,
        last_timestamp: 0,
        data_crc: 0,
        directory_crc: 0,
    };
    let mut h = Harness::with_chunks(
        StreamOptions::default(),
        vec![DurableChunk::new(&header, 0, None)],
        String::new(),
    );
    assert_eq!(h.leader.next_seq_num(), SEQ_NUM_MAX);
    assert_eq!(
        h.append_with(&[b"a", b"b"], &[], None, None),
        Err(Error::SeqNumOverflow { next_seq_num: SEQ_NUM_MAX, count: 2 })
    );
    let last = h.append(&[b"a"]);
    assert_eq!(last.start.seq_num, SEQ_NUM_MAX, "u64::MAX - 1 is the last number a record takes");
    assert!(h.append_with(&[b"a"], &[], None, None).is_err());
}

// ---- The reference model ----------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Append {
        records: Vec<Vec<u8>>,
        offered: Option<i64>,
        match_right: Option<bool>,
        token: TokenChoice,
    },
    Flush,
    Fence {
        new: u8,
        expected_right: Option<bool>,
    },
    Trim(u64),
    Read {
        start: u8,
        offset: u64,
        count: Option<u64>,
        bytes: Option<u64>,
    },
    Evict,
    Tick(u64),
}

#[derive(Clone, Copy, Debug)]
enum TokenChoice {
    None,
    Current,
    Wrong,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..600), 1..6),
            prop::option::of(0i64..3_000),
            prop::option::of(any::<bool>()),
            prop_oneof![Just(TokenChoice::None), Just(TokenChoice::Current), Just(TokenChoice::Wrong)],
        )
            .prop_map(|(records, offered, match_right, token)| Op::Append { records, offered, match_right, token }),
        2 => Just(Op::Flush),
        1 => (any::<u8>(), prop::option::of(any::<bool>())).prop_map(|(new, expected_right)| Op::Fence { new, expected_right }),
        1 => (0u64..40).prop_map(Op::Trim),
        3 => (0u8..3, 0u64..40, prop::option::of(1u64..10), prop::option::of(1u64..2000))
            .prop_map(|(start, offset, count, bytes)| Op::Read { start, offset, count, bytes }),
        1 => Just(Op::Evict),
        1 => (0u64..50).prop_map(Op::Tick),
    ]
}

/// The model: a Vec of durable records and a Vec of sequenced ones, plus the token
/// and the watermark.
#[derive(Default)]
struct Model {
    durable: Vec<(u64, Vec<u8>)>,
    pending: Vec<(u64, Vec<u8>)>,
    token: String,
    trim: u64,
}

impl Model {
    fn next(&self) -> u64 {
        (self.durable.len() + self.pending.len()) as u64
    }
    fn last_ts(&self) -> u64 {
        self.pending.last().or(self.durable.last()).map_or(0, |r| r.0)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn leader_matches_the_reference_model(
        ops in prop::collection::vec(op(), 1..80),
        grows in any::<bool>(),
    ) {
        let mut h = Harness::new(StreamOptions::default());
        if grows {
            h.sizes = GROWING;
        }
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Append { records, offered, match_right, token } => {
                    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                    let offers = vec![offered; records.len()];
                    let match_seq_num = match_right.map(|right| if right { m.next() } else { m.next() + 1 });
                    let token_string = match token {
                        TokenChoice::None => None,
                        TokenChoice::Current => Some(m.token.clone()),
                        TokenChoice::Wrong => Some(format!("{}-wrong", m.token)),
                    };
                    let result = h.append_with(&refs, &offers, match_seq_num, token_string.as_deref());
                    let refused = matches!(token, TokenChoice::Wrong) || match_right == Some(false);
                    if refused {
                        prop_assert!(result.is_err(), "{result:?}");
                        prop_assert_eq!(h.leader.next_seq_num(), m.next());
                    } else {
                        let seq = result.expect("accepted");
                        prop_assert_eq!(seq.start.seq_num, m.next());
                        let stamp = offered.map_or(h.now_ms, |o| (o.max(0) as u64).min(h.now_ms)).max(m.last_ts());
                        prop_assert_eq!(seq.start.timestamp, stamp);
                        m.pending.extend(records.into_iter().map(|r| (stamp, r)));
                    }
                }
                Op::Flush => {
                    h.flush();
                    m.durable.append(&mut m.pending);
                }
                Op::Fence { new, expected_right } => {
                    let expected = expected_right.map(|right| if right { m.token.clone() } else { format!("{}x", m.token) });
                    let result = h.leader.check_fence(expected.as_deref());
                    if expected_right == Some(false) {
                        prop_assert!(result.is_err());
                    } else {
                        prop_assert!(result.is_ok());
                        m.token = format!("t{new}");
                        h.leader.set_fencing_token(m.token.clone());
                    }
                }
                Op::Trim(seq) => {
                    let target = h.leader.trim_target(seq);
                    prop_assert_eq!(target, seq.min(m.durable.len() as u64).max(m.trim));
                    h.leader.set_trim(target);
                    m.trim = target;
                }
                Op::Read { start, offset, count, bytes } => {
                    let tail = m.durable.len() as u64;
                    let start = match start {
                        0 => ReadStart::SeqNum(offset),
                        1 => ReadStart::TailOffset(offset),
                        _ => ReadStart::Timestamp(1_000 + offset * 25),
                    };
                    let expected_start = match start {
                        ReadStart::SeqNum(s) if s > tail => None,
                        ReadStart::SeqNum(s) => Some(s.max(m.trim)),
                        ReadStart::TailOffset(k) => Some(tail.saturating_sub(k).max(m.trim)),
                        ReadStart::Timestamp(t) => Some(
                            (m.trim..tail).find(|&i| m.durable[i as usize].0 >= t).unwrap_or(tail).max(m.trim),
                        ),
                    };
                    let located = h.locate(start, false);
                    match expected_start {
                        None => prop_assert_eq!(located.map_err(|e| e.code()), Err(Code::OutOfRange)),
                        Some(from) => {
                            prop_assert_eq!(located.as_ref().ok(), Some(&from));
                            let limits = PageLimits {
                                records: count.unwrap_or(u64::MAX),
                                bytes: bytes.unwrap_or(u64::MAX),
                                until: None,
                            };
                            let (records, page) = h.page(from, limits);
                            let mut expected = Vec::new();
                            let mut used = 0u64;
                            for i in from..tail {
                                let (ts, body) = &m.durable[i as usize];
                                let size = body.len() as u64;
                                if expected.len() as u64 >= limits.records || (!expected.is_empty() && used + size > limits.bytes) {
                                    break;
                                }
                                used += size;
                                expected.push((i, *ts, body.clone()));
                            }
                            // A page may end early at a chunk that is only in storage (one
                            // load per page), but it always makes progress and never skips.
                            prop_assert!(records.len() <= expected.len());
                            prop_assert_eq!(records.is_empty(), expected.is_empty());
                            prop_assert_eq!(&records[..], &expected[..records.len()]);
                            prop_assert_eq!(page.next_seq_num, from + records.len() as u64);
                            prop_assert_eq!(page.tail.seq_num, tail);
                        }
                    }
                }
                Op::Evict => {
                    let first = h.stored.keys().copied().min();
                    if let Some(first) = first {
                        let _ = h.leader.evict(first);
                    }
                    if let Some(any) = h.stored.keys().copied().max() {
                        let _ = h.leader.evict(any);
                    }
                }
                Op::Tick(ms) => h.now_ms += ms,
            }
        }
    }
}

//! Which durable chunks a stream's leader starts from, after a restart or on first use:
//! the chunks its refs name in the object store, and the chunks this shard's journal
//! still holds that no ref names yet (express chunks whose upload had not finished).
//!
//! Pure: the shard reads the refs and the journal and acts on the verdict (deletes the
//! stale refs, uploads the unreferenced journal chunks).
//!
//! The rule. A stream's acknowledged records are a gap-free run from its first record
//! (or its trim watermark) to the last acknowledged batch, because a chunk becomes
//! durable, and its batches are acknowledged, only after every chunk before it did. So
//! the run of chunks that starts at the watermark and continues without a gap holds
//! every acknowledged record. A chunk after a gap was never acknowledged (its
//! predecessor never became durable): its ref is stale and is deleted, so that new
//! chunks taking those sequence numbers are never shadowed by it.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use crate::chunk::ChunkHeader;
use crate::control::RefRow;
use crate::journal::Location;
use crate::stream::DurableChunk;

use super::{ObjectSlot, Stored};

/// The verdict for one stream.
#[derive(Default)]
pub(crate) struct Recovered {
    /// The gap-free run the leader starts from, in sequence order.
    pub chunks: Vec<DurableChunk<Stored>>,
    /// Refs of chunks after a gap (first sequence numbers): never acknowledged.
    pub stale_refs: Vec<u64>,
    /// Chunks of the run that are only in the journal: to upload and reference.
    pub unreferenced: Vec<Location>,
}

/// Merges a stream's refs and journal entries into the run its leader starts from.
/// `refs` and `journal` may come in any order; a chunk in both is the ref's (the journal
/// copy is about to be released).
pub(crate) fn recover(
    trim_seq_num: u64,
    refs: Vec<RefRow>,
    journal: Vec<(ChunkHeader, Location)>,
) -> Recovered {
    let mut found: BTreeMap<u64, DurableChunk<Stored>> = BTreeMap::new();
    for row in refs {
        let slot =
            ObjectSlot { key: Arc::from(row.object), offset: row.offset, length: row.length };
        let chunk = DurableChunk {
            first_seq_num: row.first_seq_num,
            record_count: row.record_count,
            last_timestamp: row.last_timestamp,
            data_len: row.data_len,
            location: Stored::Object(Rc::new(slot)),
            cached: None,
        };
        found.insert(row.first_seq_num, chunk);
    }
    for (header, location) in journal {
        found
            .entry(header.first_seq_num)
            .or_insert_with(|| DurableChunk::new(&header, Stored::Journal(location), None));
    }

    let mut recovered = Recovered::default();
    // The run starts at the chunk holding the watermark (at 0 for an untrimmed stream)
    // and ends at the first gap; everything after a gap is past it too.
    let mut next: Option<u64> = None;
    let mut broken = false;
    for (first, chunk) in found {
        let end = first + u64::from(chunk.record_count);
        // Wholly below the watermark: trimmed history, not the run's concern.
        if next.is_none() && end <= trim_seq_num {
            continue;
        }
        broken |= match next {
            None => first > trim_seq_num,
            Some(expected) => first != expected,
        };
        match (&chunk.location, broken) {
            (Stored::Object(_), true) => recovered.stale_refs.push(first),
            (Stored::Journal(_), true) => {}
            (Stored::Journal(location), false) => recovered.unreferenced.push(*location),
            (Stored::Object(_), false) => {}
        }
        if !broken {
            recovered.chunks.push(chunk);
            next = Some(end);
        }
    }
    recovered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::StreamId;

    const ID: StreamId = StreamId([7; 16]);

    fn row(first: u64, count: u32) -> RefRow {
        RefRow {
            id: ID,
            first_seq_num: first,
            record_count: count,
            last_timestamp: first,
            data_len: count * 10,
            object: format!("_transit/{first}"),
            offset: 0,
            length: 100,
        }
    }

    fn entry(first: u64, count: u32, lsn: u64) -> (ChunkHeader, Location) {
        let header = ChunkHeader {
            stream_id: ID,
            first_seq_num: first,
            record_count: count,
            data_len: count * 10,
            last_timestamp: first,
            data_crc: 0,
            directory_crc: 0,
        };
        (header, Location { lsn, chunk_len: 4096 })
    }

    /// (first, count, "ref" or "journal") of the run.
    fn run(recovered: &Recovered) -> Vec<(u64, u32, &'static str)> {
        recovered
            .chunks
            .iter()
            .map(|c| {
                let kind = match c.location {
                    Stored::Journal(_) => "journal",
                    Stored::Object(_) => "ref",
                };
                (c.first_seq_num, c.record_count, kind)
            })
            .collect()
    }

    #[test]
    fn refs_then_journal_make_one_run_and_the_ref_wins_a_chunk_in_both() {
        let recovered = recover(
            0,
            vec![row(5, 5), row(0, 5)],
            vec![entry(5, 5, 0), entry(10, 2, 8192), entry(12, 1, 16384)],
        );
        assert_eq!(
            run(&recovered),
            [(0, 5, "ref"), (5, 5, "ref"), (10, 2, "journal"), (12, 1, "journal")]
        );
        assert_eq!(recovered.unreferenced, [entry(10, 2, 8192).1, entry(12, 1, 16384).1]);
        assert!(recovered.stale_refs.is_empty());
    }

    #[test]
    fn everything_after_a_gap_is_dropped_and_its_refs_are_stale() {
        // 5..8 never became durable, so 8.. was never acknowledged.
        let recovered = recover(0, vec![row(0, 5), row(8, 2), row(10, 3)], vec![entry(13, 1, 0)]);
        assert_eq!(run(&recovered), [(0, 5, "ref")]);
        assert_eq!(recovered.stale_refs, [8, 10]);
        assert!(recovered.unreferenced.is_empty(), "a journal chunk past the gap is not uploaded");
    }

    #[test]
    fn a_stream_whose_first_chunk_never_landed_has_no_run() {
        let recovered = recover(0, vec![row(3, 2)], vec![]);
        assert!(recovered.chunks.is_empty());
        assert_eq!(recovered.stale_refs, [3]);
    }

    #[test]
    fn the_run_starts_at_the_chunk_holding_the_trim_watermark() {
        let refs = vec![row(0, 5), row(5, 5), row(10, 5)];
        let recovered = recover(7, refs.clone(), vec![]);
        assert_eq!(run(&recovered), [(5, 5, "ref"), (10, 5, "ref")]);
        assert!(recovered.stale_refs.is_empty(), "trimmed chunks are the auditor's, not stale");
        // A watermark on a chunk boundary starts the run at that chunk.
        assert_eq!(run(&recover(10, refs.clone(), vec![])), [(10, 5, "ref")]);
        // Front chunks already reclaimed: the run starts at the boundary chunk.
        assert_eq!(run(&recover(12, refs[2..].to_vec(), vec![])), [(10, 5, "ref")]);
    }

    #[test]
    fn nothing_found_is_an_empty_stream() {
        let recovered = recover(0, vec![], vec![]);
        assert!(recovered.chunks.is_empty() && recovered.stale_refs.is_empty());
    }
}

//! Recovery: reads the log back at open, entry by entry along the chain, and finds where
//! it ends (docs/decisions/0004-express-journal.md, "Recovery").
//!
//! The successor of an entry P is looked for where the writer can have put it: right
//! after P, or at the start of the next segment (when it did not fit after P). A
//! candidate claims P when its envelope is valid, names its own position, and links to
//! P's position and envelope CRC with an epoch no lower than P's (and the same epoch
//! inside an unfinished group). Of two claimants the higher epoch wins: it was written by
//! a later open, which had discarded the other. The claimant's chunk must then pass
//! `Chunk::parse`. The log ends where nothing claims the last entry, or at a damaged
//! claimant; entries after the last group-end flag are discarded.
//!
//! Reads are sequential windows of [`WINDOW_BYTES`], so memory stays bounded; only the
//! headers of the entries are kept. Never writes.

use glommio::io::ReadResult;

use super::envelope::{Envelope, EnvelopeError, Link};
use super::{BLOCK, JournalError, Location, LogEnd, RecoveredEntry, Segment, Tail, entry_len};
use crate::chunk::{Chunk, ENVELOPE_LEN, HEADER_LEN};

/// Bytes read at a time while scanning (more when one entry is larger).
const WINDOW_BYTES: usize = 1 << 20;

/// What the scan found.
pub(super) struct Scan {
    pub entries: Vec<RecoveredEntry>,
    /// The last entry of the last whole group.
    pub tail: Option<Tail>,
    /// Where the next entry goes.
    pub head: u64,
    pub end: LogEnd,
    /// The highest epoch of any well-formed envelope seen: the next open's epoch must
    /// exceed it even if the epoch file was lost.
    pub max_epoch: u64,
}

/// The entry the scan last accepted: what its successor must link to.
struct Predecessor {
    segment: usize,
    lsn: u64,
    end: u64,
    crc: u32,
    epoch: u64,
    group_end: bool,
}

type Parsed = Result<(Envelope, u32), EnvelopeError>;

enum Judgement {
    Claims(Envelope, u32),
    /// `clean`: unwritten space, or an entry of an earlier life of the space, which is how
    /// a log ends; otherwise something damaged.
    Refused {
        reason: String,
        clean: bool,
    },
}

struct Reader<'a> {
    segments: &'a [Segment],
    /// The segment index and journal position of the window's first byte, and its bytes.
    window: Option<(usize, u64, ReadResult)>,
    /// Each segment's first envelope, read once: the candidate successor of every entry of
    /// the segment before it.
    first_envelopes: Vec<Option<Parsed>>,
    max_epoch: u64,
}

impl<'a> Reader<'a> {
    fn new(segments: &'a [Segment]) -> Self {
        Self { segments, window: None, first_envelopes: vec![None; segments.len()], max_epoch: 0 }
    }

    /// `len` bytes at `lsn` of segment `index`, or `None` if the file ends first.
    async fn bytes(
        &mut self,
        index: usize,
        lsn: u64,
        len: usize,
    ) -> Result<Option<&[u8]>, JournalError> {
        let segment = &self.segments[index];
        debug_assert!(segment.start <= lsn && lsn + len as u64 <= segment.end());
        let hit = matches!(&self.window, Some((i, start, bytes))
            if *i == index && *start <= lsn && lsn + len as u64 <= start + bytes.len() as u64);
        if !hit {
            let want = (len.max(WINDOW_BYTES) as u64).min(segment.end() - lsn) as usize;
            let bytes = segment
                .file
                .read_at_aligned(lsn - segment.start, want)
                .await
                .map_err(|e| super::io_error("reading", &segment.path, e))?;
            self.window = Some((index, lsn, bytes));
        }
        let (_, start, bytes) = self.window.as_ref().expect("the window was just filled");
        let from = (lsn - start) as usize;
        Ok(bytes.get(from..from + len))
    }

    fn note(&mut self, parsed: Parsed) -> Parsed {
        if let Ok((envelope, _)) = parsed {
            self.max_epoch = self.max_epoch.max(envelope.epoch);
        }
        parsed
    }

    async fn envelope_at(&mut self, index: usize, lsn: u64) -> Result<Parsed, JournalError> {
        let parsed = match self.bytes(index, lsn, ENVELOPE_LEN).await? {
            Some(bytes) => Envelope::parse(bytes.first_chunk().expect("64 bytes")),
            None => Err(EnvelopeError::Unwritten),
        };
        Ok(self.note(parsed))
    }

    async fn first_envelope(&mut self, index: usize) -> Result<Parsed, JournalError> {
        if let Some(parsed) = self.first_envelopes[index] {
            return Ok(parsed);
        }
        let segment = &self.segments[index];
        let block = segment
            .file
            .read_at_aligned(0, BLOCK as usize)
            .await
            .map_err(|e| super::io_error("reading", &segment.path, e))?;
        let parsed = match block.first_chunk::<ENVELOPE_LEN>() {
            Some(bytes) => Envelope::parse(bytes),
            None => Err(EnvelopeError::Unwritten),
        };
        let parsed = self.note(parsed);
        self.first_envelopes[index] = Some(parsed);
        Ok(parsed)
    }
}

fn judge(
    parsed: Parsed,
    lsn: u64,
    segment_end: u64,
    predecessor: Option<&Predecessor>,
) -> Judgement {
    let refused = |reason: String, clean| Judgement::Refused { reason, clean };
    let (envelope, crc) = match parsed {
        Ok(parsed) => parsed,
        Err(EnvelopeError::Unwritten) => return refused("unwritten space".into(), true),
        // Old bytes that start no entry (the middle of an entry of an earlier life of a
        // recycled segment): where a log ends, not damage.
        Err(EnvelopeError::BadMagic { .. }) => return refused("no entry starts here".into(), true),
        Err(error) => return refused(error.to_string(), false),
    };
    if envelope.lsn != lsn {
        return refused(
            format!("an entry for lsn {} from an earlier use of this space", envelope.lsn),
            true,
        );
    }
    if (envelope.chunk_len as usize) < HEADER_LEN
        || lsn + entry_len(envelope.chunk_len) > segment_end
    {
        return refused(
            format!("an entry of {} chunk bytes that does not fit its segment", envelope.chunk_len),
            false,
        );
    }
    if let Some(p) = predecessor {
        if envelope.prev != Some(Link { lsn: p.lsn, crc: p.crc }) {
            let prev = envelope.prev.map_or("none".to_string(), |link| link.lsn.to_string());
            return refused(format!("an entry written after another one (prev_lsn {prev})"), true);
        }
        if envelope.epoch < p.epoch {
            return refused(
                format!("an entry of epoch {} after one of epoch {}", envelope.epoch, p.epoch),
                true,
            );
        }
        if !p.group_end && envelope.epoch != p.epoch {
            return refused(
                format!("an entry of epoch {} inside a group of epoch {}", envelope.epoch, p.epoch),
                false,
            );
        }
    }
    Judgement::Claims(envelope, crc)
}

/// Checks the chunk of an entry (`bytes` from its envelope on) against the envelope;
/// returns its header.
pub(super) fn verify_chunk(
    bytes: Option<&[u8]>,
    envelope: &Envelope,
) -> Result<crate::chunk::ChunkHeader, String> {
    let Some(bytes) = bytes else {
        return Err("the segment file ends inside the entry".into());
    };
    let chunk = &bytes[ENVELOPE_LEN..ENVELOPE_LEN + envelope.chunk_len as usize];
    let header = Chunk::parse(chunk).map_err(|e| format!("its chunk is damaged: {e}"))?.header;
    if chunk[HEADER_LEN - 4..HEADER_LEN] != envelope.chunk_header_crc.to_le_bytes() {
        return Err("its chunk is not the one its envelope was written for".into());
    }
    Ok(header)
}

/// Scans the log in `segments` (contiguous, in LSN order).
pub(super) async fn scan(segments: &[Segment]) -> Result<Scan, JournalError> {
    let Some(first) = segments.first() else {
        return Ok(Scan {
            entries: Vec::new(),
            tail: None,
            head: 0,
            end: LogEnd::Clean,
            max_epoch: 0,
        });
    };
    let mut reader = Reader::new(segments);
    let mut entries = Vec::new();
    let mut pending: Vec<RecoveredEntry> = Vec::new();
    let mut tail = None;
    let mut predecessor: Option<Predecessor> = None;
    // Every accepted entry starts at a distinct block, so this bounds the walk.
    let steps_max = segments.iter().map(|s| s.len / BLOCK).sum::<u64>() + 1;
    let mut stop = None;
    for _ in 0..steps_max {
        let mut candidates = Vec::with_capacity(2);
        match &predecessor {
            None => candidates.push((0, first.start)),
            Some(p) => {
                if p.end + BLOCK <= segments[p.segment].end() {
                    candidates.push((p.segment, p.end));
                }
                if p.segment + 1 < segments.len() {
                    candidates.push((p.segment + 1, segments[p.segment + 1].start));
                }
            }
        }
        let mut best: Option<(usize, u64, Envelope, u32)> = None;
        let mut refusal: Option<(u64, String, bool)> = None;
        for (index, lsn) in candidates {
            let next_segment = predecessor.as_ref().is_some_and(|p| p.segment != index);
            let parsed = if next_segment {
                reader.first_envelope(index).await?
            } else {
                reader.envelope_at(index, lsn).await?
            };
            if let Err(EnvelopeError::UnknownVersion { version }) = parsed {
                return Err(JournalError::Damaged {
                    path: segments[index].path.display().to_string(),
                    reason: format!(
                        "the entry at lsn {lsn} has format version {version}, unknown to this build"
                    ),
                });
            }
            match judge(parsed, lsn, segments[index].end(), predecessor.as_ref()) {
                Judgement::Claims(envelope, crc) => {
                    if best.as_ref().is_none_or(|(.., b, _)| envelope.epoch > b.epoch) {
                        best = Some((index, lsn, envelope, crc));
                    }
                }
                Judgement::Refused { reason, clean } => {
                    refusal.get_or_insert((lsn, reason, clean));
                }
            }
        }
        let Some((index, lsn, envelope, crc)) = best else {
            let end = predecessor.as_ref().map_or(first.start, |p| p.end);
            stop = Some(refusal.unwrap_or((end, "the end of the last segment".into(), true)));
            break;
        };
        let len = entry_len(envelope.chunk_len);
        let bytes = reader.bytes(index, lsn, len as usize).await?;
        let header = match verify_chunk(bytes, &envelope) {
            Ok(header) => header,
            Err(reason) => {
                stop = Some((lsn, format!("the entry at lsn {lsn}: {reason}"), false));
                break;
            }
        };
        let location = Location { lsn, chunk_len: envelope.chunk_len };
        pending.push(RecoveredEntry { location, header });
        if envelope.group_end {
            entries.append(&mut pending);
            tail = Some(Tail { lsn, end: lsn + len, crc });
        }
        predecessor = Some(Predecessor {
            segment: index,
            lsn,
            end: lsn + len,
            crc,
            epoch: envelope.epoch,
            group_end: envelope.group_end,
        });
    }
    let Some((stop_lsn, reason, clean)) = stop else {
        return Err(JournalError::Stopped {
            cause: format!("recovery walked more than {steps_max} entries"),
        });
    };
    let end = if let Some(first_discarded) = pending.first() {
        LogEnd::Cut {
            lsn: first_discarded.location.lsn,
            reason: format!("the last group is incomplete: at lsn {stop_lsn}, {reason}"),
            discarded_entries: pending.len() as u32,
        }
    } else if clean {
        LogEnd::Clean
    } else {
        LogEnd::Cut { lsn: stop_lsn, reason, discarded_entries: 0 }
    };
    let head = tail.as_ref().map_or(first.start, |t: &Tail| t.end);
    Ok(Scan { entries, tail, head, end, max_epoch: reader.max_epoch })
}

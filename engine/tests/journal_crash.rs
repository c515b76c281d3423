//! Kill -9 test of the express journal.
//!
//! The test re-executes its own binary as a writer child (selected by an environment
//! variable) that opens the journal on a glommio executor, continues the log it recovers,
//! and appends groups of chunks as fast as it can, printing each group before it appends
//! (`TRY`) and after `append` returned (`ACK`, with each chunk's location), and each
//! release before it starts (`RELEASE`). The parent SIGKILLs it at a random moment,
//! reopens the journal itself and checks: every acknowledged entry not released is
//! recovered, in order, at its location, with every record byte intact; the log is one
//! unbroken run of sequence numbers; and anything past the last acknowledgement is
//! exactly the whole group the child was appending, or nothing. Several rounds on one
//! directory, so later rounds recover logs that earlier kills cut, with rolls, releases
//! and recycled segments in between.
//!
//! A failing seed replays with `NOVA_JOURNAL_CRASH_SEED=<seed>`.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::chunk::{ChunkBuilder, SealedChunk};
use engine::ids::StreamId;
use engine::journal::{self, Journal, JournalBuffer, JournalConfig, LogEnd, RecoveredEntry};
use glommio::{LocalExecutorBuilder, Placement};

use common::crash::{self, Rng};

const TEST_NAME: &str = "kill9_keeps_every_acknowledged_group_whole";
/// Set in the child: the journal directory. Its presence selects writer mode.
const WRITER_DIR_ENV: &str = "NOVA_JOURNAL_CRASH_WRITER_DIR";
const WRITER_SEED_ENV: &str = "NOVA_JOURNAL_CRASH_WRITER_SEED";
const SEED_ENV: &str = "NOVA_JOURNAL_CRASH_SEED";
const ROUNDS: u32 = 8;
const STREAM: StreamId = StreamId(*b"journal-crash-00");
/// Small segments so that every round rolls, releases and recycles.
const CONFIG: JournalConfig = JournalConfig { segment_bytes: 1 << 20, spare_segments: 2 };
/// A group holds up to this many chunks, a chunk up to this many records.
const GROUP_CHUNKS_MAX: u64 = 8;
const CHUNK_RECORDS_MAX: u64 = 24;
/// The child releases everything older than this many entries every so many groups.
const KEEP_ENTRIES: usize = 64;
const RELEASE_EVERY_GROUPS: u64 = 16;
/// The child stops after this many groups or this long; the parent kills it long before.
const WRITER_GROUPS_MAX: u64 = 10_000_000;
const WRITER_TIME_MAX: Duration = Duration::from_secs(60);
const RUN_BEFORE_KILL_MS_MAX: u64 = 400;

/// Record `seq`'s body length: mostly small, some large, so entries end on every kind of
/// block boundary and some span many blocks. A function of `seq` alone, so the parent
/// checks every byte without being told.
fn body_len(seq: u64) -> usize {
    let mixed = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    match mixed % 16 {
        0 => 20_000 + (mixed % 20_000) as usize,
        1..=5 => (mixed % 4_000) as usize,
        _ => (mixed % 300) as usize,
    }
}

/// Record `seq`'s stored bytes: a headerless record with a pattern derived from `seq`.
fn stored(seq: u64) -> Vec<u8> {
    let mut record = vec![0x00];
    record
        .extend((0..body_len(seq)).map(|i| (seq as usize).wrapping_mul(131).wrapping_add(i) as u8));
    record
}

fn executor() -> glommio::LocalExecutor {
    LocalExecutorBuilder::new(Placement::Unbound).make().expect("a glommio executor")
}

fn say(line: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    stdout.write_fmt(line).expect("stdout is the parent's pipe");
    stdout.write_all(b"\n").expect("stdout is the parent's pipe");
    stdout.flush().expect("stdout is the parent's pipe");
}

fn build(journal: &Journal, first_seq: u64, count: u64) -> SealedChunk<JournalBuffer> {
    let records: Vec<Vec<u8>> = (first_seq..first_seq + count).map(stored).collect();
    let data_len = records.iter().map(Vec::len).sum();
    let capacity = ChunkBuilder::<JournalBuffer>::capacity_for(records.len(), data_len);
    let mut builder = ChunkBuilder::with_buffer(journal.alloc_buffer(capacity), STREAM, first_seq);
    for (seq, record) in (first_seq..).zip(&records) {
        builder.push_record(record, seq).expect("sized to fit");
    }
    builder.seal()
}

/// The child: appends until killed (or the bounds end it).
fn write_until_killed(dir: &Path, seed: u64) {
    executor().run(async {
        journal::probe_io_poll(dir.parent().expect("the journal has a parent directory"))
            .await
            .expect("probe");
        let (journal, recovery) = Journal::open(dir, CONFIG).await.expect("open in the child");
        // A line of its own: libtest left "test <name> ... " unterminated on stdout.
        say(format_args!("\nOPENED epoch {}", recovery.epoch));
        let mut next_seq = recovery
            .entries
            .last()
            .map_or(0, |e| e.header.first_seq_num + u64::from(e.header.record_count));
        let mut rng = Rng::new(seed);
        let mut recent = std::collections::VecDeque::with_capacity(KEEP_ENTRIES + 1);
        let started = Instant::now();
        for group in 0..WRITER_GROUPS_MAX {
            if started.elapsed() > WRITER_TIME_MAX {
                return;
            }
            let mut chunks = Vec::new();
            let mut described = Vec::new();
            for _ in 0..=rng.below(GROUP_CHUNKS_MAX) {
                let count = 1 + rng.below(CHUNK_RECORDS_MAX);
                chunks.push(build(&journal, next_seq, count));
                described.push(format!("{next_seq}:{count}"));
                next_seq += count;
            }
            say(format_args!("TRY {}", described.join(" ")));
            let appended = journal.append(chunks).await.expect("append");
            let acked: Vec<String> = appended
                .iter()
                .map(|(chunk, location)| {
                    let header = chunk.header();
                    format!("{}:{}:{}", location.lsn, header.first_seq_num, header.record_count)
                })
                .collect();
            say(format_args!("ACK {}", acked.join(" ")));
            for (_, location) in &appended {
                if recent.len() == KEEP_ENTRIES {
                    recent.pop_front();
                }
                recent.push_back(location.lsn);
            }
            if group % RELEASE_EVERY_GROUPS == RELEASE_EVERY_GROUPS - 1
                && let Some(&oldest) = recent.front()
            {
                say(format_args!("RELEASE {oldest}"));
                journal.release_before(oldest).await.expect("release");
            }
        }
    });
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    lsn: u64,
    first_seq: u64,
    count: u64,
}

#[derive(Debug)]
enum Line {
    Try(Vec<(u64, u64)>),
    Ack(Vec<Entry>),
    Release(u64),
}

fn parse_line(line: &str) -> Option<Line> {
    let number = |word: &str| word.parse::<u64>().ok();
    let (kind, rest) = line.split_once(' ')?;
    let words = rest.split(' ');
    Some(match kind {
        "TRY" => Line::Try(
            words
                .map(|word| {
                    let (first, count) = word.split_once(':')?;
                    Some((number(first)?, number(count)?))
                })
                .collect::<Option<_>>()?,
        ),
        "ACK" => Line::Ack(
            words
                .map(|word| {
                    let mut parts = word.split(':').map(number);
                    let entry = Entry {
                        lsn: parts.next()??,
                        first_seq: parts.next()??,
                        count: parts.next()??,
                    };
                    parts.next().is_none().then_some(entry)
                })
                .collect::<Option<_>>()?,
        ),
        "RELEASE" => Line::Release(number(rest)?),
        _ => return None,
    })
}

/// Runs one child until a random moment after its first acknowledgement, SIGKILLs it,
/// and returns every line it printed.
fn run_and_kill(dir: &Path, round: u32, rng: &mut Rng) -> Vec<Line> {
    let run_for = Duration::from_millis(rng.below(RUN_BEFORE_KILL_MS_MAX) + 1);
    let envs = [
        (WRITER_DIR_ENV, dir.display().to_string()),
        (WRITER_SEED_ENV, rng.below(u64::MAX).to_string()),
    ];
    let lines = crash::run_and_kill(
        TEST_NAME,
        &envs,
        parse_checked,
        |line| matches!(line, Line::Ack(_)),
        run_for,
    );
    println!("round {round}: killed after {run_for:?} and {} lines", lines.len());
    lines
}

/// A line of the child's, or `None` for other output; a malformed line of ours fails.
fn parse_checked(line: &str) -> Option<Line> {
    let parsed = parse_line(line);
    assert!(
        parsed.is_some() || !["TRY", "ACK", "RELEASE"].iter().any(|kind| line.starts_with(kind)),
        "unparsable line {line:?}"
    );
    parsed
}

/// What the log must hold: every entry ever committed, in order, and how far releases
/// may have removed its front.
#[derive(Default)]
struct Model {
    log: Vec<Entry>,
    /// Entries below this may have been released.
    released_below: u64,
}

impl Model {
    /// Applies a round's lines; returns the group in flight at the kill, if any.
    fn apply(&mut self, lines: Vec<Line>) -> Option<Vec<(u64, u64)>> {
        let mut in_flight = None;
        for line in lines {
            match line {
                Line::Try(group) => {
                    assert!(
                        in_flight.is_none(),
                        "a group was tried before the last one was acknowledged"
                    );
                    in_flight = Some(group);
                }
                Line::Ack(entries) => {
                    let tried = in_flight.take().expect("an acknowledgement follows a try");
                    let acked: Vec<_> = entries.iter().map(|e| (e.first_seq, e.count)).collect();
                    assert_eq!(acked, tried, "the acknowledged group is the one tried");
                    self.log.extend(entries);
                }
                Line::Release(lsn) => self.released_below = self.released_below.max(lsn),
            }
        }
        in_flight
    }
}

/// Reopens the journal and checks it against the model; adopts a recovered in-flight
/// group into the model (it is durable now).
fn verify(dir: &Path, model: &mut Model, in_flight: Option<Vec<(u64, u64)>>, round: u32) {
    let recovered: Vec<(RecoveredEntry, bool)> = executor().run(async {
        journal::probe_io_poll(dir.parent().expect("a parent directory")).await.expect("probe");
        let (journal, recovery) = Journal::open(dir, CONFIG).await.expect("reopen after the kill");
        println!("round {round}: recovered {} entries, {:?}", recovery.entries.len(), recovery.end);
        if let LogEnd::Cut { discarded_entries, .. } = recovery.end {
            assert!(
                (discarded_entries as u64) < GROUP_CHUNKS_MAX,
                "round {round}: only the last group can be incomplete"
            );
        }
        let mut checked = Vec::new();
        for entry in recovery.entries {
            let read = journal.read(&entry.location).await.expect("every recovered entry reads");
            let records = read.records();
            let whole = records.first_seq_num() == entry.header.first_seq_num
                && records.len() == entry.header.record_count as usize
                && records
                    .iter()
                    .all(|(seq, timestamp, bytes)| timestamp == seq && bytes == stored(seq));
            checked.push((entry, whole));
        }
        journal.close().await.expect("close");
        checked
    });
    for (entry, whole) in &recovered {
        assert!(whole, "round {round}: the chunk at {:?} is not what was written", entry.location);
    }
    let found: Vec<Entry> = recovered
        .iter()
        .map(|(e, _)| Entry {
            lsn: e.location.lsn,
            first_seq: e.header.first_seq_num,
            count: u64::from(e.header.record_count),
        })
        .collect();
    for pair in found.windows(2) {
        assert_eq!(
            pair[0].first_seq + pair[0].count,
            pair[1].first_seq,
            "round {round}: a gap in the log"
        );
        assert!(pair[0].lsn < pair[1].lsn, "round {round}: the log goes backwards");
    }
    // The recovered log is a suffix of the committed log (releases took its front)...
    let start = match found.first() {
        Some(first) => model.log.iter().position(|e| e.lsn == first.lsn).unwrap_or_else(|| {
            panic!("round {round}: the log starts at {first:?}, never committed")
        }),
        None => model.log.len(),
    };
    let must_keep =
        model.log.iter().position(|e| e.lsn >= model.released_below).unwrap_or(model.log.len());
    assert!(
        start <= must_keep,
        "round {round}: entries after the release point {} are gone",
        model.released_below
    );
    let committed = &model.log[start..];
    assert!(found.len() >= committed.len(), "round {round}: acknowledged entries are missing");
    assert_eq!(&found[..committed.len()], committed, "round {round}: acknowledged entries differ");
    // ...followed by nothing, or exactly the whole group in flight at the kill.
    let extra = &found[committed.len()..];
    if !extra.is_empty() {
        let group =
            in_flight.unwrap_or_else(|| panic!("round {round}: unacknowledged entries {extra:?}"));
        let got: Vec<_> = extra.iter().map(|e| (e.first_seq, e.count)).collect();
        assert_eq!(got, group, "round {round}: part of an unacknowledged group");
        println!(
            "round {round}: the unacknowledged group of {} chunks was whole on disk",
            group.len()
        );
        model.log.extend_from_slice(extra);
    }
}

#[test]
fn kill9_keeps_every_acknowledged_group_whole() {
    if let Some(dir) = std::env::var_os(WRITER_DIR_ENV) {
        let seed = std::env::var(WRITER_SEED_ENV).ok().and_then(|seed| seed.parse().ok());
        write_until_killed(Path::new(&dir), seed.expect("the parent sets the seed"));
        return;
    }
    let mut rng = Rng::seeded(SEED_ENV);
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir: PathBuf = temp.path().join("journal");
    let mut model = Model::default();
    for round in 0..ROUNDS {
        let lines = run_and_kill(&dir, round, &mut rng);
        let in_flight = model.apply(lines);
        verify(&dir, &mut model, in_flight, round);
    }
    assert!(model.log.len() > 100, "the rounds appended something: {} entries", model.log.len());
}

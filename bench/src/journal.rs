//! The express journal alone: groups of 16 chunks of 1 MiB (1 KiB records) appended into
//! fresh preallocated segments, then into recycled ones, next to raw 1 MiB O_DIRECT
//! writes at queue depth 16 with one fdatasync per 16 MiB, on the same disk in the same
//! run (docs/decisions/0004-express-journal.md cites these figures).

use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use engine::chunk::ChunkBuilder;
use engine::ids::StreamId;
use engine::journal::{Journal, JournalConfig};
use glommio::io::OpenOptions;
use glommio::{LocalExecutorBuilder, Placement};

const CHUNKS_PER_GROUP: u64 = 16;
const RECORDS_PER_CHUNK: u64 = 1000;
const RECORD_BYTES: usize = 1040;

fn chunk(
    journal: &Journal,
    first_seq: u64,
) -> engine::chunk::SealedChunk<engine::journal::JournalBuffer> {
    let capacity = ChunkBuilder::<engine::journal::JournalBuffer>::capacity_for(
        RECORDS_PER_CHUNK as usize,
        RECORDS_PER_CHUNK as usize * RECORD_BYTES,
    );
    let mut builder =
        ChunkBuilder::with_buffer(journal.alloc_buffer(capacity), StreamId([3; 16]), first_seq);
    let mut stored = vec![0x61u8; RECORD_BYTES];
    stored[0] = 0; // headerless
    for _ in 0..RECORDS_PER_CHUNK {
        builder.push_record(&stored, 0).expect("sized for it");
    }
    builder.seal()
}

/// The raw reference: bytes per second of 1 MiB O_DIRECT writes at queue depth 16, one
/// fdatasync per 16 MiB, `groups` groups into a preallocated file under `dir`; the best
/// of two passes.
pub fn raw_reference(dir: &Path, groups: u64) -> f64 {
    let path = dir.join("raw-reference");
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .name("bench-raw-disk")
        .spawn(move || async move {
            let file = Rc::new(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .dma_open(&path)
                    .await
                    .expect("create"),
            );
            let raw_bytes = (groups * CHUNKS_PER_GROUP) << 20;
            file.pre_allocate(raw_bytes, false).await.expect("preallocate");
            let buffers: Vec<_> = (0..CHUNKS_PER_GROUP)
                .map(|_| {
                    let mut buf = file.alloc_dma_buffer(1 << 20);
                    buf.as_bytes_mut().fill(0x5a);
                    Rc::new(buf)
                })
                .collect();
            let mut raw = 0f64;
            for _ in 0..2 {
                let started = Instant::now();
                for group in 0..groups {
                    let writes: Vec<_> = (0..CHUNKS_PER_GROUP)
                        .map(|i| {
                            let (file, buf) = (Rc::clone(&file), Rc::clone(&buffers[i as usize]));
                            let at = (group * CHUNKS_PER_GROUP + i) << 20;
                            glommio::spawn_local(async move { file.write_rc_at(buf, at).await })
                        })
                        .collect();
                    for write in writes {
                        write.await.expect("raw write");
                    }
                    file.fdatasync().await.expect("raw sync");
                }
                raw = raw.max(raw_bytes as f64 / started.elapsed().as_secs_f64());
            }
            let _ = std::fs::remove_file(&path);
            raw
        })
        .expect("start the executor");
    handle.join().expect("raw disk reference")
}

pub fn run(quick: bool) {
    let groups: u64 = if quick { 2 } else { 48 };
    let dir = std::env::current_dir().expect("cwd").join("target").join("bench-journal");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench directory");
    let journal_dir = dir.join("journal");
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .name("bench-journal")
        .spawn(move || async move {
            let config = JournalConfig { spare_segments: 64, ..JournalConfig::default() };
            let (journal, _) = Journal::open(journal_dir, config).await.expect("open");
            let mut rates = Vec::new();
            for label in ["fresh preallocated segments", "recycled segments"] {
                let before = journal.stats();
                let mut appending = Duration::ZERO;
                for group in 0..groups {
                    let chunks = (0..CHUNKS_PER_GROUP)
                        .map(|i| {
                            chunk(&journal, (group * CHUNKS_PER_GROUP + i) * RECORDS_PER_CHUNK)
                        })
                        .collect();
                    let started = Instant::now();
                    journal.append(chunks).await.expect("append");
                    appending += started.elapsed();
                }
                let bytes = journal.stats().bytes - before.bytes;
                rates.push((label, bytes as f64 / appending.as_secs_f64()));
                journal.release_before(journal.head()).await.expect("release");
            }
            rates
        })
        .expect("start the executor");
    let rates = handle.join().expect("journal bench");
    let raw = raw_reference(&dir, groups);
    let _ = std::fs::remove_dir_all(&dir);
    println!("\n### Express journal alone (groups of 16 x 1 MiB chunks, one fdatasync each)\n");
    println!("| case | MB/s | raw MB/s | ratio |");
    println!("|---|---:|---:|---:|");
    for (label, rate) in rates {
        println!("| {label} | {:.0} | {:.0} | {:.2} |", rate / 1e6, raw / 1e6, rate / raw);
    }
}

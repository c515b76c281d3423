//! Format microbenchmarks: the stored-record codec and the chunk, against memcpy.
//!
//! Bytes counted are content bytes (body plus header names and values), the unit every
//! cap meters; memcpy copies the same number of bytes between two buffers of the same
//! working-set size, so the ratio says how close a codec step comes to moving the bytes.

use std::hint::black_box;

use engine::aligned::AlignedBuf;
use engine::batch;
use engine::chunk::{Chunk, ChunkBuilder, SealedChunk};
use engine::framing::{AppendBuilder, AppendConditions, AppendFrame};
use engine::ids::StreamId;
use engine::limits::Limits;
use engine::record;

use crate::harness::{Budget, Row, print_table, throughput};

/// Records per batch in the chunk cases: a typical pipelined producer batch.
const BATCH_RECORDS: usize = 64;

struct Workload {
    name: String,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    records: usize,
}

impl Workload {
    fn new(body_len: usize, with_headers: bool, working_set: usize) -> Self {
        let headers = if with_headers {
            vec![
                (b"content-type".to_vec(), b"application/json".to_vec()),
                (b"trace".to_vec(), vec![b'7'; 16]),
            ]
        } else {
            Vec::new()
        };
        let label = match body_len {
            n if n >= 1024 => format!("{} KiB", n / 1024),
            n => format!("{n} B"),
        };
        let name = format!("{label}{}", if with_headers { " + 2 headers" } else { "" });
        let body = (0..body_len).map(|i| (i * 31) as u8).collect();
        Self { name, headers, body, records: (working_set / body_len).max(BATCH_RECORDS) }
    }

    fn content_len(&self) -> usize {
        self.body.len() + self.headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>()
    }

    fn content_bytes(&self) -> u64 {
        (self.content_len() * self.records) as u64
    }

    /// Framed batches of [`BATCH_RECORDS`], as a producer sends them.
    fn framed_batches(&self) -> Vec<Vec<u8>> {
        (0..self.records / BATCH_RECORDS)
            .map(|_| {
                let mut builder = AppendBuilder::new();
                for _ in 0..BATCH_RECORDS {
                    builder.push(&self.headers, &self.body).expect("fits");
                }
                builder.finish(&AppendConditions::default())
            })
            .collect()
    }
}

fn memcpy_rate(budget: Budget, bytes: usize) -> f64 {
    let source = vec![1u8; bytes];
    let mut target = vec![0u8; bytes];
    throughput(budget, bytes as u64, || {
        target.copy_from_slice(black_box(&source));
        black_box(&target);
    })
}

pub fn run(quick: bool) {
    let budget = Budget::new(quick);
    let working_set = if quick { 1 << 20 } else { 64 << 20 };
    let mut rows = Vec::new();
    for body_len in [100, 1024, 64 * 1024] {
        for with_headers in [false, true] {
            let workload = Workload::new(body_len, with_headers, working_set);
            rows.extend(measure(budget, &workload));
        }
    }
    print_table("Codec and chunk (content bytes per second)", "memcpy", &rows);
}

fn measure(budget: Budget, workload: &Workload) -> Vec<Row> {
    let content = workload.content_bytes();
    let reference = memcpy_rate(budget, content as usize);
    let row = |op: &str, rate: f64| Row {
        case: format!("{op}, {}", workload.name),
        bytes_per_second: rate,
        reference_per_second: reference,
    };
    let mut rows = Vec::new();

    let mut out = Vec::with_capacity(content as usize * 2);
    let encode = throughput(budget, content, || {
        out.clear();
        for _ in 0..workload.records {
            record::encode(&workload.headers, &workload.body, &mut out).expect("fits");
        }
        black_box(&out);
    });
    rows.push(row("encode", encode));

    let batches = workload.framed_batches();
    let frames: Vec<AppendFrame<'_>> =
        batches.iter().map(|b| AppendFrame::decode(b).expect("valid framing")).collect();
    let batch_content = (workload.content_len() * BATCH_RECORDS * frames.len()) as u64;
    let limits = Limits::default();
    let validate = throughput(budget, batch_content, || {
        for body in &batches {
            let frame = AppendFrame::decode(black_box(body)).expect("valid");
            black_box(batch::validate(frame.lengths, frame.data, &limits).expect("valid"));
        }
    });
    rows.push(row("validate-decode (framing + strict decode + limits)", validate));

    // The server's path: framed batches copied once into 8 MiB chunks from a pool of
    // recycled buffers (as a shard does), sealed.
    let chunk_capacity = 8 << 20;
    let mut sealed: Vec<SealedChunk> = Vec::new();
    let mut pool: Vec<AlignedBuf> = Vec::new();
    let take = |pool: &mut Vec<AlignedBuf>, first| match pool.pop() {
        Some(buf) => ChunkBuilder::with_buffer(buf, StreamId([7; 16]), first),
        None => ChunkBuilder::new(StreamId([7; 16]), first, chunk_capacity),
    };
    let build = throughput(budget, batch_content, || {
        pool.extend(sealed.drain(..).map(SealedChunk::into_storage));
        let mut builder = take(&mut pool, 0);
        for (i, frame) in frames.iter().enumerate() {
            if !builder.fits(frame.record_count(), frame.data.len()) {
                let next = take(&mut pool, builder.next_seq_num());
                sealed.push(std::mem::replace(&mut builder, next).seal());
            }
            builder.push_batch(frame.lengths, frame.data, i as u64).expect("fits an empty chunk");
        }
        sealed.push(builder.seal());
        black_box(&sealed);
    });
    rows.push(row("encode-into-chunk (copy batches into pooled 8 MiB chunks + seal)", build));

    let chunk_bytes: Vec<&[u8]> = sealed.iter().map(|c| c.bytes()).collect();
    let parse = throughput(budget, batch_content, || {
        for bytes in &chunk_bytes {
            black_box(Chunk::parse(black_box(bytes)).expect("valid"));
        }
    });
    rows.push(row("chunk parse (CRCs + directory + strict decode)", parse));
    rows
}

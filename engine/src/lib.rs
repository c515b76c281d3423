//! nova's storage engine.
//!
//! The engine owns everything between a validated request and durable bytes: the byte
//! formats (stored records, chunks, the binary framing), the domain rules (names,
//! options, timestamping, limits, errors), the metadata store, the control plane (buckets
//! and streams over it), and — in later modules — the shards, the journal and recovery.
//!
//! Architecture invariants: the engine never imports hyper or aws-sdk; it never maps an
//! error to an HTTP status (only `net` does); formats are little-endian `u32`/`u64`,
//! never `usize`.

pub mod aligned;
pub mod auditor;
pub mod auth;
pub mod batch;
pub mod chunk;
pub mod control;
pub mod error;
mod fixed;
pub mod framing;
#[cfg(test)]
mod golden;
pub mod ids;
pub mod journal;
pub mod latency;
mod le;
pub mod limits;
pub mod loan;
pub mod meta;
pub mod names;
pub mod node;
pub mod notify;
pub mod options;
pub mod pieces;
pub mod position;
pub mod record;
pub mod settled;
pub mod shard;
pub mod stream;
#[cfg(test)]
mod test_support;
pub mod throughput;
pub mod timestamp;
pub mod transit;
pub mod uploader;

pub use error::{Code, Error, Result};

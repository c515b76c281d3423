//! nova's storage engine.
//!
//! The engine owns everything between a validated request and durable bytes: the byte
//! formats (stored records, chunks, the binary framing), the domain rules (names,
//! options, timestamping, limits, errors), the metadata store, and — in later modules —
//! the shards, the journal and recovery.
//!
//! Architecture invariants: the engine never imports hyper or aws-sdk; it never maps an
//! error to an HTTP status (only `net` does); formats are little-endian `u32`/`u64`,
//! never `usize`.

pub mod aligned;
pub mod batch;
pub mod chunk;
pub mod error;
pub mod framing;
#[cfg(test)]
mod golden;
pub mod ids;
pub mod limits;
pub mod meta;
pub mod names;
pub mod options;
pub mod position;
pub mod record;
pub mod timestamp;

pub use error::{Code, Error, Result};

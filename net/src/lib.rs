//! nova's network layer: the HTTP server (hyper on glommio, one acceptor per shard), the
//! JSON and binary wire formats of `spec/http-api.md`, Server-Sent Events subscriptions,
//! `/health` and `/metrics`, and the `nova` command (server and CLI client).
//!
//! Architecture invariants: this is the only crate that maps an engine error to an HTTP
//! status (`error.rs`, nowhere else); it never sequences, stamps or stores a record (the
//! engine's leader does, reached through `engine::node::Client`); every request body is
//! bounded before it is held whole.

/// A line on the server's log (stderr), through [`log`]: never written by a shard
/// itself, and never panicking as `eprintln!` would when the log's reader went away.
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}
pub(crate) use log_line;

pub mod api;
mod append_json;
mod append_session;
mod arrived;
pub mod auth;
pub mod body;
pub mod cli;
pub mod client;
pub mod doctor;
pub mod error;
mod io;
pub mod log;
pub mod metrics;
mod response_memory;
pub mod serve;
pub mod server;
mod subscribe;
pub mod wire;

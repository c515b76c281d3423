//! Request counters for `/metrics` (Prometheus text format). Each shard writes only its
//! own slot, so the counters never contend across cores; a scrape, on any shard, sums
//! them and asks every shard for its engine counters ([`engine::node::Client::stats`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use engine::shard::ShardStats;

#[derive(Default)]
struct ShardCounters {
    /// (route, status) -> requests answered.
    requests: BTreeMap<(&'static str, u16), u64>,
    connections_open: u64,
    connections_accepted: u64,
    requests_in_flight: u64,
}

/// A shard counter of the engine: name, help, how to read it.
type EngineCounter = (&'static str, &'static str, fn(&ShardStats) -> u64);

/// Every shard's counters.
pub struct Metrics {
    shards: Vec<Mutex<ShardCounters>>,
}

impl Metrics {
    pub fn new(shards: usize) -> Self {
        Metrics { shards: (0..shards).map(|_| Mutex::default()).collect() }
    }

    fn with(&self, shard: usize, f: impl FnOnce(&mut ShardCounters)) {
        if let Some(Ok(mut counters)) = self.shards.get(shard).map(Mutex::lock) {
            f(&mut counters);
        }
    }

    /// A request arrived (answered later with [`Metrics::request`]).
    pub fn request_started(&self, shard: usize) {
        self.with(shard, |c| c.requests_in_flight += 1);
    }

    /// A request was answered.
    pub fn request(&self, shard: usize, route: &'static str, status: u16) {
        self.with(shard, |c| {
            c.requests_in_flight = c.requests_in_flight.saturating_sub(1);
            *c.requests.entry((route, status)).or_default() += 1;
        });
    }

    pub fn connection_opened(&self, shard: usize) {
        self.with(shard, |c| {
            c.connections_open += 1;
            c.connections_accepted += 1;
        });
    }

    pub fn connection_closed(&self, shard: usize) {
        self.with(shard, |c| c.connections_open = c.connections_open.saturating_sub(1));
    }

    /// The Prometheus text exposition.
    pub fn render(&self, stats: &[ShardStats]) -> String {
        let mut requests: BTreeMap<(&'static str, u16), u64> = BTreeMap::new();
        let mut out = String::new();
        out.push_str(
            "# HELP nova_http_requests_total HTTP requests answered, by route and status.\n",
        );
        out.push_str("# TYPE nova_http_requests_total counter\n");
        let mut connections = Vec::new();
        for (shard, counters) in self.shards.iter().enumerate() {
            if let Ok(counters) = counters.lock() {
                for (key, n) in &counters.requests {
                    *requests.entry(*key).or_default() += n;
                }
                connections.push((
                    shard,
                    counters.connections_open,
                    counters.connections_accepted,
                    counters.requests_in_flight,
                ));
            }
        }
        for ((route, status), n) in requests {
            let _ = writeln!(
                out,
                "nova_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP nova_http_connections_open HTTP connections open, per shard.\n");
        out.push_str("# TYPE nova_http_connections_open gauge\n");
        for (shard, open, _, _) in &connections {
            let _ = writeln!(out, "nova_http_connections_open{{shard=\"{shard}\"}} {open}");
        }
        out.push_str(
            "# HELP nova_http_connections_accepted_total HTTP connections accepted, per shard.\n",
        );
        out.push_str("# TYPE nova_http_connections_accepted_total counter\n");
        for (shard, _, accepted, _) in &connections {
            let _ = writeln!(
                out,
                "nova_http_connections_accepted_total{{shard=\"{shard}\"}} {accepted}"
            );
        }
        out.push_str(
            "# HELP nova_http_requests_in_flight HTTP requests being answered, per shard.\n",
        );
        out.push_str("# TYPE nova_http_requests_in_flight gauge\n");
        for (shard, _, _, in_flight) in &connections {
            let _ = writeln!(out, "nova_http_requests_in_flight{{shard=\"{shard}\"}} {in_flight}");
        }
        let engine_counters: [EngineCounter; 3] = [
            ("nova_shard_groups_total", "group commits written", |s| s.groups),
            ("nova_shard_chunks_total", "chunks made durable", |s| s.chunks),
            ("nova_shard_batches_acked_total", "append batches acknowledged", |s| s.batches_acked),
        ];
        for (name, help, value) in engine_counters {
            let _ = writeln!(out, "# HELP {name} {help}, per shard.\n# TYPE {name} counter");
            for (shard, stats) in stats.iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", value(stats));
            }
        }
        out
    }
}

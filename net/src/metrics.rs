//! Request counters for `/metrics` (Prometheus text format). Each shard writes only its
//! own slot, so the counters never contend across cores; a scrape, on any shard, sums
//! them and asks every shard for its engine counters ([`engine::node::Client::stats`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use engine::auditor::AuditorStats;
use engine::shard::ShardStats;
use engine::uploader::UploaderStats;

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
    pub fn render(
        &self,
        stats: &[ShardStats],
        uploader: &UploaderStats,
        auditor: &AuditorStats,
    ) -> String {
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
        let engine_counters: [(EngineCounter, &str); 10] = [
            (("nova_shard_groups_total", "journal group commits written", |s| s.groups), "counter"),
            (
                (
                    "nova_shard_journal_microseconds_total",
                    "time spent writing and fdatasyncing journal groups (over the groups: the mean group commit)",
                    |s| s.group_micros,
                ),
                "counter",
            ),
            (
                ("nova_shard_journal_bytes_total", "chunk bytes written to the journal", |s| {
                    s.group_bytes
                }),
                "counter",
            ),
            (("nova_shard_chunks_total", "chunks made durable", |s| s.chunks), "counter"),
            (
                ("nova_shard_batches_acked_total", "append batches acknowledged", |s| {
                    s.batches_acked
                }),
                "counter",
            ),
            (
                ("nova_shard_upload_jobs_total", "upload jobs applied (refs durable)", |s| {
                    s.upload_jobs
                }),
                "counter",
            ),
            (
                ("nova_shard_reads_waiting", "long polls waiting for records", |s| s.reads_waiting),
                "gauge",
            ),
            (
                ("nova_settled_objects_total", "settled objects written", |s| s.settled_objects),
                "counter",
            ),
            (
                ("nova_settle_failures_total", "settles that failed (retried)", |s| {
                    s.settle_failures
                }),
                "counter",
            ),
            (
                ("nova_retention_trims_total", "trims made by age retention", |s| {
                    s.retention_trims
                }),
                "counter",
            ),
        ];
        for ((name, help, value), kind) in engine_counters {
            let _ = writeln!(out, "# HELP {name} {help}, per shard.\n# TYPE {name} {kind}");
            for (shard, stats) in stats.iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", value(stats));
            }
        }
        let node: [(&str, &str, &str, u64); 11] = [
            ("nova_uploader_bundles_total", "counter", "transit bundles written", uploader.bundles),
            (
                "nova_uploader_bundle_bytes_total",
                "counter",
                "bytes of transit bundles written",
                uploader.bundle_bytes,
            ),
            (
                "nova_uploader_put_attempts_total",
                "counter",
                "object PUT attempts",
                uploader.put_attempts,
            ),
            (
                "nova_uploader_put_failures_total",
                "counter",
                "object PUT attempts that failed (retried)",
                uploader.put_failures,
            ),
            (
                "nova_uploader_queue_depth",
                "gauge",
                "upload requests queued for the uploader",
                uploader.queue_depth as u64,
            ),
            (
                "nova_uploader_put_latency_p50_microseconds",
                "gauge",
                "bundle upload latency, median, retries included",
                uploader.put_latency_us_p50,
            ),
            (
                "nova_uploader_put_latency_p99_microseconds",
                "gauge",
                "bundle upload latency, 99th percentile, retries included",
                uploader.put_latency_us_p99,
            ),
            (
                "nova_auditor_dead_objects",
                "gauge",
                "objects marked dead and not yet deleted",
                auditor.dead_objects,
            ),
            (
                "nova_auditor_backlog_seconds",
                "gauge",
                "age of the oldest dead object not yet deleted (the reclamation backlog)",
                auditor.oldest_dead_age_ms / 1000,
            ),
            (
                "nova_auditor_objects_deleted_total",
                "counter",
                "objects the auditor deleted",
                auditor.objects_deleted,
            ),
            ("nova_auditor_passes_total", "counter", "auditor passes", auditor.passes),
        ];
        for (name, kind, help, value) in node {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} {kind}\n{name} {value}");
        }
        out
    }
}

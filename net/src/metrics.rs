//! Request counters for `/metrics` (Prometheus text format). Each shard writes only its
//! own slot, so the counters never contend across cores; a scrape, on any shard, sums
//! them and asks every shard for its engine counters ([`engine::node::Client::stats`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use engine::auditor::AuditorStats;
use engine::latency::{BOUNDS_MICROS, Latency};
use engine::shard::{ClassStats, ShardStats};
use engine::uploader::UploaderStats;

#[derive(Default)]
struct ShardCounters {
    /// (route, status) -> requests answered.
    requests: BTreeMap<(&'static str, u16), u64>,
    /// status -> append session outcomes: batches acknowledged (200), and the errors
    /// that ended sessions.
    session_outcomes: BTreeMap<u16, u64>,
    connections_open: u64,
    connections_accepted: u64,
    connections_closed_idle: u64,
    connections_closed_stalled: u64,
    requests_in_flight: u64,
    log_lines_suppressed: u64,
    body_bytes_held: u64,
    response_bytes_held: u64,
}

/// A shard's HTTP counter: name, help, Prometheus type, how to read it.
type HttpCounter = (&'static str, &'static str, &'static str, fn(&ShardCounters) -> u64);

/// The HTTP counters `/metrics` gives per shard.
const HTTP_PER_SHARD: [HttpCounter; 8] = [
    ("nova_http_connections_open", "HTTP connections open", "gauge", |c| c.connections_open),
    ("nova_http_connections_accepted_total", "HTTP connections accepted", "counter", |c| {
        c.connections_accepted
    }),
    (
        "nova_http_connections_closed_idle_total",
        "HTTP connections closed after --http-idle-timeout-ms without a request",
        "counter",
        |c| c.connections_closed_idle,
    ),
    (
        "nova_http_connections_closed_stalled_total",
        "HTTP connections closed after their client took no byte of an answer for --http-idle-timeout-ms",
        "counter",
        |c| c.connections_closed_stalled,
    ),
    ("nova_http_requests_in_flight", "HTTP requests being answered", "gauge", |c| {
        c.requests_in_flight
    }),
    (
        "nova_http_body_bytes_held",
        "Request body bytes held (of --http-body-memory-bytes)",
        "gauge",
        |c| c.body_bytes_held,
    ),
    (
        "nova_http_response_bytes_held",
        "Response bytes made and not yet taken by their clients (of --http-response-memory-bytes)",
        "gauge",
        |c| c.response_bytes_held,
    ),
    (
        "nova_http_log_lines_suppressed_total",
        "Request log lines left out past --http-log-lines-per-second",
        "counter",
        |c| c.log_lines_suppressed,
    ),
];

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// By its client, an error, or a graceful stop.
    Ended,
    /// By the watchdog: no request answered for `--http-idle-timeout-ms`.
    Idle,
    /// By the watchdog: the client took no byte of an answer for that long.
    Stalled,
}

/// A shard counter of the engine: name, help, how to read it.
type EngineCounter = (&'static str, &'static str, fn(&ShardStats) -> u64);

/// A counter of one storage class on a shard: name, help, how to read it.
type ClassCounter = (&'static str, &'static str, fn(&ClassStats) -> u64);

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

    /// An append session acknowledged a batch (200), or ended with an error (its status).
    pub fn session_outcome(&self, shard: usize, status: u16) {
        self.with(shard, |c| *c.session_outcomes.entry(status).or_default() += 1);
    }

    pub fn connection_opened(&self, shard: usize) {
        self.with(shard, |c| {
            c.connections_open += 1;
            c.connections_accepted += 1;
        });
    }

    /// A request took `bytes` of its shard's body memory.
    pub fn body_bytes_held(&self, shard: usize, bytes: u64) {
        self.with(shard, |c| c.body_bytes_held += bytes);
    }

    /// A request gave back `bytes` of its shard's body memory.
    pub fn body_bytes_released(&self, shard: usize, bytes: u64) {
        if bytes > 0 {
            self.with(shard, |c| c.body_bytes_held = c.body_bytes_held.saturating_sub(bytes));
        }
    }

    /// A read or subscription page took `bytes` of its shard's response memory.
    pub fn response_bytes_held(&self, shard: usize, bytes: u64) {
        self.with(shard, |c| c.response_bytes_held += bytes);
    }

    /// A page's client took its last byte: `bytes` of response memory given back.
    pub fn response_bytes_released(&self, shard: usize, bytes: u64) {
        self.with(shard, |c| {
            c.response_bytes_held = c.response_bytes_held.saturating_sub(bytes);
        });
    }

    /// A request log line was left out (`--http-log-lines-per-second`).
    pub fn log_line_suppressed(&self, shard: usize) {
        self.with(shard, |c| c.log_lines_suppressed += 1);
    }

    /// A connection closed: by its client or an error, or by the server's idle watchdog.
    pub fn connection_closed(&self, shard: usize, closed: Closed) {
        self.with(shard, |c| {
            c.connections_open = c.connections_open.saturating_sub(1);
            match closed {
                Closed::Ended => {}
                Closed::Idle => c.connections_closed_idle += 1,
                Closed::Stalled => c.connections_closed_stalled += 1,
            }
        });
    }

    /// The Prometheus text exposition.
    pub fn render(
        &self,
        stats: &[ShardStats],
        uploader: &UploaderStats,
        auditor: &AuditorStats,
    ) -> String {
        let mut requests: BTreeMap<(&'static str, u16), u64> = BTreeMap::new();
        let mut session_outcomes: BTreeMap<u16, u64> = BTreeMap::new();
        let mut out = String::new();
        out.push_str(
            "# HELP nova_http_requests_total HTTP requests answered, by route and status.\n",
        );
        out.push_str("# TYPE nova_http_requests_total counter\n");
        // The per-shard gauges and counters, read under each shard's lock once.
        let mut per_shard = Vec::new();
        for (shard, counters) in self.shards.iter().enumerate() {
            if let Ok(counters) = counters.lock() {
                for (key, n) in &counters.requests {
                    *requests.entry(*key).or_default() += n;
                }
                for (status, n) in &counters.session_outcomes {
                    *session_outcomes.entry(*status).or_default() += n;
                }
                per_shard.push((shard, HTTP_PER_SHARD.map(|(_, _, _, read)| read(&counters))));
            }
        }
        for ((route, status), n) in requests {
            let _ = writeln!(
                out,
                "nova_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str(
            "# HELP nova_http_session_outcomes_total Append session outcomes by status: \
             batches acknowledged (200), and the errors that ended sessions.\n\
             # TYPE nova_http_session_outcomes_total counter\n",
        );
        for (status, n) in session_outcomes {
            let _ = writeln!(out, "nova_http_session_outcomes_total{{status=\"{status}\"}} {n}");
        }
        for (i, (name, help, kind, _)) in HTTP_PER_SHARD.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}, per shard.\n# TYPE {name} {kind}");
            for (shard, values) in &per_shard {
                let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", values[i]);
            }
        }
        out.push_str(
            "# HELP nova_log_lines_dropped_total Log lines dropped because the log was not \
             read fast enough (--log-queue-lines waiting).\n",
        );
        out.push_str("# TYPE nova_log_lines_dropped_total counter\n");
        let _ = writeln!(out, "nova_log_lines_dropped_total {}", crate::log::dropped());
        let engine_counters: [(EngineCounter, &str); 20] = [
            (
                ("nova_shard_groups_total", "journal group commits written", ShardStats::groups),
                "counter",
            ),
            (
                ("nova_shard_journal_bytes_total", "chunk bytes written to the journal", |s| {
                    s.journal_bytes
                }),
                "counter",
            ),
            (("nova_shard_chunks_total", "chunks made durable", |s| s.chunks), "counter"),
            (
                (
                    "nova_shard_batches_acked_total",
                    "append batches acknowledged",
                    ShardStats::batches_acked,
                ),
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
                ("nova_shard_cache_entries", "entries in the read cache's eviction order", |s| {
                    s.cache_entries
                }),
                "gauge",
            ),
            (
                (
                    "nova_shard_memory_bytes_held",
                    "bytes held of --shard-memory-bytes: unsettled and cached chunks",
                    |s| s.memory_held,
                ),
                "gauge",
            ),
            (
                (
                    "nova_shard_appends_waiting",
                    "appends sequenced and waiting to be durable",
                    |s| s.appends_waiting,
                ),
                "gauge",
            ),
            (
                (
                    "nova_shard_read_cache_hits_total",
                    "reads answered without loading a chunk",
                    |s| s.read_cache_hits,
                ),
                "counter",
            ),
            (
                (
                    "nova_shard_read_cache_misses_total",
                    "chunks read back from the journal or the object store to serve a read",
                    |s| s.read_cache_misses,
                ),
                "counter",
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
                (
                    "nova_settled_early_objects_total",
                    "settled objects cut short of the target because their chunks were about to leave the cache",
                    |s| s.settled_early,
                ),
                "counter",
            ),
            (
                (
                    "nova_settled_from_memory_chunks_total",
                    "chunks settled from the shard's cache, not read back",
                    |s| s.settled_from_memory,
                ),
                "counter",
            ),
            (
                (
                    "nova_settled_from_store_chunks_total",
                    "chunks read back from the object store to be settled",
                    |s| s.settled_from_store,
                ),
                "counter",
            ),
            (
                ("nova_retention_trims_total", "trims made by age retention", |s| {
                    s.retention_trims
                }),
                "counter",
            ),
            (
                (
                    "nova_settle_backlog_seconds",
                    "age of the shard's oldest history still in transit bundles (the settle backlog; up to --settle-age-ms is by design)",
                    |s| s.settle_backlog_ms / 1000,
                ),
                "gauge",
            ),
            (
                (
                    "nova_retention_backlog_seconds",
                    "how long the most overdue record was past its stream's age bound when the last retention pass began (the retention backlog)",
                    |s| s.retention_backlog_ms / 1000,
                ),
                "gauge",
            ),
            (
                (
                    "nova_shard_busy_microseconds_total",
                    "time the shard's reactor ran tasks or polled I/O rather than sleeping (its rate is the reactor's utilisation)",
                    |s| s.busy_micros,
                ),
                "counter",
            ),
        ];
        for ((name, help, value), kind) in engine_counters {
            let _ = writeln!(out, "# HELP {name} {help}, per shard.\n# TYPE {name} {kind}");
            for (shard, stats) in stats.iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", value(stats));
            }
        }
        let class_counters: [ClassCounter; 6] = [
            ("nova_appends_total", "append batches acknowledged", |c| c.appends),
            ("nova_records_in_total", "records appended", |c| c.records_in),
            ("nova_bytes_in_total", "content bytes appended", |c| c.bytes_in),
            ("nova_reads_total", "read pages answered", |c| c.reads),
            ("nova_records_out_total", "records read", |c| c.records_out),
            ("nova_bytes_out_total", "content bytes read", |c| c.bytes_out),
        ];
        for (name, help, value) in class_counters {
            let _ = writeln!(out, "# HELP {name} {help}, per shard and storage class.");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (shard, stats) in stats.iter().enumerate() {
                for (class, counts) in classes(stats) {
                    let _ = writeln!(
                        out,
                        "{name}{{shard=\"{shard}\",class=\"{class}\"}} {}",
                        value(counts)
                    );
                }
            }
        }
        histogram(
            &mut out,
            "nova_ack_latency_seconds",
            "time from an append reaching its shard to its acknowledgement, per shard and storage class",
            stats.iter().enumerate().flat_map(|(shard, stats)| {
                classes(stats).map(|(class, counts)| {
                    (format!("shard=\"{shard}\",class=\"{class}\""), &counts.ack_latency)
                })
            }),
        );
        histogram(
            &mut out,
            "nova_journal_group_seconds",
            "time a journal group commit took (its writes and its fdatasync), per shard",
            stats
                .iter()
                .enumerate()
                .map(|(shard, stats)| (format!("shard=\"{shard}\""), &stats.journal_groups)),
        );
        let node: [(&str, &str, &str, u64); 18] = [
            ("nova_uploader_bundles_total", "counter", "transit bundles written", uploader.bundles),
            (
                "nova_uploader_bundle_bytes_total",
                "counter",
                "bytes of transit bundles written",
                uploader.bundle_bytes,
            ),
            (
                "nova_uploader_settled_direct_total",
                "counter",
                "one stream's bundles written straight as its settled object",
                uploader.settled_direct,
            ),
            (
                "nova_uploader_settled_direct_bytes_total",
                "counter",
                "bytes of settled objects the uploader wrote straight",
                uploader.settled_direct_bytes,
            ),
            (
                "nova_uploader_direct_fallbacks_total",
                "counter",
                "settled objects the uploader could not write, sent as transit bundles instead",
                uploader.direct_fallbacks,
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
                "nova_uploader_puts_failing",
                "gauge",
                "object PUTs failing now, each retrying with backoff (the store is down or refusing)",
                uploader.puts_failing as u64,
            ),
            (
                "nova_uploader_failing_seconds",
                "gauge",
                "time since the first of the PUTs failing now failed; 0 while none is",
                uploader.failing_for.map_or(0, |failing| failing.as_secs()),
            ),
            (
                "nova_uploader_bytes_waiting",
                "gauge",
                "bytes of chunks the uploader holds for a bundle not cut yet (its size, its delay, or an upload slot)",
                uploader.bytes_waiting,
            ),
            (
                "nova_uploader_bytes_uploading",
                "gauge",
                "bytes of bundles and settled objects being uploaded now, retries included",
                uploader.bytes_uploading,
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

/// A shard's per-class stats, labelled.
fn classes(stats: &ShardStats) -> [(&'static str, &ClassStats); 2] {
    [("express", &stats.express), ("standard", &stats.standard)]
}

/// One Prometheus histogram: cumulative buckets in seconds, sum and count, per label set.
fn histogram<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (String, &'a Latency)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} histogram");
    for (labels, latency) in series {
        for (bound, count) in BOUNDS_MICROS.iter().zip(latency.cumulative()) {
            let le = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", latency.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", latency.sum_micros as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", latency.count);
    }
}

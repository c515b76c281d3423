//! Reports of an outcome: the summary table, the JSON report, the HdrHistogram interval
//! log, and a self-contained SVG (or HTML around it) with a latency percentile plot and a
//! throughput-over-time plot, drawn by hand.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use serde_json::{Value, json};

use crate::config::Load;
use crate::interrupt::signal_name;
use crate::run::Outcome;

/// The percentiles every report shows.
pub const PERCENTILES: [f64; 6] = [50.0, 90.0, 99.0, 99.9, 99.99, 100.0];

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn percentiles_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    let mut out = serde_json::Map::new();
    for p in PERCENTILES {
        let name = if p == 100.0 {
            "max".to_owned()
        } else {
            format!("p{}", p.to_string().replace('.', "_"))
        };
        out.insert(format!("{name}_ms"), json!(ms(h.value_at_percentile(p))));
    }
    out.insert("mean_ms".into(), json!(h.mean() / 1000.0));
    out.insert("count".into(), json!(h.len()));
    Value::Object(out)
}

/// `count` per second over `secs`; 0 over no time (a run interrupted in its warm-up).
fn per_second(count: u64, secs: f64) -> f64 {
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

fn load_text(o: &Outcome) -> String {
    match o.config.load {
        Load::Open { records_per_second } => format!("open loop, {records_per_second} records/s"),
        Load::Closed => format!("closed loop, {} in flight per connection", o.config.in_flight),
    }
}

pub fn to_json(o: &Outcome) -> Value {
    let c = &o.config;
    let secs = o.measured_seconds;
    let read_back = o.read_back.as_ref().map(|r| {
        json!({
            "records": r.records,
            "bytes": r.bytes,
            "seconds": r.seconds,
            "records_per_second": r.records as f64 / r.seconds.max(1e-9),
            "mib_per_second": r.bytes as f64 / r.seconds.max(1e-9) / 1048576.0,
            "complete": r.errors.is_empty(),
            "errors": r.errors,
        })
    });
    let verify = o.read_back.as_ref().filter(|_| c.verify).map(|r| {
        let streams: Vec<Value> = r
            .verdicts
            .iter()
            .map(|(address, v)| {
                json!({
                    "stream": address, "clean": v.clean(), "records_read": v.records_read,
                    "ok": v.ok, "lost": v.lost, "duplicates": v.duplicates,
                    "reordered": v.reordered, "foreign": v.foreign, "corrupt": v.corrupt,
                    "unacknowledged_present": v.unacknowledged_present,
                    "chain_matches": v.chain_matches, "examples": v.examples,
                    "complete": v.incomplete.is_none(), "incomplete": v.incomplete,
                })
            })
            .collect();
        json!({"ok": verify_outcome(o) == "ok", "outcome": verify_outcome(o), "streams": streams})
    });
    let interrupted = o
        .interrupted
        .map(|signal| json!({"signal": signal_name(signal), "measured_seconds": secs}));
    json!({
        "url": o.url,
        "interrupted": interrupted,
        "config": {
            "streams": c.streams, "record_bytes": c.record_bytes.describe(), "batch": c.batch,
            "load": load_text(o), "in_flight": c.in_flight, "connections": c.connections,
            "producers": c.producers, "consumers": c.consumers, "class": c.class.as_str(),
            "format": format!("{:?}", c.format).to_lowercase(),
            "duration_seconds": c.duration.as_secs_f64(), "warmup_seconds": c.warmup.as_secs_f64(),
        },
        "appends": {
            "scheduled_batches": o.scheduled_batches(),
            "sent_batches": o.sent_batches, "acked_batches": o.acked_batches,
            "failed_batches": o.failed_batches, "unanswered_batches": o.unanswered_batches,
            "unsent_batches": o.unsent_batches, "abandoned_batches": o.abandoned_batches,
            "measured_records": o.measured_records, "measured_bytes": o.measured_bytes,
            "records_per_second": per_second(o.measured_records, secs),
            "mib_per_second": per_second(o.measured_bytes, secs) / 1048576.0,
        },
        "ack_latency": percentiles_json(&o.ack),
        "end_to_end_latency": percentiles_json(&o.e2e),
        "delivered_records": o.delivered,
        "read_back": read_back,
        "verify": verify,
        "timeline": {
            "warmup_seconds": o.warmup_seconds,
            "acked_records_per_second": o.acked_per_second,
            "acked_bytes_per_second": o.acked_bytes_per_second,
            "delivered_records_per_second": o.delivered_per_second,
        },
        "errors": o.errors,
    })
}

/// Verification's result: `ok`, `failed` (something wrong in what was read) or
/// `incomplete` (some stream not read to its tail, nothing wrong in what was).
fn verify_outcome(o: &Outcome) -> &'static str {
    if o.verify_failed() {
        "failed"
    } else if o.verify_incomplete() {
        "incomplete"
    } else {
        "ok"
    }
}

pub fn summary(o: &Outcome) -> String {
    let c = &o.config;
    let secs = o.measured_seconds;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "loadgen against {}: {} streams, {} class, {} format, {}-record batches of {} bytes, {}",
        o.url,
        c.streams,
        c.class.as_str(),
        format!("{:?}", c.format).to_lowercase(),
        c.batch,
        c.record_bytes.describe(),
        load_text(o)
    );
    if let Some(signal) = o.interrupted {
        let _ = writeln!(
            s,
            "interrupted by {}: measured {secs:.1} s of {:.1} s{}",
            signal_name(signal),
            c.duration.as_secs_f64(),
            if c.catch_up || c.verify { ", no read-back" } else { "" }
        );
    }
    let scheduled = o.scheduled_batches().map_or_else(String::new, |n| format!("{n} scheduled: "));
    let _ = writeln!(
        s,
        "appends: {:.0} records/s, {:.1} MiB/s acknowledged over {secs:.1} s measured ({scheduled}{} batches sent, {} acked, {} failed, {} behind schedule at the end, {} abandoned with their failed stream)",
        per_second(o.measured_records, secs),
        per_second(o.measured_bytes, secs) / 1048576.0,
        o.sent_batches,
        o.acked_batches,
        o.failed_batches,
        o.unsent_batches,
        o.abandoned_batches,
    );
    if o.failed_batches > 0 {
        let _ = writeln!(
            s,
            "failed: {} answered with an error (refused, or cut off with their connection; not in the latencies), {} unanswered by --drain (in the latencies with their wait)",
            o.failed_batches - o.unanswered_batches,
            o.unanswered_batches,
        );
    }
    let _ = writeln!(
        s,
        "\n{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}",
        "latency (ms)", "p50", "p90", "p99", "p99.9", "p99.99", "max", "samples"
    );
    for (name, h) in [("append ack", &o.ack), ("end to end", &o.e2e)] {
        if h.is_empty() {
            continue;
        }
        let _ = write!(s, "{name:<22}");
        for p in PERCENTILES {
            let _ = write!(s, "{:>10.3}", ms(h.value_at_percentile(p)));
        }
        let _ = writeln!(s, "{:>12}", h.len());
    }
    if let Some(r) = &o.read_back {
        let _ = writeln!(
            s,
            "\nread back from the first record{}: {} records, {:.1} MiB in {:.2} s: {:.0} records/s, {:.1} MiB/s",
            if r.errors.is_empty() {
                String::new()
            } else {
                format!(" (incomplete: {} streams not read to their tails)", r.errors.len())
            },
            r.records,
            r.bytes as f64 / 1048576.0,
            r.seconds,
            r.records as f64 / r.seconds.max(1e-9),
            r.bytes as f64 / r.seconds.max(1e-9) / 1048576.0
        );
        // Verifying, each stream's VERIFY INCOMPLETE line says it.
        for e in r.errors.iter().filter(|_| !c.verify) {
            let _ = writeln!(s, "  read error: {e}");
        }
        if c.verify {
            for (address, v) in &r.verdicts {
                if v.failed() {
                    let _ = writeln!(
                        s,
                        "VERIFY FAILED {address}: {} lost, {} duplicated, {} reordered, {} foreign, {} corrupt, chain {}",
                        v.lost,
                        v.duplicates,
                        v.reordered,
                        v.foreign,
                        v.corrupt,
                        if v.chain_matches { "matches" } else { "differs" }
                    );
                    for e in &v.examples {
                        let _ = writeln!(s, "  {address}: {e}");
                    }
                }
                if let Some(why) = &v.incomplete {
                    let _ = writeln!(
                        s,
                        "VERIFY INCOMPLETE {address}: {} records read, then stopped before the tail: {why}",
                        v.records_read
                    );
                }
            }
            if o.verify_incomplete() {
                let read: u64 = r.verdicts.iter().map(|(_, v)| v.ok).sum();
                let unread = r.verdicts.iter().filter(|(_, v)| v.incomplete.is_some()).count();
                let _ = writeln!(
                    s,
                    "verify: incomplete, {unread} of {} streams not read to their tails (not verified); nothing wrong in what was read ({read} acknowledged records in place)",
                    r.verdicts.len()
                );
            } else if !o.verify_failed() {
                let read: u64 = r.verdicts.iter().map(|(_, v)| v.ok).sum();
                let _ = writeln!(
                    s,
                    "verify: ok, {read} acknowledged records read back once each, in order, {} streams' hash chains match",
                    r.verdicts.len()
                );
            }
        }
    }
    if !o.errors.is_empty() {
        let _ = writeln!(s, "\nerrors (first of each worker):");
        for e in &o.errors {
            let _ = writeln!(s, "  {e}");
        }
    }
    s
}

/// The HdrHistogram interval log: one interval per second, tagged `ack` and `e2e`, values
/// in microseconds.
pub fn hdr_log(o: &Outcome) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut serializer = V2DeflateSerializer::new();
    let start = UNIX_EPOCH + Duration::from_nanos(o.start_unix_ns);
    let mut log = IntervalLogWriterBuilder::new()
        .add_comment("nova loadgen: latency in microseconds; tags: ack (append acknowledgement), e2e (append to delivery)")
        .with_start_time(start)
        .with_base_time(start)
        .with_max_value_divisor(1000.0)
        .begin_log_with(&mut out, &mut serializer)
        .map_err(|e| format!("hdr log: {e}"))?;
    for (tag, intervals) in [("ack", &o.ack_intervals), ("e2e", &o.e2e_intervals)] {
        for (second, h) in intervals.iter().enumerate() {
            if h.is_empty() {
                continue;
            }
            log.write_histogram(
                h,
                Duration::from_secs(second as u64),
                Duration::from_secs(1),
                Tag::new(tag),
            )
            .map_err(|e| format!("hdr log: {e}"))?;
        }
    }
    Ok(out)
}

const W: f64 = 760.0;
const H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 45.0;

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Latency by percentile, x = -log10(1 - q) (so 90, 99, 99.9 ... are evenly spaced),
/// y logarithmic in ms.
fn percentile_plot(o: &Outcome, y0: f64, s: &mut String) {
    let series: Vec<(&str, &str, &Histogram<u64>)> =
        [("append ack", "#1f77b4", &o.ack), ("end to end", "#d62728", &o.e2e)]
            .into_iter()
            .filter(|(_, _, h)| !h.is_empty())
            .collect();
    let nines = 5.0;
    let points = 200;
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for (_, _, h) in &series {
        lo = lo.min(ms(h.min().max(1)));
        hi = hi.max(ms(h.max().max(1)));
    }
    if series.is_empty() {
        (lo, hi) = (0.001, 1.0);
    }
    let (llo, lhi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let px = |x: f64| LEFT + x / nines * (W - LEFT - RIGHT);
    let py = |v: f64| y0 + TOP + (1.0 - (v.log10() - llo) / (lhi - llo)) * (H - TOP - BOTTOM);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold">Latency by percentile (ms, log scale)</text>"#,
        y0 + 18.0
    );
    for k in 0..=5 {
        let x = px(f64::from(k));
        let label = ["0", "90", "99", "99.9", "99.99", "99.999"][k as usize];
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" font-size="11" text-anchor="middle">{label}</text>"##,
            y0 + TOP,
            y0 + H - BOTTOM,
            y0 + H - BOTTOM + 14.0
        );
    }
    let mut e = llo;
    while e <= lhi {
        let y = py(10f64.powf(e));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 4.0,
            y + 4.0,
            10f64.powf(e)
        );
        e += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">percentile</text>"#,
        (W + LEFT) / 2.0,
        y0 + H - 8.0
    );
    for (i, (name, color, h)) in series.iter().enumerate() {
        let mut path = String::new();
        for k in 0..=points {
            let x = nines * f64::from(k) / f64::from(points);
            let q = 1.0 - 10f64.powf(-x);
            let v = ms(h.value_at_quantile(q).max(1));
            let _ = write!(path, "{}{:.1},{:.1} ", if k == 0 { "M" } else { "L" }, px(x), py(v));
        }
        let _ = writeln!(s, r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>"#);
        let ly = y0 + TOP + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}" font-size="12">{} (p99 {:.3} ms)</text>"#,
            LEFT + 10.0,
            ly - 4.0,
            LEFT + 28.0,
            ly,
            esc(name),
            ms(h.value_at_percentile(99.0))
        );
    }
}

/// Acknowledged and delivered records per second over the run; the warm-up shaded.
fn throughput_plot(o: &Outcome, y0: f64, s: &mut String) {
    let n = o.acked_per_second.len().max(1);
    let hi =
        o.acked_per_second.iter().chain(&o.delivered_per_second).copied().max().unwrap_or(0).max(1)
            as f64
            * 1.1;
    let px = |t: f64| LEFT + t / n as f64 * (W - LEFT - RIGHT);
    let py = |v: f64| y0 + TOP + (1.0 - v / hi) * (H - TOP - BOTTOM);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold">Throughput over time (records/s)</text>"#,
        y0 + 18.0
    );
    let warm = o.warmup_seconds.min(n) as f64;
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{}" width="{}" height="{}" fill="#f3f3f3"/>"##,
        y0 + TOP,
        px(warm) - LEFT,
        H - TOP - BOTTOM
    );
    for k in 0..=4 {
        let v = hi * f64::from(k) / 4.0;
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{:.0}</text>"##,
            W - RIGHT,
            LEFT - 4.0,
            y + 4.0,
            v
        );
    }
    let step = (n / 10).max(1);
    for t in (0..=n).step_by(step) {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{t}</text>"#,
            px(t as f64),
            y0 + H - BOTTOM + 14.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">seconds since start (shaded: warm-up)</text>"#,
        (W + LEFT) / 2.0,
        y0 + H - 8.0
    );
    for (i, (name, color, values)) in [
        ("acknowledged", "#1f77b4", &o.acked_per_second),
        ("delivered", "#d62728", &o.delivered_per_second),
    ]
    .into_iter()
    .enumerate()
    {
        if values.iter().all(|v| *v == 0) {
            continue;
        }
        let mut path = String::new();
        for (t, v) in values.iter().enumerate() {
            let _ = write!(
                path,
                "{}{:.1},{:.1} ",
                if t == 0 { "M" } else { "L" },
                px(t as f64 + 0.5),
                py(*v as f64)
            );
        }
        let _ = writeln!(s, r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>"#);
        let ly = y0 + TOP + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}" font-size="12">{name}</text>"#,
            W - RIGHT - 130.0,
            ly - 4.0,
            W - RIGHT - 112.0,
            ly
        );
    }
}

pub fn svg(o: &Outcome) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" viewBox="0 0 {W} {}" font-family="sans-serif">"#,
        2.0 * H + 30.0,
        2.0 * H + 30.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="12">{}</text>"#,
        esc(summary(o).lines().next().unwrap_or(""))
    );
    percentile_plot(o, 20.0, &mut s);
    throughput_plot(o, 20.0 + H + 10.0, &mut s);
    s.push_str("</svg>\n");
    s
}

pub fn html(o: &Outcome) -> String {
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>nova loadgen report</title></head>\n<body style=\"font-family: sans-serif\">\n<h1>nova loadgen</h1>\n<pre>{}</pre>\n{}\n</body></html>\n",
        esc(&summary(o)),
        svg(o)
    )
}

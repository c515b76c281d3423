//! The command line: every flag, its default, and the checks that refuse a run that could
//! not mean what it says. Parsed by hand (no argument-parser dependency), like `nova`.

use std::path::PathBuf;
use std::time::Duration;

use engine::options::StorageClass;
use net::client::Format;

pub const USAGE: &str = "\
loadgen: drive a nova server with producers and consumers and measure it

usage: loadgen (--url URL | --spawn [--nova-bin PATH]) [options]

target:
  --url URL                 a running server, e.g. http://127.0.0.1:8080
                            (with auth on, its token comes from $NOVA_TOKEN)
  --spawn                   start `nova serve` on a temporary directory and port 0
  --nova-bin PATH           the nova binary for --spawn (default: next to loadgen, else PATH)
  --server-arg ARG          pass ARG to the spawned `nova serve` (repeatable), e.g. --server-arg=--shards=2

workload:
  --bucket NAME             bucket of the streams (default loadgen; created if missing)
  --stream-prefix P         streams are P-0, P-1, ... (default run-<unix ms>)
  --streams N               streams written (default 1)
  --record-bytes N          record body size in bytes, at least 24 (default 1024)
  --record-bytes-dist uniform:MIN:MAX   body sizes drawn uniformly from MIN..=MAX
  --batch N                 records per append (default 16)
  --rate R                  open loop: R records/s in total on a fixed schedule (default 10000)
  --closed-loop             closed loop instead: each connection keeps --in-flight appends open
  --in-flight N             unacknowledged appends per connection (default 256)
  --duration D              measured time (default 10s; 500ms, 10s, 2m)
  --warmup D                time before measuring (default 2s)
  --drain D                 after sending stops, how long to wait for the acknowledgements in
                            flight and for followers to reach the final tails; also the most
                            any read of a follower or of a call outside the load waits
                            (default 30s)
  --class standard|express  storage class of the streams (default standard)
  --format binary|json      append and read encoding (default binary)
  --connections N           append connections per stream (default 1); a nova shard serves
                            1024 connections at once by default, so more wait unaccepted
  --producers N             producer threads; streams are split between them (default 1)
  --consumers N             subscribers following the tail, one stream each (default 0)
  --catch-up                after the run, read every stream from its first record and
                            report the read throughput
  --verify                  after the run, read everything back and check every acknowledged
                            record is there once, in order (hash chain per stream); exit 2 if not
  --seed N                  seed of the record-size draw (default 1)

output:
  --json PATH               JSON report
  --hdr-log PATH            HdrHistogram interval log (tags ack and e2e, microseconds)
  --report PATH             self-contained report, .svg or .html
  --no-progress             no live progress line (it is only shown on a terminal anyway)

exit status: 0 every append and read was served (and verified, with --verify); 1 could not
run; 2 verification failed; 3 some appends or reads failed (counted in the report);
4 verification incomplete (some stream could not be read to its tail; nothing wrong found
in what was read); 130 / 143 interrupted by SIGINT / SIGTERM
";

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Url(String),
    Spawn { nova_bin: Option<PathBuf>, server_args: Vec<String> },
}

/// How big a record body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordBytes {
    Fixed(usize),
    Uniform { min: usize, max: usize },
}

impl RecordBytes {
    pub fn max(&self) -> usize {
        match *self {
            RecordBytes::Fixed(n) => n,
            RecordBytes::Uniform { max, .. } => max,
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            RecordBytes::Fixed(n) => n.to_string(),
            RecordBytes::Uniform { min, max } => format!("uniform:{min}:{max}"),
        }
    }
}

/// The load: open loop at a total rate, or closed loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// Records per second, over every stream.
    Open {
        records_per_second: f64,
    },
    Closed,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub bucket: String,
    pub stream_prefix: String,
    pub streams: usize,
    pub record_bytes: RecordBytes,
    pub batch: usize,
    pub load: Load,
    pub in_flight: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// After sending stops, how long acknowledgements in flight and followers reaching the
    /// final tails are waited for.
    pub drain: Duration,
    pub class: StorageClass,
    pub format: Format,
    pub connections: usize,
    pub producers: usize,
    pub consumers: usize,
    pub catch_up: bool,
    pub verify: bool,
    pub seed: u64,
    pub json: Option<PathBuf>,
    pub hdr_log: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub progress: bool,
}

/// The smallest body: the payload header (payload.rs).
pub const RECORD_BYTES_MIN: usize = crate::payload::HEADER_LEN;
/// The largest body loadgen makes (the server's default record limit).
pub const RECORD_BYTES_MAX: usize = 1 << 20;

impl Config {
    /// Parses the arguments after the program name. `Ok(None)` asks for the usage text.
    pub fn parse(args: &[String]) -> Result<Option<Config>, String> {
        let mut url = None;
        let mut spawn = false;
        let mut nova_bin = None;
        let mut server_args = Vec::new();
        let mut c = Config {
            target: Target::Url(String::new()),
            bucket: "loadgen".into(),
            stream_prefix: String::new(),
            streams: 1,
            record_bytes: RecordBytes::Fixed(1024),
            batch: 16,
            load: Load::Open { records_per_second: 10_000.0 },
            in_flight: 256,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            drain: Duration::from_secs(30),
            class: StorageClass::Standard,
            format: Format::Binary,
            connections: 1,
            producers: 1,
            consumers: 0,
            catch_up: false,
            verify: false,
            seed: 1,
            json: None,
            hdr_log: None,
            report: None,
            progress: true,
        };
        let mut closed = false;
        let mut rate = None;
        let mut i = 0;
        while i < args.len() {
            // Both `--flag value` and `--flag=value`.
            let (flag, inline) = match args[i].split_once('=') {
                Some((f, v)) if args[i].starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (args[i].clone(), None),
            };
            i += 1;
            let mut value = || -> Result<String, String> {
                if let Some(v) = inline.clone() {
                    return Ok(v);
                }
                let v = args.get(i).cloned().ok_or_else(|| format!("{flag} needs a value"))?;
                i += 1;
                Ok(v)
            };
            const SWITCHES: [&str; 5] =
                ["--spawn", "--closed-loop", "--catch-up", "--verify", "--no-progress"];
            if SWITCHES.contains(&flag.as_str()) && inline.is_some() {
                return Err(format!("{flag} takes no value (leave it out to turn it off)"));
            }
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--url" => url = Some(value()?),
                "--spawn" => spawn = true,
                "--nova-bin" => nova_bin = Some(PathBuf::from(value()?)),
                "--server-arg" => server_args.push(value()?),
                "--bucket" => c.bucket = value()?,
                "--stream-prefix" => c.stream_prefix = value()?,
                "--streams" => c.streams = count(&flag, &value()?, 1, 100_000)?,
                "--record-bytes" => {
                    c.record_bytes = RecordBytes::Fixed(record_bytes(&flag, &value()?)?)
                }
                "--record-bytes-dist" => c.record_bytes = distribution(&value()?)?,
                "--batch" => c.batch = count(&flag, &value()?, 1, 100_000)?,
                "--rate" => {
                    let v = value()?;
                    let r: f64 = v.parse().map_err(|_| format!("--rate {v:?} is not a number"))?;
                    if !(r.is_finite() && r > 0.0) {
                        return Err(format!("--rate {v} must be above 0 records/s"));
                    }
                    rate = Some(r);
                }
                "--closed-loop" => closed = true,
                "--in-flight" => c.in_flight = count(&flag, &value()?, 1, 65_536)?,
                "--duration" => c.duration = duration(&flag, &value()?)?,
                "--warmup" => c.warmup = duration(&flag, &value()?)?,
                "--drain" => c.drain = duration(&flag, &value()?)?,
                "--class" => {
                    c.class = StorageClass::parse(&value()?).map_err(|e| format!("--class: {e}"))?
                }
                "--format" => {
                    c.format = match value()?.as_str() {
                        "binary" => Format::Binary,
                        "json" => Format::Json,
                        other => return Err(format!("--format {other:?}: binary or json")),
                    }
                }
                "--connections" => c.connections = count(&flag, &value()?, 1, 1024)?,
                "--producers" => c.producers = count(&flag, &value()?, 1, 4096)?,
                "--consumers" => c.consumers = count(&flag, &value()?, 0, 100_000)?,
                "--catch-up" => c.catch_up = true,
                "--verify" => c.verify = true,
                "--seed" => {
                    let v = value()?;
                    c.seed = v.parse().map_err(|_| format!("--seed {v:?} is not a number"))?;
                }
                "--json" => c.json = Some(PathBuf::from(value()?)),
                "--hdr-log" => c.hdr_log = Some(PathBuf::from(value()?)),
                "--report" => {
                    let path = PathBuf::from(value()?);
                    match path.extension().and_then(|e| e.to_str()) {
                        Some("svg" | "html") => c.report = Some(path),
                        _ => {
                            return Err(format!(
                                "--report {}: name a .svg or .html file",
                                path.display()
                            ));
                        }
                    }
                }
                "--no-progress" => c.progress = false,
                other => return Err(format!("unknown argument {other:?} (see --help)")),
            }
        }
        c.target = match (url, spawn) {
            (Some(_), true) => return Err("--url and --spawn: choose one".into()),
            (Some(url), false) => Target::Url(url),
            (None, true) => Target::Spawn { nova_bin, server_args },
            (None, false) => {
                return Err("name a server with --url URL, or start one with --spawn".into());
            }
        };
        c.load = match (closed, rate) {
            (true, Some(_)) => return Err("--rate and --closed-loop: choose one".into()),
            (true, None) => Load::Closed,
            (false, Some(r)) => Load::Open { records_per_second: r },
            (false, None) => c.load,
        };
        if c.drain.is_zero() {
            return Err("--drain must be above 0".into());
        }
        if c.duration.is_zero() {
            return Err("--duration must be above 0".into());
        }
        // More producers than streams would leave threads with nothing to write.
        c.producers = c.producers.min(c.streams);
        if c.stream_prefix.is_empty() {
            c.stream_prefix = format!("run-{}", crate::unix_now_ns() / 1_000_000);
        }
        Ok(Some(c))
    }

    /// The connections the run opens: one per stream and `--connections`, and one per
    /// consumer.
    pub fn connections_total(&self) -> usize {
        self.streams * self.connections + self.consumers
    }

    /// A warning when the run opens more connections than a nova shard serves at once by
    /// default (`--http-connections-max`): the server leaves the rest unaccepted in the
    /// kernel's backlog, and a producer waiting on one of them stalls with it.
    pub fn connections_warning(&self) -> Option<String> {
        let total = self.connections_total();
        let limit = tuning::HTTP_CONNECTIONS_MAX.default;
        (total as u64 > limit).then(|| {
            format!(
                "{total} connections (--streams {} x --connections {} + --consumers {}) \
                 is more than one nova shard serves by default (--http-connections-max \
                 {limit}); unless the server has the shards or the limit for them, the rest \
                 wait unaccepted and their producers stall",
                self.streams, self.connections, self.consumers
            )
        })
    }
}

fn count(flag: &str, text: &str, min: usize, max: usize) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|_| format!("{flag} {text:?} is not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{flag} {n} is outside {min}..={max}"));
    }
    Ok(n)
}

fn record_bytes(flag: &str, text: &str) -> Result<usize, String> {
    count(flag, text, RECORD_BYTES_MIN, RECORD_BYTES_MAX).map_err(|e| {
        format!("{e} (a body holds a {RECORD_BYTES_MIN}-byte header: stream, index, send time)")
    })
}

fn distribution(text: &str) -> Result<RecordBytes, String> {
    let flag = "--record-bytes-dist";
    let mut parts = text.split(':');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("uniform"), Some(min), Some(max), None) => {
            let min = record_bytes(flag, min)?;
            let max = record_bytes(flag, max)?;
            if min > max {
                return Err(format!("{flag} {text}: MIN is above MAX"));
            }
            Ok(RecordBytes::Uniform { min, max })
        }
        _ => Err(format!("{flag} {text:?}: write uniform:MIN:MAX")),
    }
}

/// A duration with its unit, read as `nova` reads one (`net::cli::duration_ms`): `250ms`,
/// `10s`, `2m`; a bare number is refused. `flag` is the flag as written, `--duration`.
pub fn duration(flag: &str, text: &str) -> Result<Duration, String> {
    net::cli::duration_ms(flag.trim_start_matches("--"), text).map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Config>, String> {
        Config::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn warns_of_more_connections_than_a_shard_serves_by_default() {
        let run = |args: &[&str]| parse(args).expect("valid").expect("a run");
        let within = run(&["--spawn", "--streams", "16", "--connections", "64"]);
        assert_eq!(within.connections_total(), 1024);
        assert_eq!(within.connections_warning(), None);
        let beyond = run(&["--spawn", "--streams", "100", "--connections", "64"]);
        let warning = beyond.connections_warning().expect("6400 connections");
        assert!(warning.starts_with("6400 connections (--streams 100 x --connections 64"));
        assert!(warning.contains("--http-connections-max 1024"), "{warning}");
    }

    #[test]
    fn parses_flags_in_both_spellings() {
        let c = parse(&[
            "--spawn",
            "--streams=4",
            "--batch",
            "8",
            "--rate",
            "500",
            "--duration=1500ms",
            "--drain",
            "2s",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.drain, Duration::from_secs(2));
        assert_eq!(parse(&["--spawn"]).unwrap().unwrap().drain, Duration::from_secs(30));
        assert_eq!(c.streams, 4);
        assert_eq!(c.batch, 8);
        assert_eq!(c.load, Load::Open { records_per_second: 500.0 });
        assert_eq!(c.duration, Duration::from_millis(1500));
        assert!(matches!(c.target, Target::Spawn { .. }));
    }

    #[test]
    fn refuses_what_cannot_mean_anything() {
        assert!(parse(&["--streams", "2"]).is_err(), "no target");
        assert!(parse(&["--spawn", "--drain", "0s"]).unwrap_err().contains("--drain"));
        assert!(parse(&["--spawn", "--url", "http://x"]).is_err());
        assert!(parse(&["--spawn", "--rate", "5", "--closed-loop"]).is_err());
        assert!(parse(&["--spawn", "--record-bytes", "8"]).is_err(), "below the header");
        assert!(parse(&["--spawn", "--record-bytes-dist", "uniform:100:50"]).is_err());
        assert!(parse(&["--spawn", "--report", "x.png"]).is_err());
        assert!(parse(&["--spawn", "--bogus"]).is_err());
        for switch in ["--verify=false", "--closed-loop=no", "--catch-up=0", "--no-progress=1"] {
            let refused = parse(&["--spawn", switch]).expect_err(switch);
            assert!(refused.contains("takes no value"), "{switch}: {refused}");
        }
        assert!(parse(&["--spawn=yes"]).is_err());
        assert!(parse(&["--help"]).unwrap().is_none());
    }

    #[test]
    fn durations() {
        assert_eq!(duration("--duration", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(duration("--warmup", "300ms").unwrap(), Duration::from_millis(300));
        let bare = duration("--duration", "3").unwrap_err();
        assert!(bare.contains("--duration") && bare.contains("needs a unit"), "{bare}");
        assert!(duration("--duration", "fast").is_err());
    }
}

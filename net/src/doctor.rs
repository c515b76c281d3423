//! `nova doctor`: inspects the host nova would run on and says what it found and what to
//! change: cores and the shard count nova picks, memory against the shards' budgets, the
//! kernel, io_uring, RLIMIT_MEMLOCK, the data directory (writable, O_DIRECT, poll queues,
//! write cache, fdatasync latency, free space) and, with the `--s3-*` flags of `nova serve`, a round
//! trip to the object store. `docs/doctor.md` describes every check.
//!
//! It only reads the host, except for a temporary file in the data directory (and the
//! directories it had to create for it) and one object under `nova-doctor/`, all removed
//! before it returns. It never starts a node and never touches a node's files.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::node::ObjectStoreConfig;
use s3::ObjectStore as _;
use serde_json::{Value, json};

/// How healthy one finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// nova runs, but worse than it could, or a check could not be made.
    Warn,
    /// nova cannot run (or cannot keep its promises) as things are.
    Fail,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug)]
pub struct Finding {
    /// The check's name, e.g. `memlock`.
    pub check: &'static str,
    pub status: Status,
    /// What was found, one line.
    pub found: String,
    /// What to do about it, one line naming the knob where there is one.
    pub recommendation: Option<String>,
    /// The measured numbers, for `--json`.
    pub details: Value,
}

fn finding(check: &'static str, status: Status, found: String) -> Finding {
    Finding { check, status, found, recommendation: None, details: Value::Null }
}

impl Finding {
    fn recommend(mut self, text: impl Into<String>) -> Self {
        self.recommendation = Some(text.into());
        self
    }

    fn details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
}

/// glommio refuses to start below this RLIMIT_MEMLOCK (platform.md).
const MEMLOCK_BYTES_MIN: u64 = 512 << 10;
/// glommio registers a 10 MiB buffer area per executor; below this it logs a warning and
/// falls back to unregistered buffers.
const MEMLOCK_BYTES_COMFORTABLE: u64 = 16 << 20;
/// The block size of the journal's O_DIRECT writes.
const BLOCK_BYTES: usize = 4096;
/// glommio needs io_uring features of Linux 5.8.
const KERNEL_MIN: (u32, u32) = (5, 8);

/// The checks' settings, from the command line.
struct Options {
    data_dir: PathBuf,
    json: bool,
    sync_writes: usize,
    /// The `--s3-*` flags, as `nova serve` reads them.
    s3_flags: Vec<(String, String)>,
    /// The node `nova serve` would start here: the engine knobs from their environment
    /// variables, else their defaults (shards, memory budget, journal sizes).
    node: engine::node::NodeConfig,
    /// What each shard's HTTP server may hold at most, from the same place: request
    /// bodies (`--http-body-memory-bytes`) and responses (`--http-response-memory-bytes`).
    http_memory: HttpMemory,
}

#[derive(Clone, Copy)]
struct HttpMemory {
    bodies: u64,
    responses: u64,
}

/// `nova doctor --help`.
pub fn help() -> String {
    let mut text = String::from(
        "nova doctor: inspect this host for nova and recommend settings\n\n\
         usage: nova doctor [--data-dir DIR] [--json] [--sync-writes N] [--s3-bucket NAME ...]\n\n\
         example: nova doctor --data-dir /var/lib/nova\n\
         example: nova doctor --json --s3-bucket nova --s3-endpoint http://127.0.0.1:9000 --s3-path-style\n\n\
         Checks cores, memory, the kernel, io_uring, RLIMIT_MEMLOCK, and on the data directory\n\
         (created if missing, default from NOVA_DATA_DIR, else ./nova-data): a temporary file\n\
         written with O_DIRECT, the block device's poll queues and write cache, the latency of 4 KiB writes\n\
         each followed by fdatasync, and free space. With --s3-bucket it PUTs, GETs and\n\
         DELETEs a small object under nova-doctor/ in the bucket.\n\n\
         Each finding is ok, warn or fail; the exit status is 1 when any check fails, 2 on\n\
         a usage mistake, else 0. See docs/doctor.md and docs/tuning.md.\n\n\
         \x20 --data-dir DIR: the directory `nova serve --data-dir` would use\n\
         \x20 --journal-dir DIR: the directory `nova serve --journal-dir` would use: the disk\n\
         \x20   checks (O_DIRECT, poll queues, write cache, fdatasync, space) run there instead\n\
         \x20 --json: one JSON object instead of text\n\
         \x20 --sync-writes N: 4 KiB writes timed by the fdatasync check (default 200, 10..=100000)\n",
    );
    for (flag, help) in crate::serve::S3_FLAGS {
        let _ = writeln!(text, "  --{flag}: {help}");
    }
    text
}

/// Runs `nova doctor ARGS`; the exit status.
pub fn main(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", help());
        return 0;
    }
    let options = match parse(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("nova doctor: {message}\n\n{}", help());
            return 2;
        }
    };
    let store = match crate::serve::object_store(&options.s3_flags) {
        Ok(store) => store,
        Err(message) => {
            eprintln!("nova doctor: {message}");
            return 2;
        }
    };
    let findings = run(&options, store.as_ref());
    let report = if options.json {
        format!("{}\n", report_json(&options, &findings))
    } else {
        report_text(&options, &findings)
    };
    // A closed pipe (`nova doctor | head`) is not the doctor's failure.
    let _ = std::io::stdout().write_all(report.as_bytes());
    if findings.iter().any(|f| f.status == Status::Fail) { 1 } else { 0 }
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut data_dir = None;
    let mut journal_dir = None;
    let mut json = false;
    let mut sync_writes = 200;
    let mut s3_flags = Vec::new();
    let mut rest = args.iter().peekable();
    while let Some(arg) = rest.next() {
        let Some(name) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let (name, inline) = match name.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (name, None),
        };
        if name == "json" {
            json = true;
            continue;
        }
        let known = ["data-dir", "journal-dir", "sync-writes"].contains(&name)
            || crate::serve::S3_FLAGS.iter().any(|(flag, _)| *flag == name);
        if !known {
            return Err(format!("unknown flag --{name}"));
        }
        let value = match inline {
            Some(value) => value,
            // `--s3-path-style` alone means true, as in `nova serve`.
            None if name == "s3-path-style"
                && rest.peek().is_none_or(|next| next.starts_with("--")) =>
            {
                "true".to_owned()
            }
            None => rest.next().ok_or_else(|| format!("--{name} needs a value"))?.clone(),
        };
        match name {
            "data-dir" => data_dir = Some(value),
            "journal-dir" => journal_dir = Some(PathBuf::from(value)),
            "sync-writes" => {
                sync_writes =
                    value.parse::<usize>().ok().filter(|n| (10..=100_000).contains(n)).ok_or_else(
                        || format!("--sync-writes must be 10..=100000, not {value:?}"),
                    )?;
            }
            s3 => s3_flags.push((s3.to_owned(), value)),
        }
    }
    let data_dir = PathBuf::from(tuning::DATA_DIR.resolve(data_dir.as_deref()));
    let mut node = engine::node::NodeConfig::new(&data_dir);
    node.apply_knobs(&mut |knob| knob.resolve(None).map_err(|e| e.message))?;
    node.journal_dir = journal_dir.or_else(|| {
        let from_env = tuning::JOURNAL_DIR.resolve(None);
        (!from_env.is_empty()).then(|| PathBuf::from(from_env))
    });
    let http = |knob: tuning::Knob| knob.resolve(None).map_err(|e| e.message);
    let http_memory = HttpMemory {
        bodies: http(tuning::HTTP_BODY_MEMORY_BYTES)?,
        responses: http(tuning::HTTP_RESPONSE_MEMORY_BYTES)?,
    };
    Ok(Options { data_dir, json, sync_writes, s3_flags, node, http_memory })
}

/// Every check, in the order they are printed.
fn run(options: &Options, store: Option<&ObjectStoreConfig>) -> Vec<Finding> {
    let node = &options.node;
    let memory = memory(node, options.http_memory);
    let mut findings = vec![cores(node.shards), memory, kernel(), io_uring(), memlock()];
    findings.extend(data_dir_checks(options));
    findings.push(object_store(store, &options.data_dir));
    findings
}

fn report_json(options: &Options, findings: &[Finding]) -> Value {
    let count = |status| findings.iter().filter(|f| f.status == status).count();
    json!({
        "data_dir": options.data_dir.display().to_string(),
        "findings": findings.iter().map(|f| json!({
            "check": f.check,
            "status": f.status.name(),
            "found": f.found,
            "recommendation": f.recommendation,
            "details": f.details,
        })).collect::<Vec<_>>(),
        "ok": count(Status::Ok),
        "warn": count(Status::Warn),
        "fail": count(Status::Fail),
    })
}

fn report_text(options: &Options, findings: &[Finding]) -> String {
    let mut text = format!("nova doctor: data directory {}\n\n", options.data_dir.display());
    for f in findings {
        let _ = writeln!(text, "{:<5} {:<13} {}", f.status.name(), f.check, f.found);
        if let Some(recommendation) = &f.recommendation {
            let _ = writeln!(text, "{:<19} -> {recommendation}", "");
        }
    }
    let count = |status| findings.iter().filter(|f| f.status == status).count();
    let _ = writeln!(
        text,
        "\n{} ok, {} warn, {} fail",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail)
    );
    text
}

fn cores(shards: usize) -> Finding {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let found = format!(
        "{cores} usable cores: nova picks {shards} shard{} (--shards 0: every core but the uploader's)",
        if shards == 1 { "" } else { "s" }
    );
    let details = json!({ "cores": cores, "shards": shards });
    if cores < 2 {
        finding("cores", Status::Warn, found)
            .recommend(
                "one core: shards, the uploader and the metadata thread share it, so latency \
                 suffers under load; give nova at least 2 cores",
            )
            .details(details)
    } else {
        finding("cores", Status::Ok, found).details(details)
    }
}

/// `/proc/meminfo`'s value for `key`, in bytes.
fn meminfo(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?;
    let kib: u64 = line[key.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

fn memory(node: &engine::node::NodeConfig, http: HttpMemory) -> Finding {
    let shards = node.shards;
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (Some(total), Some(available)) =
        (meminfo(&text, "MemTotal"), meminfo(&text, "MemAvailable"))
    else {
        return finding("memory", Status::Warn, "cannot read /proc/meminfo".into());
    };
    let budget = node.shard.memory_budget_bytes;
    let held = budget.saturating_mul(shards as u64);
    // At their bounds only: request bodies and responses slow clients leave in the server.
    let http_held = http.bodies.saturating_add(http.responses).saturating_mul(shards as u64);
    let found = format!(
        "{} total, {} available; {shards} shard{} may hold {} (--shard-memory-bytes {} each), \
         and {} more at most in HTTP bodies and responses",
        bytes(total),
        bytes(available),
        if shards == 1 { "" } else { "s" },
        bytes(held),
        bytes(budget),
        bytes(http_held)
    );
    let details = json!({
        "total_bytes": total,
        "available_bytes": available,
        "shard_memory_bytes": budget,
        "http_body_memory_bytes": http.bodies,
        "http_response_memory_bytes": http.responses,
        "shards": shards,
    });
    if held.saturating_add(http_held) > available && held <= available / 2 {
        // The shards' caches fit; what slow or flooding clients could make the HTTP
        // servers hold on top of them would not.
        let room = available.saturating_sub(held) / shards.max(1) as u64;
        return finding("memory", Status::Warn, found)
            .recommend(format!(
                "the shards' caches and their HTTP bounds together exceed the available memory: \
                 lower --http-response-memory-bytes and --http-body-memory-bytes (at least twice \
                 --http-json-body-bytes-max) until the two add up to {} or less",
                mib_text(room)
            ))
            .details(details);
    }
    if held > available / 2 {
        // Leave half of what is available to the page cache, the uploader's bundles and
        // everything else on the host.
        let each = (available / 2 / shards.max(1) as u64).max(tuning::SHARD_MEMORY_BYTES.min);
        finding("memory", Status::Warn, found)
            .recommend(format!(
                "the shards' budgets exceed half the available memory: set --shard-memory-bytes {} or less",
                mib_text(each)
            ))
            .details(details)
    } else {
        finding("memory", Status::Ok, found).details(details)
    }
}

/// `major.minor` of a kernel release like `6.18.44-fc-v657`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn kernel() -> Finding {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let details = json!({ "release": release });
    match kernel_version(&release) {
        Some(version) if version >= KERNEL_MIN => {
            finding("kernel", Status::Ok, format!("Linux {release}")).details(details)
        }
        Some(_) => finding(
            "kernel",
            Status::Fail,
            format!("Linux {release}: older than {}.{}", KERNEL_MIN.0, KERNEL_MIN.1),
        )
        .recommend("glommio needs the io_uring of Linux 5.8 or newer: upgrade the kernel")
        .details(details),
        None => finding("kernel", Status::Warn, format!("unknown kernel release {release:?}"))
            .details(details),
    }
}

/// Sets up (and closes) an io_uring of 8 entries with the raw syscall; the kernel's
/// feature bits, or the error.
fn io_uring_setup() -> Result<u32, std::io::Error> {
    // struct io_uring_params: 120 bytes, all zero asks for a plain ring. The kernel writes
    // the ring sizes, `features` (the sixth u32) and the ring offsets back into it.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup reads and writes exactly one `struct io_uring_params` (120
    // bytes) at the pointer, which `params` provides, aligned for its u32 fields.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 8u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).expect("file descriptors fit an i32");
    // SAFETY: `fd` is the ring's descriptor, just returned to us and owned by no one else.
    unsafe { libc::close(fd) };
    Ok(params[5])
}

/// Starts a glommio executor (what each shard is) and runs a task on it.
fn glommio_start() -> Result<(), String> {
    let thread = std::thread::Builder::new()
        .name("nova-doctor-glommio".into())
        .spawn(|| {
            glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .make()
                .map(|executor| executor.run(async { 1 + 1 }))
                .map_err(|e| e.to_string())
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    match thread.join() {
        Ok(Ok(2)) => Ok(()),
        Ok(Ok(_)) => Err("the executor ran the task wrongly".into()),
        Ok(Err(error)) => Err(error),
        Err(_) => Err("glommio panicked while starting an executor".into()),
    }
}

fn io_uring() -> Finding {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match io_uring_setup() {
        Err(error) => {
            let why = match error.raw_os_error() {
                Some(libc::ENOSYS) => "the kernel has no io_uring (ENOSYS)",
                Some(libc::EPERM) => "io_uring is not permitted (EPERM)",
                _ => "io_uring_setup failed",
            };
            finding("io_uring", Status::Fail, format!("{why}: {error}"))
                .recommend(
                    "nova's shards run on io_uring: set sysctl kernel.io_uring_disabled=0, or \
                     allow io_uring_setup in the container's seccomp profile",
                )
                .details(json!({ "io_uring_disabled": disabled, "error": error.to_string() }))
        }
        Ok(features) => {
            let started = glommio_start();
            let details = json!({
                "io_uring_disabled": disabled,
                "features": format!("{features:#x}"),
                "glommio_executor": started.as_ref().err().map_or("started", String::as_str),
            });
            match started {
                Ok(()) => finding(
                    "io_uring",
                    Status::Ok,
                    format!(
                        "a ring sets up (features {features:#x}) and a glommio executor starts"
                    ),
                )
                .details(details),
                Err(error) => finding(
                    "io_uring",
                    Status::Fail,
                    format!("a ring sets up, but a glommio executor does not start: {error}"),
                )
                .recommend("see the memlock finding: glommio locks memory for its rings")
                .details(details),
            }
        }
    }
}

fn memlock() -> Finding {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one `rlimit` into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        let error = std::io::Error::last_os_error();
        return finding("memlock", Status::Warn, format!("cannot read RLIMIT_MEMLOCK: {error}"));
    }
    let show = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY { "unlimited".to_owned() } else { bytes(v) }
    };
    let found = format!("RLIMIT_MEMLOCK {} (hard {})", show(limit.rlim_cur), show(limit.rlim_max));
    let details = json!({
        "soft_bytes": (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur),
        "hard_bytes": (limit.rlim_max != libc::RLIM_INFINITY).then_some(limit.rlim_max),
        "min_bytes": MEMLOCK_BYTES_MIN,
    });
    let raise = "raise it: `ulimit -l 65536` in the shell, LimitMEMLOCK=64M in a systemd unit, or \
                 --ulimit memlock=67108864 for docker";
    if limit.rlim_cur == libc::RLIM_INFINITY || limit.rlim_cur >= MEMLOCK_BYTES_COMFORTABLE {
        finding("memlock", Status::Ok, found).details(details)
    } else if limit.rlim_cur >= MEMLOCK_BYTES_MIN {
        finding("memlock", Status::Ok, found)
            .recommend(format!(
                "enough for glommio (>= 512 KiB); {} or more lets it register its 10 MiB buffer area \
                 instead of logging a warning: {raise}",
                bytes(MEMLOCK_BYTES_COMFORTABLE)
            ))
            .details(details)
    } else {
        finding("memlock", Status::Fail, format!("{found}: below glommio's 512 KiB"))
            .recommend(raise)
            .details(details)
    }
}

/// Directories `create_dir_all(path)` would create, deepest last.
fn missing_ancestors(path: &Path) -> Vec<PathBuf> {
    let mut missing: Vec<PathBuf> = path
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    missing
}

/// A file the doctor made and removes when dropped.
struct TempFile {
    path: PathBuf,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The data directory checks (on the journal directory when `--journal-dir` names one):
/// writable, O_DIRECT, poll queues, write cache, fdatasync latency, free space. The ones
/// after `data_dir` need the directory and say so when it is unusable.
fn data_dir_checks(options: &Options) -> Vec<Finding> {
    // The journals' directory is where O_DIRECT and fdatasync matter.
    let dir = options.node.journal_dir.as_ref().unwrap_or(&options.data_dir);
    let created = missing_ancestors(dir);
    let findings = match std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create it: {e}"))
        .and_then(|()| {
            let path = dir.join(format!(".nova-doctor-{}", std::process::id()));
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| format!("cannot create a file in it: {e}"))?;
            let guard = TempFile { path };
            file.write_all(b"nova doctor\n")
                .map_err(|e| format!("cannot write a file in it: {e}"))?;
            Ok(guard)
        }) {
        Err(why) => {
            let not_checked = |check| {
                finding(check, Status::Warn, "not checked: the data directory is unusable".into())
            };
            vec![
                finding("data_dir", Status::Fail, format!("{}: {why}", dir.display())).recommend(
                    "nova keeps its metadata and express journal there: pass a writable --data-dir \
                     (or NOVA_DATA_DIR)",
                ),
                not_checked("o_direct"),
                not_checked("io_poll"),
                not_checked("write_cache"),
                not_checked("fdatasync"),
                not_checked("disk_space"),
            ]
        }
        Ok(probe) => {
            let filesystem = filesystem_type(dir);
            let mut findings = vec![
                finding(
                    "data_dir",
                    Status::Ok,
                    format!("{}: writable, {filesystem}", dir.display()),
                )
                .details(json!({ "path": dir.display().to_string(), "filesystem": filesystem })),
            ];
            drop(probe);
            let direct = o_direct(dir);
            findings.push(direct.0);
            findings.push(io_poll(dir));
            findings.push(write_cache(dir));
            findings.push(fdatasync(dir, direct.1, options.sync_writes));
            findings.push(disk_space(dir, &options.node));
            findings
        }
    };
    // Leave the file system as we found it: remove what we created, if still empty.
    for path in created.iter().rev() {
        let _ = std::fs::remove_dir(path);
    }
    findings
}

/// The file system type of `dir`, by its statfs magic number.
fn filesystem_type(dir: &Path) -> String {
    let Some(path) = c_path(dir) else { return "unknown file system".into() };
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and statfs writes one struct we own.
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 {
        return "unknown file system".into();
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between targets
    let magic = stat.f_type as u64;
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        _ => return format!("file system type {magic:#x}"),
    };
    name.to_owned()
}

fn c_path(path: &Path) -> Option<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(path.as_os_str().as_bytes()).ok()
}

/// A 4 KiB-aligned block of `len` bytes inside `buf` (which is `len + 4096` long), so
/// O_DIRECT accepts it, with no unsafe allocation.
fn aligned(buf: &mut [u8], len: usize) -> &mut [u8] {
    let offset = buf.as_ptr().align_offset(BLOCK_BYTES);
    &mut buf[offset..offset + len]
}

/// Writes one 4 KiB block to a new file opened with O_DIRECT; the finding and whether
/// O_DIRECT works.
fn o_direct(dir: &Path) -> (Finding, bool) {
    let path = dir.join(format!(".nova-doctor-direct-{}", std::process::id()));
    let opened =
        OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(&path);
    let advice = "nova's express journal writes with O_DIRECT: put --data-dir on ext4 or xfs on a \
                  local disk";
    let file = match opened {
        Ok(file) => file,
        Err(error) => {
            let _ = std::fs::remove_file(&path);
            return (
                finding(
                    "o_direct",
                    Status::Fail,
                    format!("cannot open a file with O_DIRECT: {error}"),
                )
                .recommend(advice),
                false,
            );
        }
    };
    let _guard = TempFile { path };
    let mut buf = vec![0u8; 2 * BLOCK_BYTES];
    let block = aligned(&mut buf, BLOCK_BYTES);
    block.fill(0x6e);
    match file.write_all_at(block, 0).and_then(|()| file.sync_data()) {
        Ok(()) => (finding("o_direct", Status::Ok, "4 KiB O_DIRECT writes work".into()), true),
        Err(error) => (
            finding("o_direct", Status::Fail, format!("a 4 KiB O_DIRECT write fails: {error}"))
                .recommend(advice),
            false,
        ),
    }
}

/// The whole block device under `dir`: its name and its `/sys/block` directory; else
/// the finding `check` reports (not a block device, or the directory cannot be read).
fn block_device(dir: &Path, check: &'static str) -> Result<(String, PathBuf), Finding> {
    let Ok(meta) = std::fs::metadata(dir) else {
        return Err(finding(check, Status::Warn, "cannot stat the data directory".into()));
    };
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let Ok(mut sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
        return Err(finding(
            check,
            Status::Ok,
            format!("device {major}:{minor} is not a block device (tmpfs, overlay or network?)"),
        )
        .details(json!({ "device": format!("{major}:{minor}") })));
    };
    if sys.join("partition").exists() {
        sys.pop();
    }
    let name = sys.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok((name, sys))
}

/// A `/sys/block/<dev>/queue` attribute, trimmed.
fn queue_attribute(sys: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(sys.join("queue").join(name)).ok().map(|s| s.trim().to_owned())
}

/// The block device under `dir` and whether it has poll queues (glommio's IOPOLL ring).
fn io_poll(dir: &Path) -> Finding {
    let (name, sys) = match block_device(dir, "io_poll") {
        Ok(device) => device,
        Err(finding) => return finding,
    };
    let poll = queue_attribute(&sys, "io_poll");
    let details = json!({ "device": name, "io_poll": poll });
    match poll.as_deref() {
        Some("1") => finding(
            "io_poll",
            Status::Ok,
            format!(
                "{name} has poll queues (queue/io_poll 1): reads may use glommio's polled ring"
            ),
        )
        .details(details),
        Some(_) => finding(
            "io_poll",
            Status::Ok,
            format!("{name} has no poll queues (queue/io_poll 0): interrupt-driven completions"),
        )
        .recommend(
            "nothing to do: nova opens a non-empty probe file first, so glommio's IOPOLL probe \
             does not misfire on this device (notes/platform.md)",
        )
        .details(details),
        None => finding("io_poll", Status::Ok, format!("{name}: no queue/io_poll to read"))
            .details(details),
    }
}

/// What an fdatasync asks of the device under `dir`: a volatile write cache without FUA
/// makes each one a flush of the whole cache, shared with every other writer on the disk.
fn write_cache(dir: &Path) -> Finding {
    let (name, sys) = match block_device(dir, "write_cache") {
        Ok(device) => device,
        Err(finding) => return finding,
    };
    let cache = queue_attribute(&sys, "write_cache");
    let fua = queue_attribute(&sys, "fua");
    // The active scheduler is the one in brackets: "none [mq-deadline] kyber".
    let scheduler = queue_attribute(&sys, "scheduler").map(|all| {
        all.split_whitespace()
            .find_map(|s| s.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
            .unwrap_or(&all)
            .to_owned()
    });
    let details =
        json!({ "device": name, "write_cache": cache, "fua": fua, "scheduler": scheduler });
    let shown = |value: &Option<String>| value.clone().unwrap_or_else(|| "unknown".into());
    let found = format!(
        "{name}: write cache {}, FUA {}, scheduler {}",
        shown(&cache),
        match fua.as_deref() {
            Some("1") => "yes",
            Some(_) => "no",
            None => "unknown",
        },
        shown(&scheduler)
    );
    let finding = finding("write_cache", Status::Ok, found).details(details);
    if cache.as_deref() == Some("write back") && fua.as_deref() != Some("1") {
        finding.recommend(
            "each fdatasync flushes the device's whole cache, so the express journal's group \
             commits wait on every other write to this disk (the local object store's too): keep \
             heavy writers off it, or put objects on S3 (docs/benchmarks.md)",
        )
    } else {
        finding
    }
}

/// The `p`th percentile (0..=100) of sorted `values`, nearest rank.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Times `writes` 4 KiB overwrites, each followed by fdatasync, at queue depth 1 (the
/// express journal's group commit on a reused segment).
fn fdatasync(dir: &Path, direct: bool, writes: usize) -> Finding {
    let path = dir.join(format!(".nova-doctor-sync-{}", std::process::id()));
    let mut open = OpenOptions::new();
    open.read(true).write(true).create_new(true);
    if direct {
        open.custom_flags(libc::O_DIRECT);
    }
    let file = match open.open(&path) {
        Ok(file) => file,
        Err(error) => {
            return finding("fdatasync", Status::Warn, format!("not measured: {error}"));
        }
    };
    let _guard = TempFile { path };
    match time_syncs(&file, writes) {
        Err(error) => {
            finding("fdatasync", Status::Fail, format!("a write or fdatasync fails: {error}"))
                .recommend(
                    "nova acknowledges express appends once a write is flushed (fdatasync or \
                     O_DSYNC): check the disk",
                )
        }
        Ok(mut times) => {
            times.sort_unstable();
            let (p50, p99) = (percentile(&times, 50.0), percentile(&times, 99.0));
            let max = times.last().copied().unwrap_or_default();
            let found = format!(
                "4 KiB {}write + fdatasync, queue depth 1, {writes} writes: p50 {}, p99 {}, max {}",
                if direct { "O_DIRECT " } else { "" },
                ms(p50),
                ms(p99),
                ms(max)
            );
            let details = json!({
                "writes": writes,
                "o_direct": direct,
                "p50_us": p50.as_micros() as u64,
                "p99_us": p99.as_micros() as u64,
                "max_us": max.as_micros() as u64,
            });
            if p50 > Duration::from_millis(2) || p99 > Duration::from_millis(20) {
                finding("fdatasync", Status::Warn, found)
                    .recommend(
                        "express acks wait one flush (write + fdatasync, or an O_DSYNC write) per group commit, so their latency starts \
                         here: a disk with power-loss protection (enterprise NVMe) syncs in tens of µs",
                    )
                    .details(details)
            } else {
                finding("fdatasync", Status::Ok, found).details(details)
            }
        }
    }
}

fn time_syncs(file: &File, writes: usize) -> std::io::Result<Vec<Duration>> {
    let mut buf = vec![0u8; 2 * BLOCK_BYTES];
    let block = aligned(&mut buf, BLOCK_BYTES);
    // Write the area once first, so the timed writes overwrite allocated blocks, as the
    // journal does in a reused segment (no extent conversion in the fdatasync).
    for i in 0..writes {
        block.fill(i as u8);
        file.write_all_at(block, (i * BLOCK_BYTES) as u64)?;
    }
    file.sync_all()?;
    let mut times = Vec::with_capacity(writes);
    for i in 0..writes {
        block.fill(!(i as u8));
        let start = Instant::now();
        file.write_all_at(block, (i * BLOCK_BYTES) as u64)?;
        file.sync_data()?;
        times.push(start.elapsed());
    }
    Ok(times)
}

fn disk_space(dir: &Path, node: &engine::node::NodeConfig) -> Finding {
    let shards = node.shards;
    let Some(path) = c_path(dir) else {
        return finding("disk_space", Status::Warn, "the path has a NUL byte".into());
    };
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and statvfs writes one struct we own.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        let error = std::io::Error::last_os_error();
        return finding("disk_space", Status::Warn, format!("cannot statvfs: {error}"));
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    let (available, total) = (
        (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64),
        (stat.f_blocks as u64).saturating_mul(stat.f_frsize as u64),
    );
    // Each shard's journal: the segment being written, one being rolled to, and the
    // spares kept for reuse.
    let segment = node.journal.segment_bytes;
    let spares = u64::from(node.journal.spare_segments);
    let journal = segment.saturating_mul(2 + spares).saturating_mul(shards as u64);
    let found = format!(
        "{} free of {}; the express journals take up to {} ({shards} × {} segments of {})",
        bytes(available),
        bytes(total),
        bytes(journal),
        2 + spares,
        bytes(segment)
    );
    let details = json!({
        "available_bytes": available,
        "total_bytes": total,
        "journal_bytes": journal,
    });
    if available < journal {
        finding("disk_space", Status::Fail, found)
            .recommend(
                "free space, or shrink the journals: --journal-segment-bytes (smaller segments) and \
                 --journal-spare-segments 0",
            )
            .details(details)
    } else if available < journal.saturating_mul(4) {
        finding("disk_space", Status::Warn, found)
            .recommend(
                "little room beyond the journals: metadata and, with the local object store, all \
                 history (<data-dir>/objects) live here too; free space or use --s3-bucket",
            )
            .details(details)
    } else {
        finding("disk_space", Status::Ok, found).details(details)
    }
}

/// A PUT, GET and DELETE of a small object under `nova-doctor/`, three times: the
/// first includes connecting.
fn object_store(store: Option<&ObjectStoreConfig>, data_dir: &Path) -> Finding {
    let config = match store {
        Some(ObjectStoreConfig::S3(config)) => config.as_ref().clone(),
        Some(ObjectStoreConfig::Local(_)) | None => {
            return finding(
                "object_store",
                Status::Ok,
                format!(
                    "the local directory {} (on the disk checked above); pass nova serve's --s3-* flags to test S3",
                    data_dir.join("objects").display()
                ),
            )
            .details(json!({ "store": "local" }));
        }
    };
    let bucket = config.bucket.clone();
    let result = s3::S3Store::new(config).map_err(|e| e.to_string()).and_then(|store| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
        runtime.block_on(round_trips(&store))
    });
    match result {
        Err(error) => finding("object_store", Status::Fail, format!("S3 bucket {bucket}: {error}"))
            .recommend(
                "check --s3-bucket, --s3-endpoint, --s3-region, --s3-path-style and the credentials; \
                 nova serve cannot upload without them",
            )
            .details(json!({ "store": "s3", "bucket": bucket, "error": error })),
        Ok(trips) => {
            let median = |op: usize| {
                let mut v: Vec<Duration> = trips.iter().map(|t| t[op]).collect();
                v.sort_unstable();
                v[v.len() / 2]
            };
            let (put, get, delete) = (median(0), median(1), median(2));
            let found = format!(
                "S3 bucket {bucket}: 4 KiB PUT {}, GET {}, DELETE {} (median of {}; the first PUT, connecting, {})",
                ms(put),
                ms(get),
                ms(delete),
                trips.len(),
                ms(trips[0][0])
            );
            let details = json!({
                "store": "s3",
                "bucket": bucket,
                "put_us": put.as_micros() as u64,
                "get_us": get.as_micros() as u64,
                "delete_us": delete.as_micros() as u64,
                "first_put_us": trips[0][0].as_micros() as u64,
            });
            if put > Duration::from_millis(200) {
                finding("object_store", Status::Warn, found)
                    .recommend(
                        "standard acks wait --bundle-delay-ms plus one PUT: a slow store makes them \
                         slow; raise --uploads-in-flight-max to keep throughput, or use express streams",
                    )
                    .details(details)
            } else {
                finding("object_store", Status::Ok, found).details(details)
            }
        }
    }
}

const ROUND_TRIPS: usize = 3;

async fn round_trips(store: &s3::S3Store) -> Result<Vec<[Duration; 3]>, String> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let body = s3::Bytes::from(vec![0x6e; 4096]);
    let mut trips = Vec::with_capacity(ROUND_TRIPS);
    for i in 0..ROUND_TRIPS {
        let key = format!("nova-doctor/{}-{stamp}-{i}", std::process::id());
        let start = Instant::now();
        store
            .put(&key, body.clone(), s3::PutCondition::CreateOnly)
            .await
            .map_err(|e| format!("PUT {key}: {e}"))?;
        let put = start.elapsed();
        let start = Instant::now();
        let got = store.get(&key, s3::ByteRange::All).await;
        let get = start.elapsed();
        let start = Instant::now();
        let deleted = store.delete(&key).await;
        let delete = start.elapsed();
        let got = got.map_err(|e| format!("GET {key}: {e}"))?;
        if got != body {
            return Err(format!(
                "GET {key} returned {} bytes unlike the {} written",
                got.len(),
                body.len()
            ));
        }
        deleted.map_err(|e| format!("DELETE {key}: {e}"))?;
        trips.push([put, get, delete]);
    }
    Ok(trips)
}

fn ms(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1000 { format!("{us} µs") } else { format!("{:.2} ms", d.as_secs_f64() * 1e3) }
}

fn bytes(n: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if n >= GIB {
        format!("{:.1} GiB", n as f64 / GIB as f64)
    } else if n >= MIB {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    } else {
        format!("{} KiB", n >> 10)
    }
}

/// A byte count as a knob value (`nova serve` accepts the `MiB` suffix).
fn mib_text(n: u64) -> String {
    format!("{}MiB", n >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kernel_versions_and_meminfo() {
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("weird"), None);
        let text = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(meminfo(text, "MemTotal"), Some(24_000_000 * 1024));
        assert_eq!(meminfo(text, "MemAvailable"), Some(1000 * 1024));
        assert_eq!(meminfo(text, "Mem"), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<Duration> = (1..=200).map(Duration::from_micros).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_micros(100));
        assert_eq!(percentile(&v, 99.0), Duration::from_micros(198));
        assert_eq!(percentile(&v, 100.0), Duration::from_micros(200));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn parses_flags_like_serve() {
        let args: Vec<String> = [
            "--json",
            "--data-dir=/x",
            "--s3-bucket",
            "b",
            "--s3-path-style",
            "--sync-writes",
            "20",
        ]
        .map(str::to_owned)
        .to_vec();
        let options = parse(&args).expect("valid");
        assert!(options.json);
        assert_eq!(options.data_dir, PathBuf::from("/x"));
        assert_eq!(options.sync_writes, 20);
        assert_eq!(
            options.s3_flags,
            vec![("s3-bucket".into(), "b".into()), ("s3-path-style".into(), "true".into())]
        );
        assert!(parse(&["--bogus".to_owned(), "1".to_owned()]).is_err());
        // Named as unknown, alone too, not as a flag that needs a value.
        let unknown = parse(&["--bogus".to_owned()]).err().expect("refused");
        assert_eq!(unknown, "unknown flag --bogus");
        assert!(parse(&["--sync-writes".to_owned(), "1".to_owned()]).is_err());
    }
}

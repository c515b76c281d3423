//! `--spawn`: a `nova serve` of loadgen's own, on a temporary data directory and a port the
//! kernel picks, stopped (and its directory removed) when the run ends, an interrupted one
//! included.
//!
//! The server runs in a process group of its own, so a terminal's Ctrl-C reaches loadgen
//! only and loadgen stops the server after its report. Should loadgen die without
//! cleaning up (`kill -9`, a second signal), the kernel kills the server with it
//! (`PR_SET_PDEATHSIG`); only its directory stays behind then.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The line `nova serve` prints on stdout once it serves.
const READY: &str = "nova listening on ";

pub struct Spawned {
    child: Child,
    pub url: String,
    pub log: PathBuf,
    // Dropped after the child is stopped (field order): the data directory.
    _dir: tempfile::TempDir,
}

/// The nova binary: the one named, else the one next to this executable, else `nova` on
/// PATH.
pub fn nova_bin(named: Option<&Path>) -> PathBuf {
    if let Some(path) = named {
        return path.to_owned();
    }
    let sibling = std::env::current_exe().ok().and_then(|exe| {
        // Next to loadgen, or one up when loadgen runs from target/<profile>/deps.
        let dir = exe.parent()?;
        [dir.join("nova"), dir.parent()?.join("nova")].into_iter().find(|p| p.is_file())
    });
    sibling.unwrap_or_else(|| PathBuf::from("nova"))
}

impl Spawned {
    /// Starts `bin serve` and waits for it to say where it listens. The server dies with
    /// the thread that calls this (`PR_SET_PDEATHSIG` follows the thread that forked, not
    /// the process): call it from one that lives as long as the run, as `main` does.
    pub fn start(bin: &Path, extra_args: &[String]) -> Result<Spawned, String> {
        let dir = tempfile::Builder::new()
            .prefix("loadgen-nova-")
            .tempdir()
            .map_err(|e| format!("make a data directory: {e}"))?;
        let log = dir.path().join("nova.log");
        let log_file = File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let data = dir.path().join("data");
        let parent = libc::pid_t::try_from(std::process::id()).map_err(|e| format!("pid: {e}"))?;
        let mut command = Command::new(bin);
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: prctl and getppid are plain system calls, and
        // building an io::Error from an errno allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // loadgen died before the request took effect: no signal will come.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(&data)
            // Idle subscriptions wake often, so followers notice the end of the run.
            .args(["--sse-heartbeat-ms", "100"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .map_err(|e| {
                format!(
                    "start {} serve: {e} (build it with `cargo build --profile ci -p net --bin nova`, or name it with --nova-bin)",
                    bin.display()
                )
            })?;
        let stdout = child.stdout.take().ok_or("the child has no stdout")?;
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        let url = loop {
            line.clear();
            match lines.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let mut text = String::new();
                    let _ = File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
                    return Err(format!(
                        "{} serve stopped before it listened:\n{text}",
                        bin.display()
                    ));
                }
                Ok(_) => {
                    if let Some(url) = line.trim().strip_prefix(READY) {
                        break url.to_owned();
                    }
                }
            }
        };
        // Keep reading stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = lines.read_to_end(&mut sink);
        });
        Ok(Spawned { child, url, log, _dir: dir })
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

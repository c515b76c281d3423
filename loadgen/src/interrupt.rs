//! SIGINT and SIGTERM: the first ends the run early and cleanly (producers stop, the
//! acknowledgements in flight are collected, the partial report is printed, a spawned
//! server is stopped and its directory removed) and loadgen exits 128 + the signal's
//! number; a second one exits at once with that status.
//!
//! The signal handlers only set flags (signal-hook); the workers poll them. Nothing here
//! stops a thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};

/// Whether, and by which signal, the run was asked to stop. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Interrupt {
    /// The last signal that arrived; 0 for none.
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Never set by a signal: a run driven from code.
    pub fn none() -> Self {
        Self::default()
    }

    /// Set by SIGINT or SIGTERM from now on. A second signal exits the process at once
    /// with 128 + its number: the spawned server still dies with loadgen
    /// (`PR_SET_PDEATHSIG`, spawn.rs), but its directory stays behind.
    pub fn on_signals() -> std::io::Result<Self> {
        let interrupt = Self::none();
        let armed = Arc::new(AtomicBool::new(false));
        for signal in [SIGINT, SIGTERM] {
            // In this order: the shutdown looks at `armed` before the first signal sets it.
            signal_hook::flag::register_conditional_shutdown(
                signal,
                exit_status(signal).into(),
                armed.clone(),
            )?;
            signal_hook::flag::register(signal, armed.clone())?;
            signal_hook::flag::register_usize(
                signal,
                interrupt.signal.clone(),
                signal.unsigned_abs() as usize,
            )?;
        }
        Ok(interrupt)
    }

    /// The signal that asked the run to stop, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.signal.load(Ordering::Relaxed) {
            0 => None,
            signal => i32::try_from(signal).ok(),
        }
    }
}

/// `SIGINT`, `SIGTERM`, else `signal N`.
pub fn signal_name(signal: i32) -> String {
    match signal {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

/// The exit status of a run a signal ended: 128 + its number, as a shell reports a process
/// the signal killed (130 for SIGINT, 143 for SIGTERM).
pub fn exit_status(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_names_are_the_shells() {
        assert_eq!(exit_status(SIGINT), 130);
        assert_eq!(exit_status(SIGTERM), 143);
        assert_eq!(signal_name(SIGTERM), "SIGTERM");
        assert_eq!(Interrupt::none().signal(), None);
    }
}

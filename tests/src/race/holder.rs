//! The holder: a small libnetfilter_queue program that holds every packet of an NFQUEUE
//! for a fixed time, compiled once per lab, and its account of what it did.
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{find_tool, run};
use crate::{Lab, LabError};

/// Longest hold the holder accepts (it clamps larger values): a packet is never held
/// longer than this, whatever it is.
pub const MAX_HOLD_MS: u32 = 10_000;

/// File name of the compiled holder in [`Lab::temp_dir`].
pub const HOLDER_BIN: &str = "nfq-holder";

/// The holder: `nfq-holder QUEUE HOLD_MS`. Binds NFQUEUE `QUEUE`, gives every packet a
/// deadline of arrival + `HOLD_MS` (clamped to [`MAX_HOLD_MS`]) and issues `NF_ACCEPT` for
/// it at that deadline. The hold is the same for every packet, so arrival order is
/// deadline order and a ring of packet ids is the whole schedule. A packet that arrives
/// while the ring is full is accepted at once, and the queue is fail-open (the kernel
/// accepts what does not fit). Prints `ready ...` on stdout once bound; on SIGTERM or
/// SIGINT accepts everything still held and prints a summary line
/// `held=N immediate=N released_on_exit=N verdict_errors=N enobufs=N`.
/// SIGTERM is blocked except inside `ppoll`, so it can never be missed between a check
/// and a wait.
pub const HOLDER_C: &str = include_str!("nfq_holder.c");

/// What the holder reported when it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HolderSummary {
    /// Packets it queued and released at their deadline (or on exit).
    pub held: u64,
    /// Packets accepted at once because its ring was full.
    pub immediate: u64,
    /// Packets still held when it was stopped, accepted then.
    pub released_on_exit: u64,
    /// `nf_queue` verdicts the kernel refused.
    pub verdict_errors: u64,
    /// Netlink receive overflows (packets whose notification was lost).
    pub enobufs: u64,
}

/// Compiles [`HOLDER_C`] into `<temp dir>/nfq-holder` unless it is already there.
pub(super) fn compile_holder(lab: &Lab) -> Result<PathBuf, LabError> {
    let dir = lab.temp_dir();
    let bin = dir.join(HOLDER_BIN);
    if bin.is_file() {
        return Ok(bin);
    }
    let gcc = find_tool("gcc", "gcc")?;
    if !Path::new("/usr/include/libnetfilter_queue/libnetfilter_queue.h").is_file() {
        return Err(LabError::MissingTool {
            tool: "libnetfilter_queue/libnetfilter_queue.h",
            package: "libnetfilter-queue-dev",
        });
    }
    let src = dir.join("holder.c");
    fs::write(&src, HOLDER_C).map_err(|e| LabError::io(format!("writing {}", src.display()), e))?;
    // Build under a private name and rename: a half-written binary is never run.
    let tmp = dir.join(format!("{HOLDER_BIN}.{}.tmp", std::process::id()));
    let mut c = Command::new(gcc);
    c.arg("-O2")
        .arg("-Wall")
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .arg("-lnetfilter_queue");
    run(&mut c, None)?;
    fs::rename(&tmp, &bin).map_err(|e| {
        LabError::io(
            format!("renaming {} to {}", tmp.display(), bin.display()),
            e,
        )
    })?;
    Ok(bin)
}

pub(super) fn parse_summary(text: &str) -> Option<HolderSummary> {
    let line = text.lines().rev().find(|l| l.starts_with("held="))?;
    let mut s = HolderSummary::default();
    for kv in line.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        let v = v.parse::<u64>().ok()?;
        match k {
            "held" => s.held = v,
            "immediate" => s.immediate = v,
            "released_on_exit" => s.released_on_exit = v,
            "verdict_errors" => s.verdict_errors = v,
            "enobufs" => s.enobufs = v,
            _ => {}
        }
    }
    Some(s)
}

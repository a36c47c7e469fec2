//! The conntrack DNAT race (LAB.md "Failure 2"), made deterministic.
//!
//! A query to the ClusterIP is DNAT'ed to a "CoreDNS" pod and then held in an NFQUEUE in
//! the node's `nat POSTROUTING` (after DNAT, before conntrack confirms the entry). While it
//! is held, the same socket sends a query straight to every pod IP; those entries confirm at
//! once, and one of them has exactly the reply tuple the held entry will want
//! (`POD:53 -> client:PORT`). When the held packet is released, `__nf_conntrack_confirm`
//! finds that reply tuple taken and the clash cannot be resolved (the original tuples
//! differ): `insert_failed` +1, `drop` +1, the query is lost.
//!
//! * [`RaceRig`]: the NFQUEUE rule plus a small libnetfilter_queue "holder" program
//!   ([`HOLDER_C`]), compiled once per lab into [`Lab::temp_dir`].
//! * [`force_race`]: one shot from the client pod.
//! * [`ct_stats`]: the node's per-CPU conntrack counters.

mod counters;
mod holder;
mod shot;

use holder::{compile_holder, parse_summary};

pub use counters::{ct_stats, ct_totals, parse_ct_stats};
pub use holder::{HolderSummary, HOLDER_BIN, HOLDER_C, MAX_HOLD_MS};
pub use shot::{force_race, force_race_timed, RaceShot, RACE_PY};

use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Output};
use std::time::{Duration, Instant};

use crate::cmd::find_tool;
use crate::{Lab, LabError};

/// NFQUEUE number [`RaceRig::install`] uses. NFQUEUE instances are per network namespace,
/// so labs running side by side do not collide.
pub const DEFAULT_QUEUE: u16 = 0;

/// How long [`force_race`] waits after the query to the ClusterIP before sending the
/// direct queries to the pods.
pub const DEFAULT_AAAA_DELAY: Duration = Duration::from_millis(50);

/// How long [`force_race`] waits for answers after the direct queries.
pub const DEFAULT_ANSWER_WAIT: Duration = Duration::from_millis(1000);

/// The NFQUEUE rule in the node's `nat POSTROUTING` plus the holder serving it.
/// [`RaceRig::remove`] (or drop) deletes the rule, then stops the holder, which accepts
/// whatever it still holds.
#[derive(Debug)]
pub struct RaceRig<'a> {
    lab: &'a Lab,
    iptables: PathBuf,
    rule: Vec<String>,
    holder: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
    rule_installed: bool,
}

impl<'a> RaceRig<'a> {
    /// Compiles the holder (once per lab), starts it in the node namespace on
    /// [`DEFAULT_QUEUE`] holding each packet `hold_ms` ms, waits until it has bound the
    /// queue, then inserts
    /// `iptables -t nat -I POSTROUTING -p udp --dport 53 -m conntrack --ctorigdst <ClusterIP>
    /// -j NFQUEUE --queue-num <N> --queue-bypass` (bypass: should the holder die, packets
    /// pass instead of being dropped).
    pub fn install(lab: &'a Lab, hold_ms: u32) -> Result<RaceRig<'a>, LabError> {
        Self::install_on_queue(lab, hold_ms, DEFAULT_QUEUE)
    }

    /// [`RaceRig::install`] on NFQUEUE `queue`.
    pub fn install_on_queue(
        lab: &'a Lab,
        hold_ms: u32,
        queue: u16,
    ) -> Result<RaceRig<'a>, LabError> {
        let iptables = find_tool(lab.iptables(), "iptables")?;
        let bin = compile_holder(lab)?;
        let bin_s = bin.to_string_lossy().into_owned();
        let queue_s = queue.to_string();
        let hold_s = hold_ms.min(MAX_HOLD_MS).to_string();
        let mut child = lab.spawn_in(lab.node_ns(), &[&bin_s, &queue_s, &hold_s])?;
        let mut stdout = child.stdout.take().map(BufReader::new);
        let mut line = String::new();
        let read = match stdout.as_mut() {
            Some(r) => r.read_line(&mut line),
            None => Ok(0),
        };
        if !matches!(read, Ok(n) if n > 0 && line.starts_with("ready")) {
            // It failed to bind (and exited), or its stdout is unusable: reap and report.
            let _ = child.kill();
            let out = child.wait_with_output();
            let (status, stderr) = match out {
                Ok(o) => (
                    o.status.to_string(),
                    String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                ),
                Err(e) => ("unknown".to_owned(), e.to_string()),
            };
            return Err(LabError::Command {
                cmd: format!("{bin_s} {queue_s} {hold_s} (in {})", lab.node_ns()),
                status,
                stderr: format!("holder did not report ready ({read:?}, {line:?}): {stderr}"),
            });
        }
        let cip = lab.cluster_ip().to_string();
        let rule: Vec<String> = [
            "POSTROUTING",
            "-p",
            "udp",
            "--dport",
            "53",
            "-m",
            "conntrack",
            "--ctorigdst",
            &cip,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue_s,
            "--queue-bypass",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut rig = RaceRig {
            lab,
            iptables,
            rule,
            holder: Some(child),
            stdout,
            rule_installed: false,
        };
        // On error `rig` drops here and stops the holder.
        rig.iptables_rule("-I")?;
        rig.rule_installed = true;
        Ok(rig)
    }

    /// Deletes the rule and stops the holder (SIGTERM; it accepts everything it still
    /// holds). Returns the holder's own account of what it did.
    pub fn remove(mut self) -> Result<HolderSummary, LabError> {
        self.shutdown()
    }

    fn iptables_rule(&self, op: &str) -> Result<(), LabError> {
        let ipt = self.iptables.to_string_lossy().into_owned();
        let mut args: Vec<&str> = vec![&ipt, "-w", "-t", "nat", op];
        args.extend(self.rule.iter().map(String::as_str));
        let out = self.lab.exec(self.lab.node_ns(), &args);
        check(&args, out).map(|_| ())
    }

    fn shutdown(&mut self) -> Result<HolderSummary, LabError> {
        let rule_result = if self.rule_installed {
            self.rule_installed = false;
            self.iptables_rule("-D")
        } else {
            Ok(())
        };
        let summary = self.stop_holder();
        rule_result?;
        summary
    }

    fn stop_holder(&mut self) -> Result<HolderSummary, LabError> {
        let Some(mut child) = self.holder.take() else {
            return Ok(HolderSummary::default());
        };
        let label = format!("{HOLDER_BIN} (pid {})", child.id());
        // The child is not reaped yet, so its PID cannot have been reused.
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a PID we own and have not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let mut rest = String::new();
        if let Some(mut r) = self.stdout.take() {
            let _ = r.read_to_string(&mut rest);
        }
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        match status {
            Some(s) if s.success() => parse_summary(&rest).ok_or_else(|| {
                invalid_data(format!("{label} printed no summary: {rest:?} {stderr:?}"))
            }),
            other => Err(LabError::Command {
                cmd: label,
                status: other.map_or_else(|| "killed after 3 s".to_owned(), |s| s.to_string()),
                stderr: stderr.trim().to_owned(),
            }),
        }
    }
}

impl Drop for RaceRig<'_> {
    fn drop(&mut self) {
        if self.rule_installed || self.holder.is_some() {
            if let Err(e) = self.shutdown() {
                eprintln!("lab {}: removing race rig: {e}", self.lab.prefix());
            }
        }
    }
}

fn invalid_data(msg: String) -> LabError {
    LabError::io(
        msg.clone(),
        std::io::Error::new(ErrorKind::InvalidData, msg),
    )
}

fn check(args: &[&str], out: Output) -> Result<String, LabError> {
    check_labeled(&args.join(" "), out)
}

fn check_labeled(label: &str, out: Output) -> Result<String, LabError> {
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(LabError::Command {
        cmd: label.to_owned(),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

#[cfg(test)]
mod tests;

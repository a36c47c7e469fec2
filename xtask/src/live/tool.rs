//! The tools measured: started in a lab namespace, watched until ready, stopped by a signal;
//! their stats records and the agent's metrics read back.
use anyhow::anyhow;
use std::{process::Stdio, time::Duration};

use lab::{
    watch::{keep_lines, Finished, Watched},
    Lab,
};
use serde_json::Value;

/// A process started in a lab namespace, its stdout filtered line by line (only lines
/// `keep` accepts are held, so hundreds of MB of records cost no memory), its stderr read.
pub(super) struct Tool(Watched<Vec<String>>);

impl Tool {
    pub(super) fn start(
        lab: &Lab,
        ns: &str,
        args: &[&str],
        keep: fn(&str) -> bool,
        ready: &str,
    ) -> crate::Result<Tool> {
        Self::start_cmd(lab, lab.command_in(ns, args), &args.join(" "), keep, ready)
    }

    /// [`Tool::start`] of a command made by the caller (`label` names it in errors).
    pub(super) fn start_cmd(
        lab: &Lab,
        mut cmd: std::process::Command,
        label: &str,
        keep: fn(&str) -> bool,
        ready: &str,
    ) -> crate::Result<Tool> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn");
        let child = lab.spawn(&mut cmd).map_err(|e| anyhow!("{label}: {e}"))?;
        let mut t = Tool(Watched::new(child, format!("`{label}`"), keep_lines(keep)));
        if let Err(e) = t.0.wait_for_stderr(ready, Duration::from_secs(30)) {
            let _ = t.stop(libc::SIGKILL);
            return Err(anyhow!("{e}"));
        }
        Ok(t)
    }

    /// Whether it has exited (polled, no wait).
    pub(super) fn exited(&mut self) -> bool {
        self.0.exited_within(Duration::ZERO)
    }

    pub(super) fn pid(&self) -> u32 {
        self.0.pid()
    }

    /// Signals it (SIGINT, as Ctrl-C), waits, and collects what it printed: the lines kept
    /// as `stdout`.
    pub(super) fn stop(self, sig: i32) -> Finished<Vec<String>> {
        self.0.signal(sig);
        self.0.finish()
    }
}

pub(super) fn is_stats(line: &str) -> bool {
    line.contains("\"type\":\"stats\"")
}

/// The last `stats` record among `lines`.
pub(super) fn last_stats(lines: &[String]) -> Option<Value> {
    lines
        .iter()
        .rev()
        .filter(|l| is_stats(l))
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
}

/// Sum of the samples of `metric` (any labels) in a Prometheus exposition; `labels` must
/// appear in the sample's label set.
pub(super) fn metric(scrape: &str, metric: &str, labels: &str) -> Option<u64> {
    let mut found = false;
    let sum: f64 = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            (name == metric && rest.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .inspect(|_| found = true)
        .sum();
    found.then_some(sum as u64)
}

/// The agent's metrics address, inside the lab's node namespace.
pub(super) const AGENT_LISTEN: &str = "127.0.0.1:9253";

/// The body of the agent's endpoint `path` (`/readyz`, `/metrics`), if it answered with
/// success within 5 s.
pub(super) fn agent_get(lab: &Lab, path: &str) -> Option<String> {
    let url = format!("http://{AGENT_LISTEN}{path}");
    let o = lab.exec(lab.node_ns(), &["curl", "-sf", "-m", "5", &url]);
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

//! Restarts and their reasons, from kubelet's per-container log files (no API server):
//! `/var/log/pods/<namespace>_<pod>_<uid>/<container>/<N>.log`, one `N` per start of the
//! container (the restart count); the one before the newest is what `kubectl logs --previous`
//! shows. Each line is in the CRI log format, `TIMESTAMP STREAM TAG MESSAGE`
//! (`2026-12-02T10:00:00.000000000Z stderr F [FATAL] plugin/loop: …`), a `P` tag marking a
//! line the runtime split (joined here with what follows).
//!
//! Searched for, in the last [`TAIL_BYTES`] of each file: CoreDNS's loop plugin exiting
//! (`plugin/loop: Loop (…) detected`), a failed bind of port 53 (CoreDNS, dnsmasq, unbound,
//! dnsdist), and a Corefile that does not parse. Hostile bytes are taken lossily and escaped
//! by the text output; nothing here panics on any file.
use std::{
    fs::{self, File},
    io::{Read, Seek, SeekFrom},
    path::Path,
};

use super::finding::{Finding, FindingKind};
use crate::{host, kube::logs::parse_pod_dir};

/// Read of each log file: its end, where a crashed container's last words are.
pub const TAIL_BYTES: u64 = 64 * 1024;
/// Pod directories and containers looked at (kubelet's `--max-pods` is 110 by default).
const MAX_PODS: usize = 4096;
const MAX_CONTAINERS: usize = 64;
/// Log files of one container looked at (kubelet keeps the current and the previous one).
const MAX_LOGS: usize = 8;
/// Longest log line kept as evidence.
const MAX_LINE: usize = 400;

/// Why a container stopped, as its log says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    LoopPlugin,
    Bind53,
    ConfigParse,
}

impl Reason {
    fn kind(self) -> FindingKind {
        match self {
            Reason::LoopPlugin => FindingKind::LoopPluginExit,
            Reason::Bind53 => FindingKind::Port53BindFailure,
            Reason::ConfigParse => FindingKind::ConfigParseError,
        }
    }
}

/// The message of one CRI log line (`TIMESTAMP STREAM TAG MESSAGE`), and whether it is
/// partial (`P`). A line not in that format is taken whole (a runtime writing plain text).
pub fn cri_message(line: &str) -> (&str, bool) {
    let mut parts = line.splitn(4, ' ');
    let (Some(ts), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
        return (line, false);
    };
    let is_cri = ts.len() >= 20
        && ts.as_bytes().get(4) == Some(&b'-')
        && matches!(stream, "stdout" | "stderr")
        && (tag == "F" || tag == "P" || tag.starts_with("F:") || tag.starts_with("P:"));
    if !is_cri {
        return (line, false);
    }
    (parts.next().unwrap_or_default(), tag.starts_with('P'))
}

/// The reason a log message gives for a container stopping, if it is one of those known.
pub fn classify(msg: &str) -> Option<Reason> {
    if msg.contains("plugin/loop: Loop (") && msg.contains("detected") {
        return Some(Reason::LoopPlugin);
    }
    let bind = msg.contains("bind: address already in use")
        || msg.contains("bind: permission denied")
        || msg.contains("failed to create listening socket for port 53")
        || msg.contains("could not open port 53")
        || msg.contains("can't bind socket")
        || msg.contains("Unable to bind to");
    if bind && msg.contains("53") {
        return Some(Reason::Bind53);
    }
    // CoreDNS: `/etc/coredns/Corefile:3 - Error during parsing: Unknown directive 'foo'`.
    if msg.contains("Error during parsing") {
        return Some(Reason::ConfigParse);
    }
    None
}

/// The last `TAIL_BYTES` of `path`, lossily, starting at a whole line.
fn tail(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    if start > 0 {
        // The first line is cut: skip it.
        return Ok(text
            .split_once('\n')
            .map(|(_, rest)| rest.to_owned())
            .unwrap_or_default());
    }
    Ok(text)
}

/// The first message of `text` with a known reason, its partial lines joined.
pub fn scan(text: &str) -> Option<(Reason, String)> {
    let mut pending = String::new();
    for line in text.lines() {
        let (msg, partial) = cri_message(line);
        if pending.len() < MAX_LINE * 4 {
            pending.push_str(msg);
        }
        if partial {
            continue;
        }
        let whole = std::mem::take(&mut pending);
        if let Some(r) = classify(&whole) {
            let mut shown: String = whole.chars().take(MAX_LINE).collect();
            if shown.len() < whole.len() {
                shown.push('…');
            }
            return Some((r, shown));
        }
    }
    None
}

/// One container's restarts and what its logs say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerLogs {
    /// `namespace/pod`.
    pub pod: String,
    pub container: String,
    /// The highest `N` of `N.log`: kubelet's restart count.
    pub restarts: u32,
    /// (file, reason, the message) of each log file with a known reason, newest first.
    pub reasons: Vec<(String, Reason, String)>,
}

/// Every container under `<host root>/var/log/pods` whose logs give a known reason.
pub fn read_pod_logs() -> (Vec<ContainerLogs>, usize) {
    read_pod_logs_in(&host::path("/var/log/pods"))
}

/// As [`read_pod_logs`] under `dir`; also how many log files were read.
pub fn read_pod_logs_in(dir: &Path) -> (Vec<ContainerLogs>, usize) {
    let mut out = Vec::new();
    let mut files = 0;
    let Ok(pods) = fs::read_dir(dir) else {
        return (out, files);
    };
    let mut pods: Vec<_> = pods.flatten().take(MAX_PODS).collect();
    pods.sort_by_key(fs::DirEntry::file_name);
    for p in pods {
        let name = p.file_name().to_string_lossy().into_owned();
        let Some((ns, pod, _uid)) = parse_pod_dir(&name) else {
            continue;
        };
        let Ok(containers) = fs::read_dir(p.path()) else {
            continue;
        };
        let mut containers: Vec<_> = containers.flatten().take(MAX_CONTAINERS).collect();
        containers.sort_by_key(fs::DirEntry::file_name);
        for c in containers {
            let Ok(logs) = fs::read_dir(c.path()) else {
                continue;
            };
            let mut numbered: Vec<(u32, std::path::PathBuf)> = logs
                .flatten()
                .take(1024)
                .filter_map(|l| {
                    let n = l
                        .file_name()
                        .to_str()?
                        .strip_suffix(".log")?
                        .parse::<u32>()
                        .ok()?;
                    Some((n, l.path()))
                })
                .collect();
            numbered.sort_by_key(|n| std::cmp::Reverse(n.0));
            let restarts = numbered.first().map_or(0, |(n, _)| *n);
            let mut reasons = Vec::new();
            for (n, path) in numbered.iter().take(MAX_LOGS) {
                files += 1;
                let Ok(text) = tail(path) else { continue };
                if let Some((r, msg)) = scan(&text) {
                    reasons.push((format!("{n}.log"), r, msg));
                }
            }
            if !reasons.is_empty() {
                out.push(ContainerLogs {
                    pod: format!("{ns}/{pod}"),
                    container: c.file_name().to_string_lossy().into_owned(),
                    restarts,
                    reasons,
                });
            }
        }
    }
    (out, files)
}

/// One finding per container and reason.
pub fn restart_findings(logs: &[ContainerLogs]) -> Vec<Finding> {
    let mut out = Vec::new();
    for c in logs {
        let mut done: Vec<Reason> = Vec::new();
        for (file, reason, msg) in &c.reasons {
            if done.contains(reason) {
                continue;
            }
            done.push(*reason);
            let files: Vec<&str> = c
                .reasons
                .iter()
                .filter(|(_, r, _)| r == reason)
                .map(|(f, _, _)| f.as_str())
                .collect();
            let who = format!("{}/{}", c.pod, c.container);
            let when = if c.restarts > 0 {
                format!("restarted {} time(s)", c.restarts)
            } else {
                "not restarted yet".to_owned()
            };
            let (seen, why, fix) = match reason {
                Reason::LoopPlugin => (
                    format!("{who} exited on CoreDNS's loop plugin ({when}): its forwarding leads back to itself"),
                    "The loop plugin sends a random HINFO query to itself at start; seeing it come back it exits with `plugin/loop: Loop (…) detected`, and the pod goes into CrashLoopBackOff: cluster DNS has fewer (or no) servers.",
                    "Find the loop: CoreDNS's `forward . /etc/resolv.conf` takes the node's resolv.conf (dnsPolicy: Default), which on systemd-resolved nodes is the stub 127.0.0.53 — CoreDNS's own loopback. Set kubelet's `resolvConf: /run/systemd/resolve/resolv.conf` (the real upstreams), or replace `forward . /etc/resolv.conf` with the upstream resolvers' addresses; never forward to the cluster DNS Service.",
                ),
                Reason::Bind53 => (
                    format!("{who} could not bind port 53 ({when})"),
                    "A server that cannot listen answers nothing: the pod exits or runs without serving, and queries sent to it are refused or time out.",
                    "Something else holds port 53 in that namespace (a second server, a hostNetwork pod on a node with systemd-resolved's stub or dnsmasq): stop it or bind another address (`bind` plugin, `listen-address`), and keep `NET_BIND_SERVICE` in the container's capabilities.",
                ),
                Reason::ConfigParse => (
                    format!("{who}'s configuration does not parse ({when})"),
                    "CoreDNS exits at start on a Corefile it cannot parse; a `reload` of a bad Corefile keeps the old one, so the edit silently does nothing until the next restart, which then fails.",
                    "Fix the line named in the error (`kubectl -n kube-system edit configmap coredns`), then `kubectl -n kube-system rollout restart deployment coredns`.",
                ),
            };
            let mut f = Finding::new(reason.kind(), who.clone(), seen);
            f.count = u64::from(c.restarts.max(1));
            f.why = why.into();
            f.evidence = vec![format!("{file}: {msg}")];
            if files.len() > 1 {
                f.evidence
                    .push(format!("the same in {}", files[1..].join(", ")));
            }
            f.evidence.push(format!(
                "restart count {} (kubelet's log {}.log is the current one; `kubectl logs --previous` shows {})",
                c.restarts,
                c.restarts,
                if c.restarts > 0 {
                    format!("{}.log", c.restarts - 1)
                } else {
                    "nothing".to_owned()
                }
            ));
            f.fix = fix.into();
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOP: &str = "2026-12-02T10:00:00.000000000Z stderr F [FATAL] plugin/loop: Loop (127.0.0.1:41727 -> :53) detected for zone \".\", see https://coredns.io/plugins/loop#troubleshooting. Query: \"HINFO 4547991504243258144.3688648895315093531.\"";

    #[test]
    fn cri_lines_and_reasons() {
        let (m, p) = cri_message(LOOP);
        assert!(!p);
        assert!(m.starts_with("[FATAL] plugin/loop: Loop (127.0.0.1:41727"));
        assert_eq!(classify(m), Some(Reason::LoopPlugin));
        assert_eq!(
            classify("Listen: listen tcp :53: bind: address already in use"),
            Some(Reason::Bind53)
        );
        assert_eq!(
            classify("dnsmasq: failed to create listening socket for port 53: Address in use"),
            Some(Reason::Bind53)
        );
        assert_eq!(
            classify("/etc/coredns/Corefile:3 - Error during parsing: Unknown directive 'forwad'"),
            Some(Reason::ConfigParse)
        );
        assert_eq!(
            classify("[INFO] plugin/reload: Running configuration SHA512"),
            None
        );
        assert_eq!(
            classify("[INFO] 10.0.0.1:53 - 1 \"A IN x. udp\" NOERROR"),
            None
        );
        // Not CRI: taken whole; a short line is no panic.
        assert_eq!(cri_message("a b"), ("a b", false));
        assert_eq!(cri_message(""), ("", false));
    }

    #[test]
    fn partial_lines_are_joined() {
        let text = "2026-12-02T10:00:00.000000000Z stderr P [FATAL] plugin/loop: Loop (127.0.0.1:1 -> :53) \n2026-12-02T10:00:00.000000001Z stderr F detected for zone \".\"\n";
        let (r, msg) = scan(text).unwrap();
        assert_eq!(r, Reason::LoopPlugin);
        assert!(msg.ends_with("detected for zone \".\""), "{msg}");
    }

    #[test]
    fn a_log_tree_gives_restarts_and_findings() {
        let dir = std::env::temp_dir().join(format!("dnspath-restarts-{}", std::process::id()));
        let c = dir.join("kube-system_coredns-abc_0f5c5b56-4c0a/coredns");
        fs::create_dir_all(&c).unwrap();
        fs::write(c.join("0.log"), format!("{LOOP}\n")).unwrap();
        fs::write(c.join("1.log"), format!("{LOOP}\n")).unwrap();
        fs::write(
            c.join("2.log"),
            "2026-12-02T10:00:01.000000000Z stdout F .:53\n",
        )
        .unwrap();
        let healthy = dir.join("default_web_1234/app");
        fs::create_dir_all(&healthy).unwrap();
        fs::write(
            healthy.join("0.log"),
            "2026-12-02T10:00:01.000000000Z stdout F ok\n",
        )
        .unwrap();
        fs::create_dir_all(dir.join("not-a-pod-dir/x")).unwrap();
        let (logs, files) = read_pod_logs_in(&dir);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(files, 4);
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert_eq!(logs[0].pod, "kube-system/coredns-abc");
        assert_eq!(logs[0].restarts, 2);
        let f = restart_findings(&logs);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::LoopPluginExit);
        assert_eq!(f[0].subject, "kube-system/coredns-abc/coredns");
        assert!(
            f[0].evidence[0].starts_with("1.log: [FATAL] plugin/loop"),
            "{:?}",
            f[0].evidence
        );
        assert_eq!(f[0].evidence[1], "the same in 0.log");
        assert!(
            f[0].evidence[2].contains("shows 1.log"),
            "{:?}",
            f[0].evidence
        );
    }

    #[test]
    fn hostile_bytes_do_not_panic() {
        for s in [
            "\u{0}\u{1b}[31m",
            "ÿÿÿ 53 bind: address already in use",
            "P P P P",
        ] {
            let _ = scan(s);
        }
    }
}

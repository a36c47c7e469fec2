#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! How `dnspath trace` ends: every way out (a closed pipe, SIGHUP, bad flags) is clean,
//! and none leaves its pinned maps in /sys/fs/bpf behind.
//! Run as root with `--test-threads=1` (`cargo xtask test`).
use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use lab::{tracer::dnspath_bin, Lab};

use crate::shared::lab;

/// Where a dnspath of this pid pins its maps (the host's bpffs).
fn pin_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/dnspath-{pid}"))
}

/// A `dnspath trace` in the lab's node namespace, entered with `nsenter --net` (not
/// `ip netns exec`, whose private /sys would hide the pin directory from us).
struct Run {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Run {
    fn start(lab: &Lab, args: &[&str]) -> Run {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", lab.node_ns()))
            .arg(dnspath_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn");
        let mut child = lab.spawn(&mut cmd).unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut run = Run {
            child,
            stderr: rx,
            seen: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !run.seen.iter().any(|l| l.contains("dnspath: tracing")) {
            let left = deadline.saturating_duration_since(Instant::now());
            match run.stderr.recv_timeout(left) {
                Ok(l) => run.seen.push(l),
                Err(_) => panic!("dnspath did not start: {:?}", run.seen),
            }
        }
        run
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the exit, asking the client pod a question now and then
    /// (so that there is output to write); returns the exit status and all of stderr.
    fn wait_querying(
        &mut self,
        lab: &Lab,
        timeout: Duration,
    ) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "dnspath still running after {timeout:?}: {:?}",
                self.seen
            );
            let _ = lab.dig(&["+time=1", "+tries=1", "www.lab.test.", "A"]);
            thread::sleep(Duration::from_millis(100));
        };
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(300)) {
            self.seen.push(l);
        }
        (status, self.seen.join("\n"))
    }
}

/// `dnspath trace -o json | head -1`: the reader leaves after one line; the next write
/// fails with EPIPE, and dnspath stops, detaches, removes its pins and exits 0, quietly.
#[test]
fn closed_pipe_exits_quietly_and_unpins() {
    let Some(lab) = lab() else {
        return;
    };
    let mut run = Run::start(&lab, &["trace", "-o", "json", "--view", "packets"]);
    let pid = run.pid();
    assert!(pin_dir(pid).is_dir(), "no pin directory while tracing");
    // `head -1`: read one line, then close the pipe.
    let out = run.child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let (status, stderr) = run.wait_querying(&lab, Duration::from_secs(30));
    let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(v["type"], "packet", "{first}");
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        !stderr.contains("Broken pipe") && !stderr.contains("error"),
        "not quiet: {stderr}"
    );
    assert!(
        !pin_dir(pid).exists(),
        "{} left behind",
        pin_dir(pid).display()
    );
}

/// SIGHUP (the terminal closed, an ssh session dropped) ends a run as SIGTERM does: the
/// stats line is written and the pins are removed.
#[test]
fn sighup_stops_cleanly_and_unpins() {
    let Some(lab) = lab() else {
        return;
    };
    let mut run = Run::start(&lab, &["trace", "--view", "packets"]);
    let pid = run.pid();
    assert!(pin_dir(pid).is_dir(), "no pin directory while tracing");
    let _ = lab.dig(&["+time=1", "+tries=1", "www.lab.test.", "A"]);
    // SAFETY: plain kill(2) on our own child's PID, which we have not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGHUP);
    }
    let (status, stderr) = run.wait_querying(&lab, Duration::from_secs(15));
    assert!(status.success(), "{status:?}: {stderr}");
    let stdout = std::io::read_to_string(run.child.stdout.take().unwrap()).unwrap();
    assert!(stdout.contains("--- "), "no stats line: {stdout}");
    assert!(stdout.contains("www.lab.test."), "{stdout}");
    assert!(
        !pin_dir(pid).exists(),
        "{} left behind",
        pin_dir(pid).display()
    );
}

/// Flags that would make a run capture nothing, or never end, are refused up front with
/// one line naming the flag, before anything is loaded (so this needs no root).
#[test]
fn bad_flags_are_one_line_errors() {
    for (args, want) in [
        (&["--port", "0"][..], "--port 0 is not a port"),
        (
            &["--port", "53", "--port", "0"][..],
            "--port 0 is not a port",
        ),
        (
            &["--count", "0"][..],
            "--count 0 would stop before the first packet",
        ),
        (
            &["--duration", "1e10"][..],
            "--duration 10000000000 is too long",
        ),
        (
            &["--duration", "0"][..],
            "--duration must be a positive number",
        ),
        (
            &["--timeout", "inf"][..],
            "--timeout must be a positive number",
        ),
    ] {
        let o = Command::new(dnspath_bin())
            .arg("trace")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line expected: {err}");
        assert!(err.starts_with("dnspath: "), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// Without CAP_SYS_ADMIN, entering a namespace (`--netns`) fails with EPERM: the error
/// names the capability, on one line.
#[test]
fn missing_cap_sys_admin_is_named() {
    let Some(lab) = lab() else {
        return;
    };
    let bin = dnspath_bin();
    let o = Command::new("setpriv")
        .args(["--bounding-set=-sys_admin", "--inh-caps=-sys_admin"])
        .arg(&bin)
        .args(["trace", "--netns", lab.client_ns(), "--duration", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("dnspath: ") && last.contains("needs CAP_SYS_ADMIN"),
        "{err}"
    );
    assert!(!last.starts_with("dnspath: setns"), "{err}");
}

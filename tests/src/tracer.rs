//! Running the real `dnspath` binary inside a lab namespace, for tests and the demo.
use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use crate::{
    watch::{read_all, Watched},
    Lab, LabError,
};

/// The `dnspath` binary: `$DNSPATH_BIN`, else the workspace's release build, else debug.
pub fn dnspath_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("DNSPATH_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let release = root.join("target/release/dnspath");
    if release.exists() {
        release
    } else {
        root.join("target/debug/dnspath")
    }
}

/// A running `dnspath trace`.
pub struct Tracer {
    run: Watched<String>,
}

/// What a finished run printed.
#[derive(Debug)]
pub struct TracerOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl TracerOutput {
    /// The records of a run that must have succeeded (`-o json`), as [`ndjson`] parses and
    /// checks them; a failed run fails the test with its exit status and stderr.
    pub fn records(&self) -> Vec<serde_json::Value> {
        assert!(
            self.status.success(),
            "dnspath failed: {:?}\nstderr:\n{}",
            self.status,
            self.stderr
        );
        ndjson(&self.stdout)
    }
}

impl Tracer {
    /// Starts `dnspath ARGS` in namespace `ns` and waits until it says it is tracing
    /// (or fails).
    pub fn start(lab: &Lab, ns: &str, args: &[&str]) -> Result<Tracer, LabError> {
        Self::start_with(lab, ns, args, true)
    }

    /// `dnspath trace -o json --view transactions EXTRA` in the lab's node namespace (the
    /// start most tests share), once it is tracing.
    pub fn transactions(lab: &Lab, extra: &[&str]) -> Result<Tracer, LabError> {
        let mut args = vec!["trace", "-o", "json", "--view", "transactions"];
        args.extend_from_slice(extra);
        Self::start(lab, lab.node_ns(), &args)
    }

    /// As [`Tracer::start`]; with `capture_stdout` false the output goes to our stdout (the
    /// demo shows it live).
    pub fn start_with(
        lab: &Lab,
        ns: &str,
        args: &[&str],
        capture_stdout: bool,
    ) -> Result<Tracer, LabError> {
        Self::start_waiting(lab, ns, args, capture_stdout, Duration::from_secs(30))
    }

    /// As [`Tracer::start_with`], waiting up to `timeout` for it to say it is tracing
    /// (loading takes longer in an emulated VM).
    pub fn start_waiting(
        lab: &Lab,
        ns: &str,
        args: &[&str],
        capture_stdout: bool,
        timeout: Duration,
    ) -> Result<Tracer, LabError> {
        Self::start_under(lab, ns, &[], args, capture_stdout, timeout)
    }

    /// As [`Tracer::start_waiting`], with `dnspath ARGS` run by the command `wrapper`
    /// (e.g. `unshare -m sh -c '…; "$@"' sh`, for a mount of its own).
    pub fn start_under(
        lab: &Lab,
        ns: &str,
        wrapper: &[&str],
        args: &[&str],
        capture_stdout: bool,
        timeout: Duration,
    ) -> Result<Tracer, LabError> {
        let bin = dnspath_bin();
        let bin = bin.to_string_lossy().into_owned();
        let mut all = wrapper.to_vec();
        all.push(bin.as_str());
        all.extend_from_slice(args);
        let mut cmd = lab.command_in(ns, &all);
        cmd.stdin(Stdio::null())
            .stdout(if capture_stdout {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn");
        let child = lab.spawn(&mut cmd)?;
        let mut t = Tracer {
            run: Watched::new(child, "dnspath", read_all),
        };
        t.wait_for_stderr("dnspath: tracing", timeout)?;
        Ok(t)
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> Result<(), LabError> {
        self.run.wait_for_stderr(needle, timeout)
    }

    pub fn pid(&self) -> u32 {
        self.run.pid()
    }

    /// SIGINT, as Ctrl-C would, then collects the output.
    pub fn stop(self) -> TracerOutput {
        self.run.signal(libc::SIGINT);
        self.wait()
    }

    /// Waits for it to exit by itself (`--duration`, `--count`, an error).
    pub fn wait(self) -> TracerOutput {
        let done = self.run.finish();
        TracerOutput {
            status: done
                .status
                .unwrap_or_else(|| std::os::unix::process::ExitStatusExt::from_raw(-1)),
            stdout: done.stdout,
            stderr: done.stderr,
        }
    }
}

/// Whether this process may build labs and load eBPF programs.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a test that needs root (`why`) may run. Without root a test must not pass as if
/// it had run: it fails, saying how to run it — unless `DNSPATH_SKIP_ROOT_TESTS=1` asks to
/// skip such tests, which then say so (`SKIPPED`) and return `false`. CI runs as root.
pub fn root_or_skip(why: &str) -> bool {
    if is_root() {
        return true;
    }
    if skip_root_tests() {
        eprintln!("SKIPPED: needs root ({why}); DNSPATH_SKIP_ROOT_TESTS=1");
        return false;
    }
    panic!(
        "this test needs root ({why}): run `cargo xtask test` as root, or set \
         DNSPATH_SKIP_ROOT_TESTS=1 to skip the tests that need it"
    );
}

/// Whether `DNSPATH_SKIP_ROOT_TESTS=1` asks to skip tests the machine cannot run as root would.
pub fn skip_root_tests() -> bool {
    std::env::var_os("DNSPATH_SKIP_ROOT_TESTS").is_some_and(|v| v == "1")
}

/// Fails the test unless every tool is on PATH (`cargo xtask setup` installs them: a test
/// must not pass without running), and the dnspath binary is built.
pub fn require_tools(tools: &[&str]) {
    let have = |tool: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()))
    };
    if let Some(missing) = tools.iter().find(|t| !have(t)) {
        panic!("{missing} is not installed: `cargo xtask setup` installs it");
    }
    assert!(
        dnspath_bin().exists(),
        "dnspath binary missing at {}; run `cargo xtask test`",
        dnspath_bin().display()
    );
}

/// A lab for a test, or `None` when root tests are skipped ([`root_or_skip`]).
pub fn lab_or_skip(cfg: crate::LabConfig) -> Option<Lab> {
    if !root_or_skip("network namespaces, eBPF") {
        return None;
    }
    match Lab::start(cfg) {
        Ok(lab) => Some(lab),
        Err(e) => panic!("lab: {e}"),
    }
}

/// `dnspath -o json` output, one value per line; a line that is not JSON fails the test.
/// Parses dnspath's NDJSON output; every `stats` record in it must account for every
/// packet ([`assert_accounted`]).
pub fn ndjson(stdout: &str) -> Vec<serde_json::Value> {
    let recs: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad NDJSON {l:?}: {e}")))
        .collect();
    for s in recs.iter().filter(|r| r["type"] == "stats") {
        assert_accounted(s);
    }
    recs
}

/// The last `stats` record among `recs` (a run writes its final one last); fails the test
/// if there is none.
pub fn last_stats(recs: &[serde_json::Value]) -> &serde_json::Value {
    recs.iter()
        .rev()
        .find(|r| r["type"] == "stats")
        .unwrap_or_else(|| panic!("no stats record among {} records", recs.len()))
}

/// The accounting docs/output.md promises (`stats`): every packet that reached userspace is
/// counted once — decoded, cut by the capture, malformed, TCP control or data (whose bytes end
/// in messages), an IP fragment merged into a datagram or of one that never completed, other,
/// or summarised — and, live, the kernel matched no fewer packets than
/// were read or lost.
pub fn assert_accounted(stats: &serde_json::Value) {
    let n = |k: &str| {
        stats[k]
            .as_u64()
            .unwrap_or_else(|| panic!("stats.{k} missing: {stats}"))
    };
    let per_packet = n("decoded") + n("capture_truncated") + n("malformed") - n("tcp_messages")
        + n("tcp_control")
        + n("tcp_data")
        + n("other")
        + n("summarised")
        + n("fragments_merged")
        + n("fragments_incomplete")
        + n("fragments_pending");
    assert_eq!(
        n("packets"),
        per_packet,
        "packets not accounted for (decoded + capture_truncated + malformed - tcp_messages + tcp_control + tcp_data + other + summarised): {stats}"
    );
    if let Some(matched) = stats["kernel"]["packets_matched"].as_u64() {
        assert!(
            n("packets") + n("lost") <= matched,
            "more packets read or lost than the kernel matched: {stats}"
        );
        let shed = stats["kernel"]["packets_shed"].as_u64().unwrap_or(0);
        assert_eq!(
            matched,
            n("packets") + n("lost") + n("unread") + shed,
            "kernel-matched packets neither read, lost, unread nor shed: {stats}"
        );
        // Every packet the kernel only counted reached the stats (and its loop).
        assert_eq!(
            n("shed"),
            shed,
            "kernel-shed packets not all reported: {stats}"
        );
    }
}

/// `dnspath trace -o json --view transactions --netns NS…` run by a test as one node's
/// tracer (as that node's DaemonSet pod sees the node), with `extra` arguments; its NDJSON to
/// `DIR/NAME.ndjson`, its stderr to `DIR/NAME.stderr`. Returned once it says it is tracing;
/// killed if dropped before [`NodeTracer::stop`].
pub struct NodeTracer {
    child: Option<std::process::Child>,
    name: String,
    out: PathBuf,
    err: PathBuf,
}

impl NodeTracer {
    pub fn start(
        dir: &Path,
        name: &str,
        netns: &[&str],
        extra: &[&str],
    ) -> Result<NodeTracer, LabError> {
        let out = dir.join(format!("{name}.ndjson"));
        let err = dir.join(format!("{name}.stderr"));
        let mut args = vec!["trace", "-o", "json", "--view", "transactions"];
        for ns in netns {
            args.extend(["--netns", ns]);
        }
        args.extend(extra);
        let file = |p: &Path| {
            std::fs::File::create(p).map_err(|e| LabError::io(p.display().to_string(), e))
        };
        let child = std::process::Command::new(dnspath_bin())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(file(&out)?)
            .stderr(file(&err)?)
            .env("RUST_LOG", "warn")
            .spawn()
            .map_err(|source| LabError::Spawn {
                cmd: format!("dnspath {}", args.join(" ")),
                source,
            })?;
        let t = NodeTracer {
            child: Some(child),
            name: name.to_owned(),
            out,
            err,
        };
        let t0 = std::time::Instant::now();
        loop {
            let stderr = std::fs::read_to_string(&t.err).unwrap_or_default();
            if stderr.contains("dnspath: tracing") {
                return Ok(t);
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(LabError::NotPrinted {
                    process: format!("dnspath trace ({name})"),
                    needle: "dnspath: tracing".into(),
                    stderr,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGINT (it flushes and exits 0), then its NDJSON records.
    pub fn stop(mut self) -> Result<Vec<serde_json::Value>, LabError> {
        let Some(mut child) = self.child.take() else {
            return Ok(Vec::new());
        };
        // SAFETY: kill(2) on our own child's PID, not yet reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let status = child
            .wait()
            .map_err(|e| LabError::io(format!("waiting for {}", self.name), e))?;
        if !status.success() {
            return Err(LabError::Command {
                cmd: format!("dnspath trace ({})", self.name),
                status: status.to_string(),
                stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
            });
        }
        let out = std::fs::read_to_string(&self.out)
            .map_err(|e| LabError::io(self.out.display().to_string(), e))?;
        Ok(ndjson(&out))
    }
}

impl Drop for NodeTracer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

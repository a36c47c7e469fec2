//! One run of the `kernel_matrix` test: in a VM booted with virtme-ng, or on the host, each
//! writing its report, exit code and logs into a directory of its own.
use anyhow::anyhow;
use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::{
    report::{failures_of, read_report, Row},
    setup::vng,
};
use crate::{cmd::workspace_root, Result};

/// Per kernel at most: boot (20-70 s under TCG; 5.10's udev coldplug takes up to 6 min
/// when the host is busy), the lab test (1-3 min emulated; loading the programs alone took
/// 71 s on 5.10 on a busy host), power-off.
/// `DNSPATH_VM_TIMEOUT=SECONDS` overrides it.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
const HOST_TIMEOUT: Duration = Duration::from_secs(180);
/// What the lab needs that a distribution kernel builds as modules; loaded in the guest
/// before the test (most would autoload; this makes a missing one visible in the log).
const GUEST_MODULES: &[&str] = &[
    "veth",
    "tun",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_nat",
    "nf_tables",
    "nft_compat",
    "nft_chain_nat",
    "ip_tables",
    "iptable_filter",
    "iptable_nat",
    "ip6_tables",
    "ip6table_filter",
    "ip6table_nat",
    "xt_conntrack",
    "xt_statistic",
    "xt_MASQUERADE",
    "xt_nat",
    "xt_mark",
    "xt_comment",
    "xt_addrtype",
    "xt_tcpudp",
    "sch_ingress",
    "cls_bpf",
];

/// Kills `child`'s whole process group (vng, its QEMU) and reaps it.
fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

fn guest_script(test_bin: &Path, bin: &Path, dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask vm-test`; runs inside the VM.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
date +%s > {d}/started
echo "guest: kernel $(uname -r), $(nproc) CPUs"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug
modprobe -q -a {modules} ||
  for m in {modules}; do modprobe -q "$m" || echo "guest: modprobe $m failed"; done
cd {root}
DNSPATH_BIN={bin} DNSPATH_MATRIX_REPORT={d}/report RUST_BACKTRACE=1 \
  {test} --test-threads=1 --nocapture > {d}/test.log 2>&1
echo $? > {d}/rc
tail -n 25 {d}/test.log
"#,
        modules = GUEST_MODULES.join(" "),
        root = workspace_root().display(),
        bin = bin.display(),
        test = test_bin.display(),
    )
}

fn fresh_dir(dir: &Path) -> Result<()> {
    for f in ["report", "rc", "started", "test.log", "vng.log", "guest.sh"] {
        let _ = fs::remove_file(dir.join(f));
    }
    fs::create_dir_all(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))
}

fn rc_of(dir: &Path) -> Option<i32> {
    fs::read_to_string(dir.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

pub(super) fn boot_timeout() -> Duration {
    std::env::var("DNSPATH_VM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(BOOT_TIMEOUT, Duration::from_secs)
}

/// Boots `release` and runs the test in it, for at most `timeout`.
pub(super) fn in_vm(
    release: &str,
    test_bin: &Path,
    bin: &Path,
    out: &Path,
    timeout: Duration,
) -> Result<Row> {
    let dir = out.join(release);
    fresh_dir(&dir)?;
    let script = dir.join("guest.sh");
    fs::write(&script, guest_script(test_bin, bin, &dir))
        .map_err(|e| anyhow!("{}: {e}", script.display()))?;
    let log = dir.join("vng.log");
    let log_file = fs::File::create(&log).map_err(|e| anyhow!("{}: {e}", log.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| anyhow!("{}: {e}", log.display()))?;
    eprintln!(
        "xtask: booting {release} (TCG, 2 CPUs; log {})",
        log.display()
    );
    let started = Instant::now();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(vng())
            .arg("-r")
            .arg(format!("/boot/vmlinuz-{release}"))
            // --verbose: the kernel's console in the log, to see where a boot hangs.
            .args([
                "--disable-kvm",
                "--rw",
                "--verbose",
                "--cpus",
                "2",
                "--memory",
                "2G",
                "--",
            ])
            .arg("sh")
            .arg(&script)
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|e| anyhow!("vng: {e} (run `cargo xtask setup`)"))?
    };
    let mut booted: Option<Duration> = None;
    let status = loop {
        if booted.is_none() && dir.join("started").exists() {
            booted = Some(started.elapsed());
        }
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= timeout => {
                kill_group(&mut child);
                break None;
            }
            Ok(None) => thread::sleep(Duration::from_millis(250)),
            Err(e) => return Err(anyhow!("waiting for vng: {e}")),
        }
    };
    let total = started.elapsed();
    let timing = match booted {
        Some(b) => format!(
            "boot {} s, test {} s",
            b.as_secs(),
            total.saturating_sub(b).as_secs()
        ),
        None => format!("no boot after {} s", total.as_secs()),
    };
    let report = read_report(&dir.join("report"));
    let rc = rc_of(&dir);
    let harness = match (status, booted, rc) {
        (None, None, _) => Some(format!(
            "guest did not start the test within {} s",
            timeout.as_secs()
        )),
        (None, Some(_), _) => Some(format!("timed out after {} s", timeout.as_secs())),
        (Some(s), None, _) => Some(format!("vng exited ({s}) before the guest ran the test")),
        (_, _, None) => Some("the test did not finish (no exit code; guest crashed?)".to_owned()),
        _ => None,
    };
    let fallback = format!("test exited with {rc:?} without a failed check");
    let not_run = (status.is_none() && booted.is_none()).then(|| {
        format!(
            "the emulated VM did not boot within {} s: infrastructure, not a verdict on dnspath",
            timeout.as_secs()
        )
    });
    let failures = if not_run.is_some() {
        Vec::new()
    } else {
        failures_of(&report, rc, harness, &fallback)
    };
    Ok(Row {
        release: release.to_owned(),
        place: "vm",
        failures,
        report,
        timing,
        logs: vec![log, dir.join("test.log")],
        not_run,
    })
}

/// The test on the host kernel itself.
pub(super) fn on_host(test_bin: &Path, bin: &Path, out: &Path) -> Result<Row> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    let dir = out.join(format!("host-{release}"));
    fresh_dir(&dir)?;
    let log = dir.join("test.log");
    let log_file = fs::File::create(&log).map_err(|e| anyhow!("{}: {e}", log.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| anyhow!("{}: {e}", log.display()))?;
    eprintln!("xtask: host kernel {release}");
    let started = Instant::now();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(test_bin)
            .args(["--test-threads=1", "--nocapture"])
            .env("DNSPATH_BIN", bin)
            .env("DNSPATH_MATRIX_REPORT", dir.join("report"))
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|e| anyhow!("{}: {e}", test_bin.display()))?
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= HOST_TIMEOUT => {
                kill_group(&mut child);
                break None;
            }
            Ok(None) => thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(anyhow!("waiting for the test: {e}")),
        }
    };
    let report = read_report(&dir.join("report"));
    let rc = status.and_then(|s| s.code());
    let harness = status
        .is_none()
        .then(|| format!("timed out after {} s", HOST_TIMEOUT.as_secs()));
    let fallback = format!("test exited ({status:?}) without a failed check");
    Ok(Row {
        release,
        place: "host",
        failures: failures_of(&report, rc, harness, &fallback),
        report,
        timing: format!("test {} s", started.elapsed().as_secs()),
        logs: vec![log],
        not_run: None,
    })
}

//! `cargo xtask vm-test`: dnspath on the kernels nodes run. Each of Debian's kernels in
//! [`KERNELS`] boots in a VM (virtme-ng, QEMU without KVM) with this machine's userspace and
//! runs the `kernel_matrix` lab test (tests/tests/kernel_matrix.rs) there; then the same test
//! runs on the host kernel. One line per kernel: release, attach mode, hooks, PASS/FAIL.
//! Logs and reports go to `target/vm/<release>/`.
use anyhow::anyhow;
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use lab::tracer::is_root;

use crate::{cmd::workspace_root, Result};

mod boot;
mod report;
mod setup;

use boot::{boot_timeout, in_vm, on_host};
use report::{tail, timeline, Row};
use setup::installed_kernel;
pub use setup::setup;

/// A Debian kernel series and the suite its newest build comes from.
pub struct Kernel {
    pub series: &'static str,
    pub suite: &'static str,
}

/// The kernels nodes run (KERNEL.md): 5.10 (EKS AL2), 6.1 (Debian 12, AL2023, COS),
/// 6.12 (Debian 13). The one place the VM matrix is defined; setup installs the newest
/// `linux-image-<series>.*` of each suite unless some `/boot/vmlinuz-<series>.*` exists.
/// 5.10 comes last: it boots slowest under TCG (udev settling takes 1–5 min), so it gets
/// what the others leave of [`VM_STAGE_BUDGET`].
pub const KERNELS: &[Kernel] = &[
    Kernel {
        series: "6.1",
        suite: "bookworm-security",
    },
    Kernel {
        series: "6.12",
        suite: "bookworm-backports",
    },
    Kernel {
        series: "5.10",
        suite: "bullseye-security",
    },
];
/// All VMs together stay within this: a kernel gets what is left, less
/// [`MIN_PER_KERNEL`] for each one after it.
const VM_STAGE_BUDGET: Duration = Duration::from_secs(1500);
const MIN_PER_KERNEL: Duration = Duration::from_secs(150);

/// Builds the `kernel_matrix` test binary and returns its path.
fn build_test_binary() -> Result<PathBuf> {
    let out = Command::new("cargo")
        .current_dir(workspace_root())
        .args([
            "test",
            "--release",
            "-p",
            "dnspath-tests",
            "--test",
            "kernel_matrix",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| anyhow!("cargo test --no-run: {e}"))?;
    if !out.status.success() {
        // The JSON messages hide the compiler's errors: show them.
        let _ = Command::new("cargo")
            .current_dir(workspace_root())
            .args([
                "test",
                "--release",
                "-p",
                "dnspath-tests",
                "--test",
                "kernel_matrix",
                "--no-run",
            ])
            .status();
        return Err(anyhow!(
            "building the kernel_matrix test failed: {}",
            out.status
        ));
    }
    // One JSON message per line; the test's artifact names its executable.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"compiler-artifact\"") && l.contains("\"name\":\"kernel_matrix\""))
        .find_map(|l| {
            let rest = l.split("\"executable\":\"").nth(1)?;
            rest.split('"').next().map(PathBuf::from)
        })
        .ok_or_else(|| anyhow!("cargo did not name the kernel_matrix test executable"))
}

/// Where the guests write their results: `target/vm`, unless the workspace lies under
/// `/tmp` or `/run`, which virtme-ng gives the guest as private overlays (its writes there
/// never reach the host, as is `/var/tmp`); then under `/var/lib/dnspath-vm/runs/`.
fn out_dir() -> PathBuf {
    let root = workspace_root();
    let private = ["/tmp", "/run"].iter().any(|p| root.starts_with(p));
    if private {
        let name: String = root
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Path::new("/var/lib/dnspath-vm/runs").join(name)
    } else {
        root.join("target/vm")
    }
}

/// Every kernel of [`KERNELS`] in a VM, then the host; one line each. Fails if any failed.
/// `only` (e.g. `6.1`, `host`) narrows it to the named series.
pub fn run_matrix(bin: &Path, only: &[String]) -> Result<()> {
    let wanted = |series: &str| only.is_empty() || only.iter().any(|o| o == series);
    if !is_root() {
        eprintln!("xtask: vm-test skipped: the lab test needs root");
        return Ok(());
    }
    let out = out_dir();
    // Copies, so that a rebuild while the VMs run does not change what they test.
    let snap = out.join("bin");
    fs::create_dir_all(&snap).map_err(|e| anyhow!("{}: {e}", snap.display()))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf> {
        let to = snap.join(name);
        fs::copy(from, &to).map_err(|e| anyhow!("copying {}: {e}", from.display()))?;
        Ok(to)
    };
    let test_bin = copy(&build_test_binary()?, "kernel_matrix")?;
    let bin = &copy(bin, "dnspath")?;
    let started = Instant::now();
    let mut rows = Vec::new();
    let kernels: Vec<&Kernel> = KERNELS.iter().filter(|k| wanted(k.series)).collect();
    for (i, k) in kernels.iter().enumerate() {
        let Some(release) = installed_kernel(k.series) else {
            rows.push(Row {
                release: format!("{}.x", k.series),
                place: "vm",
                report: Vec::new(),
                failures: vec![format!(
                    "no /boot/vmlinuz-{}.* with modules (run `cargo xtask setup`)",
                    k.series
                )],
                timing: "not run".to_owned(),
                logs: Vec::new(),
                not_run: None,
            });
            continue;
        };
        let after = MIN_PER_KERNEL * u32::try_from(kernels.len() - i - 1).unwrap_or(0);
        let left = VM_STAGE_BUDGET
            .saturating_sub(started.elapsed())
            .saturating_sub(after)
            .max(MIN_PER_KERNEL);
        let row = in_vm(&release, &test_bin, bin, &out, boot_timeout().min(left))?;
        eprintln!("{}", row.line());
        rows.push(row);
    }
    if wanted("host") {
        let row = on_host(&test_bin, bin, &out)?;
        eprintln!("{}", row.line());
        rows.push(row);
    }

    eprintln!(
        "\n== kernel matrix ({} s; logs in {})",
        started.elapsed().as_secs(),
        out.display()
    );
    for row in &rows {
        eprintln!("{}", row.line());
        if let Some(why) = &row.not_run {
            eprintln!("    {why}");
        }
        for f in &row.failures {
            for (i, l) in f.split(" | ").take(14).enumerate() {
                eprintln!("    {}{l}", if i == 0 { "" } else { "  " });
            }
        }
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.failures.is_empty()).collect();
    for row in &failed {
        // A test that ran to its end explained itself above; its timeline is enough.
        // Otherwise (no boot, a hang, a crash) the guest's console and test output.
        let complete = row.get("step") == "done";
        // (The guest also copies the test's output to its console: show it once.)
        let logs = row
            .logs
            .iter()
            .filter(|l| l.exists() && (!complete || l.ends_with("test.log")));
        for log in logs {
            let text = if complete {
                timeline(log)
            } else {
                tail(log, 30)
            };
            if text.trim().is_empty() {
                continue;
            }
            eprintln!(
                "\n-- {} ({}): {} {}",
                row.release,
                row.place,
                if complete { "timeline from" } else { "tail of" },
                log.display()
            );
            eprintln!("{text}");
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(
            "kernel matrix: {} of {} kernels failed",
            failed.len(),
            rows.len()
        ))
    }
}

#[cfg(test)]
mod tests;

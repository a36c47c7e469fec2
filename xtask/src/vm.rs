//! `cargo xtask vm-test`: dnspath on the kernels nodes run. Each of Debian's kernels in
//! [`KERNELS`] boots in a VM (virtme-ng, QEMU without KVM) with this machine's userspace and
//! runs the `kernel_matrix` lab test (tests/tests/kernel_matrix.rs) there; then the same test
//! runs on the host kernel. One line per kernel: release, attach mode, hooks, PASS/FAIL.
//! Logs and reports go to `target/vm/<release>/`.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{install_packages, is_root, output_ok, run, workspace_root, Result};

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
/// The suites the kernels' dependencies (initramfs-tools, linux-base, kmod) come from:
/// this machine's release.
const BASE_SUITES: &[&str] = &["bookworm"];
/// The private apt source list and its package lists: the machine's own sources stay as
/// they are.
const APT_DIR: &str = "/var/lib/dnspath-vm/apt";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// QEMU, and the static busybox virtme-ng builds its initramfs from.
const VM_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "iproute2", "kmod"];
const VIRTME_NG_VERSION: &str = "1.42";
/// Per kernel at most: boot (20-70 s under TCG; 5.10's udev coldplug takes up to 6 min
/// when the host is busy), the lab test (1-3 min emulated; loading the programs alone took
/// 71 s on 5.10 on a busy host), power-off.
/// `DNSPATH_VM_TIMEOUT=SECONDS` overrides it.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// All VMs together stay within this: a kernel gets what is left, less
/// [`MIN_PER_KERNEL`] for each one after it.
const VM_STAGE_BUDGET: Duration = Duration::from_secs(1500);
const MIN_PER_KERNEL: Duration = Duration::from_secs(150);
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

/// `vng`: on PATH, or else in the scripts directory of the `python3` pip installed it for
/// (a fresh pyenv has no shim for it until `pyenv rehash`).
fn vng() -> PathBuf {
    let on_path = output_ok(Command::new("sh").args(["-c", "command -v vng"]))
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    if let Some(p) = on_path {
        return PathBuf::from(p);
    }
    output_ok(Command::new("python3").args([
        "-c",
        "import sysconfig; print(sysconfig.get_path('scripts'))",
    ]))
    .map(|dir| Path::new(dir.trim()).join("vng"))
    .filter(|p| p.exists())
    .unwrap_or_else(|| PathBuf::from("vng"))
}

fn sudo(prog: &str) -> Command {
    if is_root() {
        Command::new(prog)
    } else {
        let mut c = Command::new("sudo");
        c.arg(prog);
        c
    }
}

/// QEMU, virtme-ng and the kernels of [`KERNELS`]; quick when all are there.
pub fn setup() -> Result<()> {
    install_packages(VM_PACKAGES)?;
    let vng = output_ok(Command::new(vng()).arg("--version")).unwrap_or_default();
    if !vng.contains(VIRTME_NG_VERSION) {
        eprintln!("xtask: installing virtme-ng {VIRTME_NG_VERSION} (pip)");
        let pkg = format!("virtme-ng=={VIRTME_NG_VERSION}");
        let mut pip = sudo("python3");
        pip.args(["-m", "pip", "install", "-q", &pkg]);
        if run(&mut pip).is_err() {
            // Debian's own python refuses (PEP 668) unless told.
            let mut pip = sudo("python3");
            pip.args([
                "-m",
                "pip",
                "install",
                "-q",
                "--break-system-packages",
                &pkg,
            ]);
            run(&mut pip)?;
        }
    }
    let missing: Vec<&Kernel> = KERNELS
        .iter()
        .filter(|k| installed_kernel(k.series).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let lists = Path::new(APT_DIR).join("lists");
    let mut mkdir = sudo("mkdir");
    mkdir.arg("-p").arg(lists.join("partial"));
    run(&mut mkdir)?;
    let mut suites: Vec<&str> = BASE_SUITES.to_vec();
    suites.extend(KERNELS.iter().map(|k| k.suite));
    suites.sort_unstable();
    suites.dedup();
    let sources: String = suites
        .iter()
        .map(|s| {
            let archive = if s.ends_with("-security") {
                "debian-security"
            } else {
                "debian"
            };
            format!("deb [signed-by={KEYRING}] http://deb.debian.org/{archive} {s} main\n")
        })
        .collect();
    let list = Path::new(APT_DIR).join("sources.list");
    let mut tee = sudo("tee");
    tee.arg(&list).stdout(Stdio::null()).stdin(Stdio::piped());
    let mut child = tee
        .spawn()
        .map_err(|e| format!("tee {}: {e}", list.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(sources.as_bytes())
            .map_err(|e| format!("writing {}: {e}", list.display()))?;
    }
    let status = child.wait().map_err(|e| format!("tee: {e}"))?;
    if !status.success() {
        return Err(format!("writing {} failed: {status}", list.display()));
    }
    let opts = [
        "-o".to_owned(),
        format!("Dir::Etc::sourcelist={}", list.display()),
        "-o".to_owned(),
        "Dir::Etc::sourceparts=/dev/null".to_owned(),
        "-o".to_owned(),
        format!("Dir::State::Lists={}", lists.display()),
    ];
    let mut update = sudo("apt-get");
    update.args(&opts).args(["update", "-q"]);
    run(&mut update)?;
    let arch = output_ok(Command::new("dpkg").arg("--print-architecture"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "amd64".to_owned());
    let mut packages = Vec::new();
    for k in missing {
        let pattern = format!("^linux-image-{}[.]", k.series.replace('.', "[.]"));
        let found = output_ok(Command::new("apt-cache").args(&opts).args([
            "search",
            "--names-only",
            &pattern,
        ]))
        .unwrap_or_default();
        let newest = found
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| is_plain_image(name, k.series, &arch))
            .max_by_key(|name| numbers(name));
        match newest {
            Some(p) => packages.push(p.to_owned()),
            None => {
                return Err(format!(
                    "no linux-image-{}.*-{arch} in {} (apt lists in {APT_DIR})",
                    k.series, k.suite
                ))
            }
        }
    }
    eprintln!("xtask: installing kernels {}", packages.join(" "));
    let mut install = sudo("apt-get");
    install
        .args(&opts)
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(&mut install)
}

/// `linux-image-6.1.0-57-amd64`, `linux-image-6.12.117+deb12-amd64`: the signed generic
/// image, not `-cloud-`, `-rt-`, `-dbg` or `-unsigned`.
fn is_plain_image(name: &str, series: &str, arch: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("linux-image-")
        .and_then(|r| r.strip_suffix(&format!("-{arch}")))
    else {
        return false;
    };
    let plain = match rest.split_once("+deb") {
        Some((v, deb)) => deb.chars().all(|c| c.is_ascii_digit()).then_some(v),
        None => Some(rest),
    };
    plain.is_some_and(|v| {
        v.starts_with(&format!("{series}."))
            && v.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == '-')
    })
}

/// The numbers in a name, for ordering versions (`6.12.117+deb12` > `6.12.95+deb12`).
fn numbers(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The newest installed kernel release of `series`, e.g. `6.1.0-57-amd64`, whose image
/// and modules are both there.
fn installed_kernel(series: &str) -> Option<String> {
    let prefix = format!("vmlinuz-{series}.");
    fs::read_dir("/boot")
        .ok()?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(&prefix)
                .map(|r| format!("{series}.{r}"))
        })
        .filter(|rel| Path::new("/lib/modules").join(rel).is_dir())
        .max_by_key(|rel| numbers(rel))
}

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
        .map_err(|e| format!("cargo test --no-run: {e}"))?;
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
        return Err(format!(
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
        .ok_or_else(|| "cargo did not name the kernel_matrix test executable".to_owned())
}

/// One kernel's outcome.
struct Row {
    release: String,
    place: &'static str,
    report: Vec<(String, String)>,
    /// Why it failed, if it did: failed checks or the harness's own reason.
    failures: Vec<String>,
    timing: String,
    /// Logs whose tails explain a failure.
    logs: Vec<PathBuf>,
    /// The VM never got as far as starting the test (emulated boot too slow on a loaded
    /// machine): said loudly, not counted as a failure of dnspath.
    not_run: Option<String>,
}

impl Row {
    fn get(&self, key: &str) -> &str {
        self.report
            .iter()
            .find(|(k, _)| k == key)
            .map_or("?", |(_, v)| v.as_str())
    }

    fn line(&self) -> String {
        let verdict = if self.not_run.is_some() {
            "NOT RUN"
        } else if self.failures.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        format!(
            "{:<24} {:<4} attach {:<7} hooks {}  {verdict}  ({})",
            self.release,
            self.place,
            self.get("tc_attach"),
            self.get("hooks"),
            self.timing
        )
    }
}

fn read_report(path: &Path) -> Vec<(String, String)> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Failed checks from a report, then `harness` (the harness's own reason: a timeout, a
/// crash), or `fallback` if the test failed without saying why.
fn failures_of(
    report: &[(String, String)],
    rc: Option<i32>,
    harness: Option<String>,
    fallback: &str,
) -> Vec<String> {
    let mut f: Vec<String> = report
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("check.")?;
            v.strip_prefix("FAIL ").map(|e| format!("{name}: {e}"))
        })
        .collect();
    let step = report
        .iter()
        .find(|(k, _)| k == "step")
        .map(|(_, v)| v.as_str())
        .filter(|s| *s != "done");
    if let Some(h) = harness {
        f.push(match step {
            Some(step) => format!("{h}, during: {step}"),
            None => h,
        });
    } else if f.is_empty() && rc != Some(0) {
        f.push(fallback.to_owned());
    }
    f
}

/// The test's `kernel_matrix: [  12.3 s] ...` progress lines, each cut to one screen line.
fn timeline(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once("kernel_matrix: [").map(|(_, rest)| rest))
        .map(|l| {
            let l: String = l.chars().take(150).collect();
            format!("  [{l}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

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
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

fn rc_of(dir: &Path) -> Option<i32> {
    fs::read_to_string(dir.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn boot_timeout() -> Duration {
    std::env::var("DNSPATH_VM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(BOOT_TIMEOUT, Duration::from_secs)
}

/// Boots `release` and runs the test in it, for at most `timeout`.
fn in_vm(release: &str, test_bin: &Path, bin: &Path, out: &Path, timeout: Duration) -> Result<Row> {
    let dir = out.join(release);
    fresh_dir(&dir)?;
    let script = dir.join("guest.sh");
    fs::write(&script, guest_script(test_bin, bin, &dir))
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let log = dir.join("vng.log");
    let log_file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
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
            .map_err(|e| format!("vng: {e} (run `cargo xtask setup`)"))?
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
            Err(e) => return Err(format!("waiting for vng: {e}")),
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
fn on_host(test_bin: &Path, bin: &Path, out: &Path) -> Result<Row> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    let dir = out.join(format!("host-{release}"));
    fresh_dir(&dir)?;
    let log = dir.join("test.log");
    let log_file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
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
            .map_err(|e| format!("{}: {e}", test_bin.display()))?
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= HOST_TIMEOUT => {
                kill_group(&mut child);
                break None;
            }
            Ok(None) => thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("waiting for the test: {e}")),
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
    fs::create_dir_all(&snap).map_err(|e| format!("{}: {e}", snap.display()))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf> {
        let to = snap.join(name);
        fs::copy(from, &to).map_err(|e| format!("copying {}: {e}", from.display()))?;
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
        Err(format!(
            "kernel matrix: {} of {} kernels failed",
            failed.len(),
            rows.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn picks_the_newest_plain_image_of_a_series() {
        let names = [
            "linux-image-6.1.0-56-amd64",
            "linux-image-6.1.0-57-amd64",
            "linux-image-6.1.0-57-amd64-dbg",
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-6.1.0-57-cloud-amd64",
            "linux-image-6.1.0-57-rt-amd64",
            "linux-image-6.12.95+deb12-amd64",
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.12.117+deb12-cloud-amd64",
            "linux-image-5.10.0-46-amd64",
        ];
        let newest = |series| {
            names
                .iter()
                .filter(|n| is_plain_image(n, series, "amd64"))
                .max_by_key(|n| numbers(n))
                .copied()
        };
        assert_eq!(newest("6.1"), Some("linux-image-6.1.0-57-amd64"));
        assert_eq!(newest("6.12"), Some("linux-image-6.12.117+deb12-amd64"));
        assert_eq!(newest("5.10"), Some("linux-image-5.10.0-46-amd64"));
        assert_eq!(newest("6.6"), None);
    }

    #[test]
    fn report_failures_name_the_check_and_the_step() {
        let report: Vec<(String, String)> = [
            ("check.load", "ok 15 programs"),
            ("check.drop", "FAIL no drop record"),
            ("step", "clean-exit: checking what is left"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let f = failures_of(&report, None, Some("timed out after 330 s".into()), "x");
        assert_eq!(
            f,
            [
                "drop: no drop record",
                "timed out after 330 s, during: clean-exit: checking what is left"
            ]
        );
        let ok = [("check.load".to_string(), "ok".to_string())];
        assert!(failures_of(&ok, Some(0), None, "x").is_empty());
        assert_eq!(failures_of(&ok, Some(101), None, "x"), ["x"]);
    }
}

//! What the VMs need: QEMU, virtme-ng, and the kernels of [`KERNELS`] from Debian's
//! archive (through a private apt source list).
use anyhow::anyhow;
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::{Kernel, KERNELS};
use lab::tracer::is_root;

use crate::{
    cmd::{output_ok, run},
    setup::install_packages,
    Result,
};

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

/// `vng`: on PATH, or else in the scripts directory of the `python3` pip installed it for
/// (a fresh pyenv has no shim for it until `pyenv rehash`).
pub(super) fn vng() -> PathBuf {
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
        .map_err(|e| anyhow!("tee {}: {e}", list.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(sources.as_bytes())
            .map_err(|e| anyhow!("writing {}: {e}", list.display()))?;
    }
    let status = child.wait().map_err(|e| anyhow!("tee: {e}"))?;
    if !status.success() {
        return Err(anyhow!("writing {} failed: {status}", list.display()));
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
                return Err(anyhow!(
                    "no linux-image-{}.*-{arch} in {} (apt lists in {APT_DIR})",
                    k.series,
                    k.suite
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
pub(super) fn is_plain_image(name: &str, series: &str, arch: &str) -> bool {
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
pub(super) fn numbers(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The newest installed kernel release of `series`, e.g. `6.1.0-57-amd64`, whose image
/// and modules are both there.
pub(super) fn installed_kernel(series: &str) -> Option<String> {
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

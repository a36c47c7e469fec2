//! `cargo xtask setup`: what the build and the lab need, installed where missing
//! (idempotent): Debian packages, PyPI packages, the OTLP receiver's venv, the eBPF
//! toolchain and bpf-linker.
use std::{path::Path, process::Command};

use lab::tracer::is_root;

use crate::{
    cmd::{output_ok, run},
    Result,
};

/// Debian packages: Rust for bpfel with a prebuilt core, LLVM 22 for bpf-linker
/// (docs/toolchain.md), and the lab's real servers and clients (docs/lab.md).
const PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "iproute2",
    "iptables",
    // `nft`: kube-proxy's nftables mode (doctor reads `nft -j list table ip kube-proxy`)
    "nftables",
    "conntrack",
    "bind9",
    "dnsmasq-base",
    "dnsdist",
    "dnsutils",
    "libc-bin",
    "tcpdump",
    // the bench's live load (`cargo xtask bench`)
    "dnsperf",
    // pcapng captures for the analyze tests (tshark, editcap), and the bench's baseline
    "tshark",
    "gcc",
    "libnetfilter-queue-dev",
    "python3",
    // the venv of the OTLP receiver the lab tests use (Arize Phoenix, `install_phoenix`)
    "python3-venv",
    // the OTLP TLS test: a CA and certificates (openssl), a real TLS terminator in front of
    // Phoenix (stunnel4)
    "openssl",
    "stunnel4",
    // promtool: `check metrics` on the agent's exposition, `check rules`/`test rules` on
    // deploy/alerts.yaml; the server itself runs every dashboard query in the lab
    // (tests/tests/lab/dashboards.rs)
    "prometheus",
    "curl",
    // `dnspath top`'s full-screen view in a real terminal (the lab tests' `top::`)
    "tmux",
    // the container image (`cargo xtask image`, built offline from scratch) and the deploy
    // tests running it and the DaemonSet's pod (podman 4.3 needs runc here, and catatonit
    // for `kube play`)
    "buildah",
    "podman",
    "runc",
    "catatonit",
];
/// PyPI packages: `kubernetes-validate` checks deploy/*.yaml against Kubernetes' schemas;
/// the Grafana Foundation SDK builds deploy/grafana's dashboards (`dashboards.py`); the
/// Prometheus Operator's models check deploy/podmonitor.yaml.
const PIP_PACKAGES: &[PipPackage] = &[
    PipPackage {
        name: "kubernetes-validate",
        version: "1.37.0",
    },
    PipPackage {
        name: "grafana-foundation-sdk",
        // The SDK's releases carry an epoch; this one builds Grafana 11.6's schema.
        version: "1769699379!11.6.0",
    },
    PipPackage {
        name: "cloudcoil-models-prometheus-operator",
        version: "0.80.1.0",
    },
];

/// A PyPI package at a pinned version.
struct PipPackage {
    name: &'static str,
    version: &'static str,
}

/// Installs those of `packages` that are missing or of another version (pip of `python3`,
/// as root; the installed version as `importlib.metadata` reads it).
fn install_pip_packages(packages: &[PipPackage]) -> Result<()> {
    for p in packages {
        let have = output_ok(Command::new("python3").args([
            "-c",
            "import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))",
            p.name,
        ]))
        .unwrap_or_default();
        if have.trim() == p.version {
            continue;
        }
        eprintln!("xtask: installing {} {} (pip)", p.name, p.version);
        let spec = format!("{}=={}", p.name, p.version);
        let sudo: &[&str] = if is_root() { &[] } else { &["sudo"] };
        let pip = |extra: &[&str]| {
            let mut c = Command::new(sudo.first().copied().unwrap_or("python3"));
            if !sudo.is_empty() {
                c.arg("python3");
            }
            c.args(["-m", "pip", "install", "-q"])
                .args(extra)
                .arg(&spec);
            c
        };
        if run(&mut pip(&[])).is_err() {
            // Debian's own python refuses (PEP 668) unless told.
            run(&mut pip(&["--break-system-packages"]))?;
        }
    }
    Ok(())
}
/// Arize Phoenix, the OTLP receiver the lab tests send spans to (tests/tests/lab/otlp.rs):
/// a venv of its own under the lab's cache directory, reused by later runs.
pub const PHOENIX_VENV: &str = "/var/cache/dnspath-lab/phoenix";
const PHOENIX_VERSION: &str = "20.26.1";

/// Installs Phoenix into [`PHOENIX_VENV`] unless that version is there (a marker file
/// written after a complete install; a partial venv is made again).
fn install_phoenix() -> Result<()> {
    let venv = Path::new(PHOENIX_VENV);
    let marker = venv.join(format!(".dnspath-arize-phoenix-{PHOENIX_VERSION}"));
    if marker.exists() {
        return Ok(());
    }
    eprintln!("xtask: installing arize-phoenix {PHOENIX_VERSION} into {PHOENIX_VENV} (pip, ~850 MB, once)");
    if venv.exists() {
        run(&mut as_root(&["rm", "-rf", PHOENIX_VENV]))?;
    }
    run(&mut as_root(&["mkdir", "-p", "/var/cache/dnspath-lab"]))?;
    run(&mut as_root(&["python3", "-m", "venv", PHOENIX_VENV]))?;
    let pip = venv.join("bin/pip");
    let spec = format!("arize-phoenix=={PHOENIX_VERSION}");
    run(&mut as_root(&[
        &pip.to_string_lossy(),
        "install",
        "-q",
        &spec,
    ]))?;
    run(&mut as_root(&["touch", &marker.to_string_lossy()]))?;
    Ok(())
}

// systemd-resolved for the lab's loopback stub (tests/src/resolved.rs): Debian's package
// unpacked (`apt-get download` + `dpkg -x`), never installed — installing it would take over
// the machine's /etc/resolv.conf. Its binary runs inside a lab namespace with a mount
// namespace of its own. It needs only systemd's own libraries (`libsystemd-shared`), which
// the installed systemd of the same version carries.
use lab::resolved::RESOLVED_DIR;

/// Unpacks systemd-resolved into [`RESOLVED_DIR`] unless the unpacked binary of the
/// installed systemd's version is there (a marker file named after it).
fn unpack_systemd_resolved() -> Result<()> {
    let Some(version) =
        output_ok(Command::new("dpkg-query").args(["-W", "-f=${Version}", "systemd"]))
    else {
        eprintln!("xtask: systemd is not installed; the lab's systemd-resolved stub is skipped");
        return Ok(());
    };
    let dir = Path::new(RESOLVED_DIR);
    let marker = dir.join(format!(".dnspath-systemd-resolved-{}", version.trim()));
    if marker.exists() && dir.join("lib/systemd/systemd-resolved").exists() {
        return Ok(());
    }
    eprintln!(
        "xtask: unpacking systemd-resolved {} into {RESOLVED_DIR} (not installed)",
        version.trim()
    );
    if dir.exists() {
        run(&mut as_root(&["rm", "-rf", RESOLVED_DIR]))?;
    }
    run(&mut as_root(&["mkdir", "-p", RESOLVED_DIR]))?;
    let pkg = format!("systemd-resolved={}", version.trim());
    // apt-get download writes into the working directory; the package is unpacked, then
    // removed.
    run(as_root(&["apt-get", "download", "-q", &pkg]).current_dir(RESOLVED_DIR))?;
    let deb = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| anyhow::anyhow!("apt-get download left no .deb in {RESOLVED_DIR}"))?;
    let deb = deb.to_string_lossy().into_owned();
    run(&mut as_root(&["dpkg", "-x", &deb, RESOLVED_DIR]))?;
    run(&mut as_root(&["rm", "-f", &deb]))?;
    run(&mut as_root(&["touch", &marker.to_string_lossy()]))?;
    Ok(())
}

const BPF_LINKER_VERSION: &str = "0.13.0";
const EBPF_TOOLCHAIN: &str = "debian-bpf";

fn missing_packages(packages: &[&'static str]) -> Vec<&'static str> {
    packages
        .iter()
        .copied()
        .filter(|p| {
            !output_ok(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_some_and(|s| s.contains("install ok installed"))
        })
        .collect()
}

/// Installs those of `packages` that are missing (apt-get, through sudo unless root).
pub fn install_packages(packages: &[&'static str]) -> Result<()> {
    let missing = missing_packages(packages);
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        let sudo: &[&str] = if is_root() { &[] } else { &["sudo"] };
        let apt = |args: &[&str]| {
            let mut c = Command::new(sudo.first().copied().unwrap_or("apt-get"));
            if !sudo.is_empty() {
                c.arg("apt-get");
            }
            c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
            c
        };
        run(&mut apt(&["update", "-q"]))?;
        let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
        install.args(&missing);
        run(&mut install)?;
    }
    Ok(())
}

pub fn setup() -> Result<()> {
    install_packages(PACKAGES)?;
    install_pip_packages(PIP_PACKAGES)?;
    install_phoenix()?;
    unpack_systemd_resolved()?;
    let toolchains =
        output_ok(Command::new("rustup").args(["toolchain", "list"])).unwrap_or_default();
    if !toolchains.lines().any(|l| l.starts_with(EBPF_TOOLCHAIN)) {
        eprintln!("xtask: linking Debian's rustc as the `{EBPF_TOOLCHAIN}` toolchain");
        run(Command::new("rustup").args(["toolchain", "link", EBPF_TOOLCHAIN, "/usr"]))?;
    }
    let linker = output_ok(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (takes a few minutes once)");
        run(Command::new("cargo")
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"))?;
    }
    Ok(())
}

/// `args` as a command run as root: through `sudo` unless already root.
fn as_root(args: &[&str]) -> Command {
    let mut c = if is_root() {
        Command::new(args[0])
    } else {
        let mut c = Command::new("sudo");
        c.arg(args[0]);
        c
    };
    c.args(&args[1..]);
    c
}

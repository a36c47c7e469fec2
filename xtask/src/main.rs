//! Orchestration only: install what the build and the lab need, build, run the demo lab,
//! run the tests. The eBPF object itself is built by tracer/build.rs.
//!
//!   cargo xtask setup    install toolchain pieces and lab packages (idempotent)
//!   cargo xtask build    setup, then build the release binary
//!   cargo xtask image    setup, build, then the container image localhost/dnspath (buildah)
//!   cargo xtask demo     setup, build, start the lab, trace a few queries through it
//!   cargo xtask test     setup, then every test (as root: lab tests included), then vm-test,
//!                        then 30 s of each fuzz target
//!   cargo xtask bless    build, then rewrite the golden outputs under tests/golden/ from it
//!   cargo xtask captures [NAME...]  make the golden captures again (lab ones as root), bless
//!   cargo xtask fuzz [--seconds N] [TARGET...]  the fuzz targets of fuzz/ (cargo fuzz,
//!                        nightly), N seconds each (default 60); `test` runs a short campaign
//!   cargo xtask vm-test [SERIES|host...]  the kernel_matrix lab test on each kernel nodes
//!                        run (in VMs) and on the host
//!   cargo xtask soak [--minutes N] [--qps N] [--memory MIB] [--no-otlp]  setup, build, the
//!                        agent for N minutes (10) under load and faults (figures only)
//!   cargo xtask bench    setup (and tshark), build, time `dnspath analyze` against tshark,
//!                        then dnspath live (CPU per query, loss, bpf_stats) and in a storm
use anyhow::anyhow;
use clap::{Parser, Subcommand};
use lab::tracer::is_root;
use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

mod bench;
mod demo;
mod fuzz;
mod golden;
mod image;
#[cfg(test)]
mod layout;
mod live;
mod vm;

type Result<T> = anyhow::Result<T>;

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
    // deploy/alerts.yaml
    "prometheus",
    "curl",
    // the container image (`cargo xtask image`, built offline from scratch) and the deploy
    // tests running it and the DaemonSet's pod (podman 4.3 needs runc here, and catatonit
    // for `kube play`)
    "buildah",
    "podman",
    "runc",
    "catatonit",
];
/// PyPI packages: `kubernetes-validate` checks deploy/*.yaml against Kubernetes' schemas.
const PIP_PACKAGES: &[PipPackage] = &[PipPackage {
    name: "kubernetes-validate",
    version: "1.37.0",
    module: "kubernetes_validate",
}];

/// A PyPI package and the module that says its version (`python3 -m MODULE --version`).
struct PipPackage {
    name: &'static str,
    version: &'static str,
    module: &'static str,
}

/// Installs those of `packages` whose module is missing or of another version (pip of
/// `python3`, as root).
fn install_pip_packages(packages: &[PipPackage]) -> Result<()> {
    for p in packages {
        let have = output_ok(Command::new("python3").args(["-m", p.module, "--version"]))
            .unwrap_or_default();
        if have.split_whitespace().any(|w| w == p.version) {
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
    let sudo: &[&str] = if is_root() { &[] } else { &["sudo"] };
    let as_root = |args: &[&str]| {
        let mut c = Command::new(sudo.first().copied().unwrap_or(args[0]));
        if !sudo.is_empty() {
            c.arg(args[0]);
        }
        c.args(&args[1..]);
        c
    };
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

const BPF_LINKER_VERSION: &str = "0.13.0";
const EBPF_TOOLCHAIN: &str = "debian-bpf";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| anyhow!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(anyhow!("{cmd:?} failed: {status}"))
    }
}

fn output_ok(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

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
fn install_packages(packages: &[&'static str]) -> Result<()> {
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

fn setup() -> Result<()> {
    install_packages(PACKAGES)?;
    install_pip_packages(PIP_PACKAGES)?;
    install_phoenix()?;
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

pub fn build_release() -> Result<PathBuf> {
    run(Command::new("cargo").current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "tracer",
        "--bin",
        "dnspath",
    ]))?;
    Ok(workspace_root().join("target/release/dnspath"))
}

fn test(extra: &[String]) -> Result<()> {
    if !is_root() {
        if lab::tracer::skip_root_tests() {
            eprintln!("xtask: not root: lab and eBPF tests will report themselves skipped");
        } else {
            eprintln!(
                "xtask: not root: lab and eBPF tests will fail; run as root, or set \
                 DNSPATH_SKIP_ROOT_TESTS=1 to skip them"
            );
        }
    }
    // The binary under test must exist before the integration tests spawn it.
    let bin = build_release()?;
    let tests = run(Command::new("cargo")
        .current_dir(workspace_root())
        .args([
            "test",
            "--workspace",
            "--exclude",
            "tracer-ebpf",
            "--release",
            // Every failing test binary is reported, not only the first.
            "--no-fail-fast",
        ])
        .args(extra)
        .args(["--", "--test-threads=1"]));
    // The kernels nodes run, whatever the tests above said.
    let matrix = vm::run_matrix(&bin, &[]);
    // A short fuzz campaign of every target (the long ones are recorded in README).
    let fuzz = fuzz::run_targets(30, &[]);
    let failed: Vec<String> = [tests, matrix, fuzz]
        .into_iter()
        .filter_map(|r| r.err())
        .map(|e| format!("{e:#}"))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(failed.join("; ")))
    }
}

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "dnspath's orchestration: setup, build, demo, tests, bench"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install toolchain pieces and lab packages (idempotent), and the VM kernels.
    Setup,
    /// Setup, then build the release binary.
    Build,
    /// Setup, build, then the container image localhost/dnspath (buildah).
    Image,
    /// Setup, build, start the lab, trace a few queries through it.
    Demo,
    /// Setup, then every test (as root: lab tests included), then vm-test, then 30 s of
    /// each fuzz target.
    Test {
        /// Passed to `cargo test` (before its `--`), e.g. `-p tracer`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then rewrite the golden outputs under tests/golden/ from it.
    Bless,
    /// Make the golden captures again (lab ones as root), then bless.
    Captures {
        /// Only these captures (default: all).
        #[arg(value_name = "NAME")]
        names: Vec<String>,
    },
    /// The fuzz targets of fuzz/ (cargo fuzz, nightly), N seconds each.
    Fuzz {
        /// Seconds of each target.
        #[arg(long, value_name = "N", default_value_t = 60)]
        seconds: u64,
        /// Only these targets (default: all).
        #[arg(value_name = "TARGET")]
        targets: Vec<String>,
    },
    /// The kernel_matrix lab test on each kernel nodes run (in VMs) and on the host.
    VmTest {
        /// Only these: a kernel series (5.10, 6.1, 6.12) or `host` (default: all).
        #[arg(value_name = "SERIES|host")]
        only: Vec<String>,
    },
    /// Setup (and tshark), build, time `dnspath analyze` against tshark, then dnspath live
    /// (CPU per query, loss, bpf_stats) and in a storm.
    Bench(bench::BenchArgs),
    /// Setup, build, then the agent for minutes under load and faults, as a DaemonSet pod
    /// lives (a bench: figures, no assertions).
    Soak(live::soak::SoakOptions),
}

fn main() -> ExitCode {
    // A usage error exits 2, as it always did; `--help` 0.
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup => setup().and_then(|()| vm::setup()),
        Cmd::Build => setup().and_then(|()| build_release().map(|_| ())),
        Cmd::Demo => setup()
            .and_then(|()| build_release())
            .and_then(|bin| demo::run(&bin)),
        Cmd::Test { args } => setup()
            .and_then(|()| vm::setup())
            .and_then(|()| test(&args)),
        Cmd::VmTest { only } => setup()
            .and_then(|()| vm::setup())
            .and_then(|()| build_release())
            .and_then(|bin| vm::run_matrix(&bin, &only)),
        Cmd::Image => setup().and_then(|()| image::run()),
        Cmd::Bless => build_release().and_then(|bin| golden::bless(&bin)),
        Cmd::Fuzz { seconds, targets } => {
            setup().and_then(|()| fuzz::run_targets(seconds, &targets))
        }
        Cmd::Captures { names } => setup()
            .and_then(|()| build_release())
            .and_then(|bin| golden::captures(&bin, &names)),
        Cmd::Soak(o) => setup()
            .and_then(|()| build_release())
            .and_then(|bin| live::soak::run(&bin, &o)),
        Cmd::Bench(args) => bench::options(args).and_then(|o| {
            setup()
                .and_then(|()| install_packages(&["tshark"]))
                .and_then(|()| build_release())
                .and_then(|bin| bench::run(&bin, &o))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod cli_tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Cmd};

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn subcommands_take_their_arguments_as_before() {
        let parse = |args: &[&str]| Cli::try_parse_from(["xtask"].iter().chain(args));
        let Cmd::Test { args } = parse(&["test", "-p", "tracer", "--lib"]).unwrap().command else {
            panic!("not test")
        };
        assert_eq!(args, ["-p", "tracer", "--lib"]);
        let Cmd::Fuzz { seconds, targets } = parse(&["fuzz", "--seconds", "5", "dns_message"])
            .unwrap()
            .command
        else {
            panic!("not fuzz")
        };
        assert_eq!(
            (seconds, targets.as_slice()),
            (5, &["dns_message".to_owned()][..])
        );
        let Cmd::VmTest { only } = parse(&["vm-test", "6.1", "host"]).unwrap().command else {
            panic!("not vm-test")
        };
        assert_eq!(only, ["6.1", "host"]);
        assert!(parse(&["bench", "--only", "offline,kernel", "--rates", "100,200"]).is_ok());
        assert!(parse(&["bench", "--packets", "x"]).is_err());
        assert!(parse(&["frobnicate"]).is_err());
        assert!(parse(&[]).is_err());
    }
}

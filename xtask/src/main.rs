//! Orchestration only: install what the build and the lab need, build, run the demo lab,
//! run the tests. The eBPF object itself is built by tracer/build.rs.
//!
//!   cargo xtask setup    install toolchain pieces and lab packages (idempotent)
//!   cargo xtask build    setup, then build the release binary
//!   cargo xtask image    setup, build, then the container image localhost/dnspath (buildah)
//!   cargo xtask demo     setup, build, start the lab, trace a few queries through it
//!   cargo xtask test     setup, then every test (as root: lab tests included), then vm-test,
//!                        then 30 s of each fuzz target (seed 1)
//!   cargo xtask bless    build, then rewrite the golden outputs under tests/golden/ from it
//!   cargo xtask captures [NAME...]  make the golden captures again (lab ones as root), bless
//!   cargo xtask fuzz [--seconds N] [--seed S] [TARGET...]  the fuzz targets of fuzz/ (cargo fuzz,
//!                        nightly), N seconds each (default 60); `test` runs a short campaign
//!   cargo xtask vm-test [SERIES|host...]  the kernel_matrix lab test on each kernel nodes
//!                        run (in VMs) and on the host
//!   cargo xtask soak [--minutes N] [--qps N] [--memory MIB] [--no-otlp]  setup, build, the
//!                        agent for N minutes (10) under load and faults (figures only)
//!   cargo xtask bench    setup (and tshark), build, time `dnspath analyze` against tshark,
//!                        then dnspath live (CPU per query, loss, bpf_stats) and in a storm
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{build::build_release, setup::setup};

mod bench;
mod build;
mod cmd;
mod demo;
mod fuzz;
mod golden;
mod image;
#[cfg(test)]
mod layout;
mod live;
mod setup;
mod test;
mod vm;

type Result<T> = anyhow::Result<T>;

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
        /// libFuzzer's random seed (default: a new one each run; `test` uses 1).
        #[arg(long, value_name = "S")]
        seed: Option<u64>,
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
            .and_then(|()| test::run_all(&args)),
        Cmd::VmTest { only } => setup()
            .and_then(|()| vm::setup())
            .and_then(|()| build_release())
            .and_then(|bin| vm::run_matrix(&bin, &only)),
        Cmd::Image => setup().and_then(|()| image::run()),
        Cmd::Bless => build_release().and_then(|bin| golden::bless(&bin)),
        Cmd::Fuzz {
            seconds,
            seed,
            targets,
        } => setup().and_then(|()| fuzz::run_targets(seconds, seed, &targets)),
        Cmd::Captures { names } => setup()
            .and_then(|()| build_release())
            .and_then(|bin| golden::captures(&bin, &names)),
        Cmd::Soak(o) => setup()
            .and_then(|()| build_release())
            .and_then(|bin| live::soak::run(&bin, &o)),
        Cmd::Bench(args) => bench::options(args).and_then(|o| {
            setup()
                .and_then(|()| setup::install_packages(&["tshark"]))
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
        let Cmd::Fuzz {
            seconds,
            seed,
            targets,
        } = parse(&["fuzz", "--seconds", "5", "--seed", "7", "dns_message"])
            .unwrap()
            .command
        else {
            panic!("not fuzz")
        };
        assert_eq!(
            (seconds, seed, targets.as_slice()),
            (5, Some(7), &["dns_message".to_owned()][..])
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

//! `dnspath doctor`'s command line, kept apart from main.rs's other commands.
use std::{io::IsTerminal, process::ExitCode};

use clap::Args;
use dnspath::{
    doctor::{self, DoctorOptions},
    kernel::ProbeOptions,
    output::Format,
    trace::RunOptions,
};

use crate::{
    args::{HostRootArgs, RecordArgs, TimeoutArgs},
    units::{parse_secs, Secs},
};

/// Exit status when doctor could not run at all (no root, no BPF, a bad flag value).
pub const EXIT_DOCTOR_FAILED: u8 = 4;

#[derive(Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    host_root: HostRootArgs,
    /// How long to watch the traffic, e.g. `30s`, `2m`, or seconds.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_secs)]
    duration: Secs,
    /// Output format: a report for a person, or one JSON document (docs/doctor.md).
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    #[command(flatten)]
    timeout: TimeoutArgs,
    #[command(flatten)]
    record: RecordArgs,
}

pub fn run(a: DoctorArgs, kernel_log: bool) -> anyhow::Result<ExitCode> {
    match run_inner(a, kernel_log) {
        Ok(code) => Ok(ExitCode::from(code)),
        Err(e) => {
            eprintln!("dnspath: {}", dnspath::output::escape(&format!("{e:#}")));
            Ok(ExitCode::from(EXIT_DOCTOR_FAILED))
        }
    }
}

fn run_inner(a: DoctorArgs, kernel_log: bool) -> anyhow::Result<u8> {
    a.host_root.apply()?;
    let duration = a
        .duration
        .non_negative("--duration")
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--duration must be longer than 0"))?;
    let timeout = a
        .timeout
        .timeout
        .positive("--timeout")
        .ok()
        .filter(|t| t.as_secs_f64() < 1e6)
        .ok_or_else(|| anyhow::anyhow!("--timeout must be a positive number of seconds"))?;
    let opts = DoctorOptions {
        trace: RunOptions {
            duration: Some(duration),
            ..RunOptions::node_wide(
                ProbeOptions {
                    ports: vec![53],
                    snaplen: crate::args::DEFAULT_SNAPLEN,
                    drops: true,
                    kernel_log,
                },
                timeout,
                a.record.config()?,
            )
        },
        format: a.output,
        duration,
        progress: std::io::stderr().is_terminal(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = std::io::stdout().lock();
    Ok(rt.block_on(doctor::run(opts, &mut out))?)
}

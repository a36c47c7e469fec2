//! `dnspath doctor`'s command line, kept apart from main.rs's other commands.
use std::{io::IsTerminal, path::PathBuf, process::ExitCode, time::Duration};

use clap::Args;
use dnspath::{
    doctor::{self, DoctorOptions},
    kernel::attach::AttachSpec,
    output::{Format, View},
    trace::TraceOptions,
};

/// Exit status when doctor could not run at all (no root, no BPF, a bad flag value).
pub const EXIT_DOCTOR_FAILED: u8 = 4;

#[derive(Args)]
pub struct DoctorArgs {
    /// Where the node's root file system is mounted (`/host` in `kubectl debug node/N
    /// --profile=sysadmin`): processes, resolv.conf and kubelet's files are read under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    host_root: PathBuf,
    /// How long to watch the traffic, e.g. `30s`, `2m`.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Output format: a report for a person, or one JSON document (docs/doctor.md).
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// Seconds after which an unanswered query counts as timed out.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    timeout: f64,
    #[command(flatten)]
    record: super::RecordArgs,
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
    if !a.host_root.is_dir() {
        anyhow::bail!("--host-root {}: not a directory", a.host_root.display());
    }
    if a.duration.is_zero() {
        anyhow::bail!("--duration must be longer than 0");
    }
    if !(a.timeout.is_finite() && a.timeout > 0.0 && a.timeout < 1e6) {
        anyhow::bail!("--timeout must be a positive number of seconds");
    }
    dnspath::host::set_root(a.host_root.clone());
    let opts = DoctorOptions {
        trace: TraceOptions {
            attach: AttachSpec {
                interfaces: Vec::new(),
                all_netns: true,
                netns: Vec::new(),
                netns_unreadable: Default::default(),
            },
            ports: vec![53],
            snaplen: 2048,
            format: Format::Json,
            view: View::Transactions,
            timeout: Duration::from_secs_f64(a.timeout),
            duration: Some(a.duration),
            count: None,
            drops: true,
            kernel_log,
            until_loop: false,
            evidence: dnspath::trace::EvidenceOptions {
                record: a.record.config()?,
                buffer_bytes: 64_000_000,
                ..Default::default()
            },
            filter: dnspath::output::filter::Filter::default(),
            every_packet: false,
        },
        format: a.output,
        duration: a.duration,
        progress: std::io::stderr().is_terminal(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = std::io::stdout().lock();
    Ok(rt.block_on(doctor::run(opts, &mut out))?)
}

//! `dnspath trace`'s command line: its flags, their checks, and the live run.
use std::{io::BufWriter, path::PathBuf, process::ExitCode, time::Duration};

use clap::Args;
use dnspath::{
    kernel::attach::AttachSpec,
    output::{Format, View},
    trace::{self, OutputOptions, RunOptions},
};

use crate::{
    args::{CaptureArgs, FilterArgs, HostRootArgs, OtlpArgs, RecordArgs, TimeoutArgs},
    units::{parse_positive_size, parse_secs, parse_size, Secs},
};

/// Exit status when `--until loop` found one.
const EXIT_LOOP_FOUND: u8 = 3;

#[derive(Args)]
pub struct TraceArgs {
    /// Interface of this network namespace to attach to (repeatable); default: all.
    #[arg(short, long = "interface", value_name = "IFACE")]
    interfaces: Vec<String>,
    /// Also attach to every interface (including `lo`) of every other network namespace:
    /// named ones (/run/netns) and those of running processes. New ones are picked up
    /// as they appear (bind-mounted under /run/netns, or with a veth into this namespace),
    /// others within 10 s.
    #[arg(long)]
    all_netns: bool,
    /// Also attach to all interfaces of this named network namespace (repeatable).
    #[arg(long = "netns", value_name = "NAME")]
    netns: Vec<String>,
    #[command(flatten)]
    capture: CaptureArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// What to show [default: transactions for text, both for json].
    #[arg(long, value_enum)]
    view: Option<View>,
    #[command(flatten)]
    timeout: TimeoutArgs,
    /// Stop after this long: seconds, or e.g. `30s`, `1m30s`.
    #[arg(long, value_name = "DURATION", value_parser = parse_secs)]
    duration: Option<Secs>,
    /// Stop after this many packets (at least 1).
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Stop at the first such event and exit with status 3 (for a one-shot debug container:
    /// `dnspath trace --all-netns --until loop`).
    #[arg(long, value_enum, value_name = "EVENT")]
    until: Option<Until>,
    /// Also write every captured packet (and every kernel drop) to this pcapng file, for
    /// Wireshark/tshark and postmortems: one interface per `netns/ifname`, nanosecond
    /// times, direction, and a comment per packet with the hop and what was decoded
    /// (drops on interface `dnspath/drops`, with reason and location). Created 0600.
    /// `-` writes it to standard output (the normal output then goes to stderr).
    /// `dnspath analyze FILE` reads it back.
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    write: Option<PathBuf>,
    /// With -w: start a new file when this one holds this many million bytes, or with a
    /// suffix k, m, g that many KiB, MiB, GiB (tcpdump's -C), or with a unit (`10MB`,
    /// `512KiB`). Files get a sequence number before the extension (`trace-00001.pcapng`).
    #[arg(short = 'C', value_name = "SIZE", requires = "write", value_parser = parse_positive_size)]
    file_size: Option<u64>,
    /// With -w: start a new file every this many seconds, or e.g. `1m`, `1h` (tcpdump's
    /// -G). A FILE with `%` is a strftime pattern (UTC), e.g. `dns-%Y%m%dT%H%M%S.pcapng`.
    #[arg(short = 'G', value_name = "DURATION", requires = "write", value_parser = parse_secs)]
    rotate_seconds: Option<Secs>,
    /// With -w: keep only the newest N files; older ones are deleted (tcpdump's -W).
    #[arg(short = 'W', value_name = "N", requires = "write")]
    file_count: Option<usize>,
    /// Seconds a packet may wait for its transaction to be decided before it is written
    /// (with -w or --record) without it [default: --timeout + 5].
    #[arg(long, value_name = "DURATION", value_parser = parse_secs)]
    write_delay: Option<Secs>,
    /// Packets waiting for their transaction (megabytes, or e.g. `128MiB`); beyond, the
    /// oldest are written without it (counted in `stats.evidence.early`).
    #[arg(long, value_name = "SIZE", default_value = "64", value_parser = parse_size)]
    write_buffer: u64,
    #[command(flatten)]
    record: RecordArgs,
    #[command(flatten)]
    host_root: HostRootArgs,
    #[command(flatten)]
    filter: FilterArgs,
    #[command(flatten)]
    otlp: OtlpArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Until {
    /// A forwarding loop (or amplification storm) is reported.
    Loop,
}

fn evidence_options(a: &TraceArgs) -> anyhow::Result<dnspath::trace::EvidenceOptions> {
    let stdout = a.write.as_deref() == Some(std::path::Path::new("-"));
    let rotation = dnspath::evidence::files::Rotation {
        max_bytes: a.file_size,
        every: a
            .rotate_seconds
            .map(|s| s.non_negative("-G"))
            .transpose()?
            .map(|d| d.max(Duration::from_secs(1))),
        keep: a.file_count.map(|n| n.max(1)),
    };
    if stdout && rotation.rotates() {
        anyhow::bail!("-C, -G and -W rotate files: they need -w FILE, not -w -");
    }
    if let Some(w) = &a.write {
        let s = w.to_string_lossy();
        if s.contains('%') {
            dnspath::evidence::files::strftime(&s, 0).map_err(|e| anyhow::anyhow!("-w {e}"))?;
        }
    }
    Ok(dnspath::trace::EvidenceOptions {
        write: a.write.clone(),
        rotation,
        record: a.record.config()?,
        max_delay_ns: a
            .write_delay
            .map(|s| s.positive_ns("--write-delay"))
            .transpose()?,
        buffer_bytes: usize::try_from(a.write_buffer).unwrap_or(usize::MAX),
    })
}

/// Flags that clap accepts but that would make a run capture nothing.
fn check(a: &TraceArgs) -> anyhow::Result<()> {
    a.capture.check()?;
    if a.count == Some(0) {
        anyhow::bail!(
            "--count 0 would stop before the first packet: give at least 1, or leave --count out to run until stopped"
        );
    }
    Ok(())
}

/// The live run's options, from the flags (checked first: nothing is loaded on a bad one).
fn options(
    a: TraceArgs,
    kernel_log: bool,
) -> anyhow::Result<(RunOptions, OutputOptions, OtlpArgs)> {
    check(&a)?;
    let duration = a.duration.map(|s| s.positive("--duration")).transpose()?;
    a.host_root.apply()?;
    let evidence = evidence_options(&a)?;
    let output = OutputOptions {
        format: a.output,
        view: a.view.unwrap_or(View::default_for(a.output)),
        count: a.count,
        until_loop: a.until == Some(Until::Loop),
        filter: a.filter.filter()?,
        identity: a.otlp.identity()?,
    };
    let opts = RunOptions {
        attach: AttachSpec {
            interfaces: a.interfaces,
            all_netns: a.all_netns,
            netns: a.netns,
            ..Default::default()
        },
        capture: a.capture.probe(kernel_log),
        transactions: output.view.transactions(),
        timeout: a.timeout.timeout.positive("--timeout")?,
        duration,
        evidence,
        every_packet: true,
    };
    Ok((opts, output, a.otlp))
}

pub fn run(a: TraceArgs, kernel_log: bool) -> anyhow::Result<ExitCode> {
    let (opts, output, otlp) = options(a, kernel_log)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let until_loop = output.until_loop;
    // `-w -` puts the pcapng on standard output; the records go to stderr then.
    let out: Box<dyn std::io::Write + Send> =
        if opts.evidence.write.as_deref() == Some(std::path::Path::new("-")) {
            Box::new(BufWriter::new(std::io::stderr()))
        } else {
            Box::new(BufWriter::new(std::io::stdout()))
        };
    let (mut sinks, mut stop) = trace::output_sinks(&output, out, otlp.config()?)?;
    // Every way out of `run_live` has detached and removed the pinned maps by now.
    let summary = rt.block_on(trace::run_live(opts, &mut sinks, &mut stop))?;
    // `dnspath trace | head` (`summary.output_closed`): the reader has what it
    // wanted, which is no error.
    if until_loop && summary.loop_found {
        return Ok(ExitCode::from(EXIT_LOOP_FOUND));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::{Cli, Command};

    /// The trace flags as clap and [`super::options`] take them (no root needed: nothing
    /// is loaded).
    fn options(args: &[&str]) -> anyhow::Result<dnspath::trace::RunOptions> {
        let cli = Cli::try_parse_from(["dnspath", "trace"].iter().chain(args))?;
        let Command::Trace(a) = cli.command else {
            unreachable!("parsed as trace")
        };
        Ok(super::options(*a, false)?.0)
    }

    #[test]
    fn durations_and_sizes_take_one_syntax() {
        let o = options(&["--timeout", "1.5", "--duration", "1m30s"]).unwrap();
        assert_eq!(o.timeout, std::time::Duration::from_millis(1500));
        assert_eq!(o.duration, Some(std::time::Duration::from_secs(90)));
        let o = options(&["--timeout", "500ms", "--duration", "30"]).unwrap();
        assert_eq!(o.timeout, std::time::Duration::from_millis(500));
        assert_eq!(o.duration, Some(std::time::Duration::from_secs(30)));
        let o = options(&[
            "-w",
            "/dev/null",
            "-C",
            "2k",
            "-G",
            "1m",
            "--write-buffer",
            "512KiB",
            "--write-delay",
            "2.5",
        ])
        .unwrap();
        assert_eq!(o.evidence.rotation.max_bytes, Some(2048));
        assert_eq!(
            o.evidence.rotation.every,
            Some(std::time::Duration::from_secs(60))
        );
        assert_eq!(o.evidence.buffer_bytes, 512 * 1024);
        assert_eq!(o.evidence.max_delay_ns, Some(2_500_000_000));
        // Plain numbers keep their units: megabytes and seconds.
        let o = options(&[
            "-w",
            "/dev/null",
            "-C",
            "3",
            "-G",
            "0",
            "--write-buffer",
            "64",
        ])
        .unwrap();
        assert_eq!(o.evidence.rotation.max_bytes, Some(3_000_000));
        assert_eq!(
            o.evidence.rotation.every,
            Some(std::time::Duration::from_secs(1))
        );
        assert_eq!(o.evidence.buffer_bytes, 64_000_000);
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (args, want) in [
            (&["--port", "0"][..], "--port 0 is not a port"),
            (&["--count", "0"][..], "--count 0 would stop"),
            (
                &["--duration", "1e10"][..],
                "--duration 10000000000 is too long",
            ),
            (
                &["--duration", "0"][..],
                "--duration must be a positive number",
            ),
            (
                &["--timeout", "inf"][..],
                "--timeout must be a positive number",
            ),
            (
                &["--timeout", "0s"][..],
                "--timeout must be a positive number",
            ),
            (&["--host-root", "/nonexistent/x"][..], "--host-root"),
        ] {
            let e = options(args)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        // Syntax errors are clap's.
        for args in [
            &["--timeout", "soon"][..],
            &["-w", "x", "-C", "0"],
            &["-w", "x", "-C", "1.5MB"],
            &["--write-buffer", "lots"],
        ] {
            let e = options(args).err().unwrap();
            assert!(e.downcast_ref::<clap::Error>().is_some(), "{args:?}: {e}");
        }
    }
}

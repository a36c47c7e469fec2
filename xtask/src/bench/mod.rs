//! `cargo xtask bench`: offline decoding speed, dnspath against tshark on the same file;
//! the kernel programs' cost per packet (`tests/benches/kernel_cost.rs`); then the live and
//! storm sections (live/) in a lab.
//!
//! Writes a pcap of DNS traffic (Ethernet + IPv4 + UDP, queries and responses of several
//! names and types, EDNS, NXDOMAIN, CNAME chains) straight from Rust, so no network is
//! needed, then times `dnspath analyze FILE -o json` and
//! `tshark -r FILE -Y dns -T fields -e dns.qry.name -e dns.id`, both to /dev/null.
use anyhow::anyhow;
use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

pub(crate) mod capture;
mod dns;

use capture::{write_capture, write_repeats_capture};

const DEFAULT_PACKETS: u64 = 1_000_000;
/// One run by default, so that the whole bench (offline, live, storm) stays under ~5 minutes.
const DEFAULT_RUNS: u32 = 1;

pub struct Options {
    packets: u64,
    runs: u32,
    keep: Option<PathBuf>,
    offline: bool,
    kernel: bool,
    live: bool,
    storm: bool,
    scale: bool,
    lab: crate::live::LiveOptions,
}

/// `cargo xtask bench`'s flags.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Sections to run, comma-separated: offline, kernel, live, storm, scale [default: all].
    #[arg(long, value_name = "SECTIONS", value_delimiter = ',',
          value_parser = ["offline", "kernel", "live", "storm", "scale"])]
    only: Vec<String>,
    /// Packets of the offline bench's capture.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PACKETS)]
    packets: u64,
    /// Runs of each measurement (the median is reported).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RUNS)]
    runs: u32,
    /// Keep the offline bench's capture in FILE.
    #[arg(long, value_name = "FILE")]
    keep: Option<PathBuf>,
    /// Query rates of the live section, comma-separated.
    #[arg(long, value_name = "QPS,...", value_delimiter = ',')]
    rates: Option<Vec<u32>>,
    /// Seconds of each live rate.
    #[arg(long, value_name = "N")]
    seconds: Option<u64>,
    /// Seconds of the storm.
    #[arg(long, value_name = "N")]
    storm_seconds: Option<u64>,
}

/// The bench's options from its flags, checked before anything is set up.
pub fn options(a: BenchArgs) -> crate::Result<Options> {
    let section = |s: &str| a.only.is_empty() || a.only.iter().any(|o| o == s);
    let mut o = Options {
        packets: a.packets,
        runs: a.runs,
        keep: a.keep,
        offline: section("offline"),
        kernel: section("kernel"),
        live: section("live"),
        storm: section("storm"),
        scale: section("scale"),
        lab: crate::live::LiveOptions::default(),
    };
    if let Some(rates) = a.rates {
        o.lab.rates = rates;
    }
    if let Some(s) = a.seconds {
        o.lab.seconds = s;
    }
    if let Some(s) = a.storm_seconds {
        o.lab.storm_seconds = s;
    }
    if o.packets == 0 || o.runs == 0 || o.lab.seconds == 0 || o.lab.storm_seconds == 0 {
        return Err(anyhow!(
            "bench: --packets, --runs, --seconds and --storm-seconds must be at least 1"
        ));
    }
    if o.lab.rates.is_empty() || o.lab.rates.contains(&0) {
        return Err(anyhow!("bench: --rates must be positive"));
    }
    Ok(o)
}

/// Unanswered repeats of one question in the bench's repeat capture.
const REPEATS: u64 = 100_000;

/// Times `dnspath analyze -o json` on [`REPEATS`] unanswered repeats of one question.
fn measure_repeats(dnspath: &Path, o: &Options) -> crate::Result<()> {
    let path =
        std::env::temp_dir().join(format!("dnspath-bench-repeats-{}.pcap", std::process::id()));
    let result = write_repeats_capture(&path, REPEATS).and_then(|_| {
        let file = path.to_string_lossy().into_owned();
        let mut times = Vec::new();
        for run in 1..=o.runs {
            let (t, stderr) =
                time_it(Command::new(dnspath).args(["analyze", &file, "-o", "json"]))?;
            eprintln!(
                "bench: run {run}: dnspath analyze -o json (unanswered repeats): {:.2} s",
                t.as_secs_f64()
            );
            let want = format!("{REPEATS} packets read, {REPEATS} decoded");
            if !stderr.contains(&want) {
                return Err(anyhow!(
                    "repeats: not every packet decoded (expected \"{want}\"): {stderr}"
                ));
            }
            times.push(t);
        }
        Ok(median(times))
    });
    let _ = std::fs::remove_file(&path);
    let t = result?;
    println!(
        "  {:<40} {:>7.2} s {:>10.0} packets/s  ({REPEATS} unanswered queries of one question)",
        "dnspath analyze -o json (repeats)",
        t.as_secs_f64(),
        REPEATS as f64 / t.as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// Runs `cmd` with stdout to /dev/null; returns the wall time and stderr.
fn time_it(cmd: &mut Command) -> crate::Result<(Duration, String)> {
    let null = File::create("/dev/null").map_err(|e| anyhow!("/dev/null: {e}"))?;
    cmd.stdin(Stdio::null()).stdout(null).stderr(Stdio::piped());
    let start = Instant::now();
    let out = cmd.output().map_err(|e| anyhow!("{cmd:?}: {e}"))?;
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(anyhow!("{cmd:?} failed ({}): {stderr}", out.status));
    }
    Ok((took, stderr))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Machine, kernel and date, for the figures.
fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = crate::cmd::output_ok(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .unwrap_or_default();
    format!(
        "{} CPU(s): {}, Linux {}, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model(),
        kernel.trim(),
        date.trim()
    )
}

pub fn run(dnspath: &Path, o: &Options) -> crate::Result<()> {
    println!("bench on {}", machine());
    if o.offline {
        run_offline(dnspath, o)?;
    }
    if o.kernel {
        run_kernel()?;
    }
    if o.live || o.storm {
        crate::live::run(dnspath, &o.lab, o.live, o.storm)?;
    }
    if o.scale {
        crate::live::scale::run_scale(dnspath)?;
    }
    Ok(())
}

/// The kernel programs' cost, measured by the kernel: TC programs on crafted frames through
/// `BPF_PROG_TEST_RUN` (mean ns per run, best of five), the drop program on 200,000 non-DNS
/// drops with BPF statistics on, and the instructions the verifier processed with and
/// without `-vv`. Printed as the bench prints them (`frame  program  ns/run`).
fn run_kernel() -> crate::Result<()> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["bench", "-p", "dnspath-tests", "--bench", "kernel_cost"])
        .stderr(Stdio::inherit());
    let out = cmd.output().map_err(|e| anyhow!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(anyhow!("{cmd:?} failed: {}", out.status));
    }
    let out = String::from_utf8_lossy(&out.stdout);
    println!("\nkernel (BPF_PROG_TEST_RUN ns/run; kfree_skb ns/run on non-DNS drops; verifier instructions):");
    for line in out.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() >= 3 {
            println!("  {:<20} {:<28} {}", cols[0], cols[1], cols[2..].join(" "));
        }
    }
    Ok(())
}

fn run_offline(dnspath: &Path, o: &Options) -> crate::Result<()> {
    let tshark = crate::cmd::output_ok(Command::new("tshark").arg("--version"))
        .and_then(|v| v.lines().next().map(str::to_string))
        .ok_or_else(|| anyhow!("tshark does not run"))?;
    let path = o.keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("dnspath-bench-{}.pcap", std::process::id()))
    });
    eprintln!(
        "bench: writing {} DNS packets to {}",
        o.packets,
        path.display()
    );
    let size = write_capture(&path, o.packets)?;
    let result = measure(dnspath, &path, o, size, &tshark);
    if o.keep.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    result?;
    measure_repeats(dnspath, o)
}

fn measure(dnspath: &Path, path: &Path, o: &Options, size: u64, tshark: &str) -> crate::Result<()> {
    let file = path.to_string_lossy().into_owned();
    // (label, program, arguments)
    let commands: [(&str, &Path, Vec<&str>); 3] = [
        (
            "dnspath analyze -o json",
            dnspath,
            vec!["analyze", &file, "-o", "json"],
        ),
        (
            "dnspath analyze -o json --view packets",
            dnspath,
            vec!["analyze", &file, "-o", "json", "--view", "packets"],
        ),
        (
            "tshark -Y dns -T fields",
            Path::new("tshark"),
            vec![
                "-r",
                &file,
                "-Y",
                "dns",
                "-T",
                "fields",
                "-e",
                "dns.qry.name",
                "-e",
                "dns.id",
            ],
        ),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); commands.len()];
    for run in 1..=o.runs {
        for (i, (label, program, args)) in commands.iter().enumerate() {
            let (t, stderr) = time_it(Command::new(program).args(args))?;
            eprintln!("bench: run {run}: {label}: {:.2} s", t.as_secs_f64());
            if *program == dnspath {
                let want = format!("{} packets read, {} decoded", o.packets, o.packets);
                if !stderr.contains(&want) {
                    return Err(anyhow!(
                        "{label} did not decode every packet (expected \"{want}\"): {stderr}"
                    ));
                }
            }
            times[i].push(t);
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let rate = |d: Duration| o.packets as f64 / d.as_secs_f64().max(1e-9);
    println!(
        "{} packets ({:.0} MB pcap, Ethernet/IPv4/UDP DNS, {} transactions), median of {} run(s), {} CPU(s): {}",
        o.packets,
        size as f64 / 1e6,
        o.packets / 2,
        o.runs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        cpu_model()
    );
    for ((label, _, _), t) in commands.iter().zip(&medians) {
        println!(
            "  {label:<40} {:>7.2} s {:>10.0} packets/s",
            t.as_secs_f64(),
            rate(*t)
        );
    }
    println!("  ({tshark})");
    let tshark_t = medians[2].as_secs_f64();
    for ((label, _, _), t) in commands.iter().zip(&medians).take(2) {
        println!(
            "  {label}: {:.2}x tshark's speed",
            tshark_t / t.as_secs_f64().max(1e-9)
        );
    }
    // Issue #29's offline goals (one `analyze` is one reading thread: per core).
    for (i, what, target) in [
        (1, "analyze, decode only: ≥ 1M packets/s", 1e6),
        (0, "analyze, correlation and JSON: ≥ 500k packets/s", 5e5),
    ] {
        let r = rate(medians[i]);
        let shown = format!("{r:.0} packets/s");
        println!("{}", crate::live::goal(what, &shown, r, target, false));
    }
    let speed = tshark_t / medians[0].as_secs_f64().max(1e-9);
    let what = "analyze -o json: ≥ 20× tshark's speed";
    println!(
        "{}",
        crate::live::goal(what, &format!("{speed:.1}×"), speed, 20.0, false)
    );
    Ok(())
}

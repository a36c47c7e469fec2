//! `dnspath`: follow DNS packets through every hop of a Kubernetes node.
use std::{io::BufWriter, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use dnspath::{
    analyze::{self, AnalyzeError, AnalyzeOptions},
    kernel::attach::AttachSpec,
    output::{
        filter::{Filter, FilterSpec},
        Format, View,
    },
    trace::{self, TraceOptions},
};

#[derive(Parser)]
#[command(
    name = "dnspath",
    version,
    about = "eBPF DNS path tracer for Kubernetes nodes"
)]
struct Cli {
    /// Say more on stderr: `-v` adds debug messages (among them the whole verifier log of
    /// a program the kernel rejects), `-vv` trace messages and the kernel programs' own
    /// diagnostics (why a packet could not be parsed, which encapsulation was not entered;
    /// target `dnspath::kernel`). `RUST_LOG` overrides the levels.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Capture and decode every DNS packet at every hop, and kernel drops of DNS packets.
    ///
    /// Examples:
    ///   dnspath trace                          # all interfaces of this network namespace
    ///   dnspath trace -i eth0 -i cni0          # just these
    ///   dnspath trace --all-netns -o json      # every pod namespace too, incl. their `lo`
    ///   dnspath trace --duration 10 --port 53 --port 5353
    ///   dnspath trace --view packets           # a line per packet instead of transaction trees
    ///   dnspath trace --all-netns --until loop # exit 3 once a forwarding loop is found
    ///   dnspath trace -w dns-%H%M%S.pcapng -G 60 -W 10   # every packet, a file a minute
    ///   dnspath trace --all-netns --record /var/lib/dnspath  # a pcapng per incident
    #[command(verbatim_doc_comment)]
    Trace(Box<TraceArgs>),
    /// Decode a pcap or pcapng capture file offline, with the same output as `trace`.
    ///
    /// Reads what tcpdump, tshark and dumpcap write: Ethernet (with VLAN tags), raw IP,
    /// Linux cooked (`tcpdump -i any`: SLL and SLL2) and BSD loopback link types.
    /// A file that ends early or is damaged part-way is analyzed up to the damage, with a
    /// warning on stderr (exit 0); a file that is not a capture at all is an error.
    ///
    /// Examples:
    ///   tcpdump -i any -w dns.pcap port 53    # on the node, then:
    ///   dnspath analyze dns.pcap
    ///   dnspath analyze dns.pcapng -o json --port 53 --port 5353
    ///   zcat dns.pcap.gz | dnspath analyze -
    #[command(verbatim_doc_comment)]
    Analyze(AnalyzeArgs),
    /// Run continuously on a node (a DaemonSet): every network namespace traced, no output
    /// per packet; Prometheus metrics, /healthz and /readyz over HTTP, and one NDJSON line
    /// on stdout per event people act on (loops, race drops, kernel drops of DNS packets,
    /// unanswered and SERVFAIL bursts per server and window, loss warnings). Runs until
    /// SIGTERM, then detaches.
    ///
    /// Examples:
    ///   dnspath agent                               # metrics on 127.0.0.1:9253
    ///   dnspath agent --listen 0.0.0.0:9253         # for a Prometheus scrape
    ///   dnspath agent --namespace-label             # per-query metrics by pod namespace
    #[command(verbatim_doc_comment)]
    Agent(AgentArgs),
    /// Triage DNS on this node: read its files (DNS servers' forward targets, kube-proxy's
    /// rules, resolv.conf), watch the traffic, print findings ranked by severity with what
    /// was seen, why it matters, the evidence and the fix. Exit status: 0 no finding (or
    /// only info), 1 warnings, 2 critical, 4 doctor could not run (docs/doctor.md).
    ///
    /// Examples:
    ///   dnspath doctor                                  # on a node, as root
    ///   dnspath doctor --host-root /host --duration 60s  # kubectl debug node/N --profile=sysadmin
    ///   dnspath doctor -o json
    #[command(verbatim_doc_comment)]
    Doctor(doctor_cli::DoctorArgs),
}

#[path = "main/doctor.rs"]
mod doctor_cli;

#[derive(Args)]
struct AgentArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR:PORT", default_value_t = dnspath::agent::http::DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    /// UDP/TCP port to capture (repeatable).
    #[arg(short, long = "port", default_values_t = [53u16])]
    ports: Vec<u16>,
    /// DNS bytes kept of each packet (see `trace --snaplen`).
    #[arg(short, long, default_value_t = DEFAULT_SNAPLEN,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(tracer_common::MAX_SNAPLEN)))]
    snaplen: u32,
    /// Seconds after which an unanswered query counts as timed out.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    timeout: f64,
    /// Do not trace kernel drops (skb:kfree_skb); for kernels without BTF.
    #[arg(long)]
    no_drops: bool,
    /// Where the node's root file system is mounted (see `trace --host-root`).
    #[arg(long, value_name = "DIR", default_value = "/")]
    host_root: PathBuf,
    /// Add a `namespace` label (the client pod's Kubernetes namespace) to the per-query
    /// metrics; at most MAX distinct namespaces (default 100), the rest labelled `other`.
    #[arg(long, value_name = "MAX", num_args = 0..=1,
          default_missing_value = "100", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    namespace_label: Option<u64>,
    #[command(flatten)]
    record: RecordArgs,
    #[command(flatten)]
    otlp: OtlpArgs,
}

/// OTLP export, for `trace` and `agent` (docs/otlp.md).
#[derive(Args)]
struct OtlpArgs {
    /// Export each decided transaction as OpenTelemetry spans to URL (`http://HOST:PORT`:
    /// OTLP/HTTP protobuf, `/v1/traces` added to a bare host; gRPC with `--otlp-protocol
    /// grpc`). Without it, `OTEL_EXPORTER_OTLP_{,TRACES_}ENDPOINT` turn export on;
    /// `OTEL_EXPORTER_OTLP_{,TRACES_}{PROTOCOL,HEADERS,TIMEOUT,COMPRESSION}` apply.
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
    /// `http/protobuf` or `grpc` (over OTEL_EXPORTER_OTLP_PROTOCOL).
    #[arg(long, value_name = "PROTOCOL")]
    otlp_protocol: Option<String>,
    /// Ratio of traces exported, decided from the trace id (every node keeps the same);
    /// failing and slow transactions are exported regardless.
    #[arg(long, value_name = "RATIO", default_value_t = 1.0)]
    otlp_sample: f64,
    /// Transactions at least this slow (seconds) are exported regardless of sampling.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    otlp_slow: f64,
    /// No query name or answer leaves the node in spans.
    #[arg(long)]
    otlp_redact_names: bool,
    /// The cluster secret the trace and span ids are keyed with (the same file on every
    /// node); else `DNSPATH_OTLP_SECRET`, else none (ids then reveal nothing a guess of the
    /// query could not confirm, but can be confirmed).
    #[arg(long, value_name = "FILE")]
    otlp_secret_file: Option<PathBuf>,
    /// Transactions waiting for the exporter; beyond, new ones are dropped and counted.
    #[arg(long, value_name = "N", default_value_t = 8192,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    otlp_queue: u64,
    /// Seconds the exporter may take at exit to send what is queued.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    otlp_flush_timeout: f64,
    /// This node's name (a DaemonSet: the downward API's `spec.nodeName`): `k8s.node.name`
    /// on every span and `node` on every NDJSON record.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
}

impl OtlpArgs {
    /// The id key and node name for NDJSON, and the exporter's settings if export is on.
    fn config(&self) -> anyhow::Result<Option<dnspath::output::otlp::OtlpConfig>> {
        use dnspath::output::otlp::{ids::IdKey, OtlpConfig, Protocol, SpanConfig};
        let secret = match &self.otlp_secret_file {
            Some(f) => std::fs::read(f)
                .map_err(|e| anyhow::anyhow!("--otlp-secret-file {}: {e}", f.display()))?
                .trim_ascii()
                .to_vec(),
            None => std::env::var("DNSPATH_OTLP_SECRET")
                .unwrap_or_default()
                .into_bytes(),
        };
        let key = IdKey::from_secret(&secret);
        if let Some(n) = &self.node_name {
            if n.is_empty() || n.chars().any(char::is_control) {
                anyhow::bail!("--node-name: give the node's name (no control characters)");
            }
        }
        dnspath::output::otlp::set_identity(key.clone(), self.node_name.as_deref());
        if !(0.0..=1.0).contains(&self.otlp_sample) {
            anyhow::bail!("--otlp-sample {}: a ratio from 0 to 1", self.otlp_sample);
        }
        let protocol = match self.otlp_protocol.as_deref() {
            None => None,
            Some("grpc") => Some(Protocol::Grpc),
            Some("http/protobuf") => Some(Protocol::HttpProtobuf),
            Some(p) => anyhow::bail!("--otlp-protocol {p}: `http/protobuf` or `grpc`"),
        };
        let Some(mut cfg) =
            OtlpConfig::from_env(self.otlp.as_deref(), protocol, |k| std::env::var(k).ok())?
        else {
            return Ok(None);
        };
        cfg.sample = self.otlp_sample;
        cfg.slow_ns = positive_secs(self.otlp_slow, "--otlp-slow")?
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX);
        cfg.flush_timeout = positive_secs(self.otlp_flush_timeout, "--otlp-flush-timeout")?;
        cfg.queue = usize::try_from(self.otlp_queue).unwrap_or(usize::MAX);
        cfg.spans = SpanConfig {
            key,
            node: self.node_name.clone(),
            redact_names: self.otlp_redact_names,
        };
        eprintln!(
            "dnspath: exporting transactions as OTLP spans to {} ({})",
            dnspath::output::escape(&cfg.endpoint),
            match cfg.protocol {
                Protocol::Grpc => "grpc",
                Protocol::HttpProtobuf => "http/protobuf",
            }
        );
        Ok(Some(cfg))
    }
}

/// The flight recorder, for `trace` and `agent`.
#[derive(Args)]
pub(crate) struct RecordArgs {
    /// Flight recorder: keep the last packets in memory and, at each incident (a loop
    /// detected, a race drop, a kernel drop of a DNS packet, an unanswered query, a
    /// SERVFAIL), write the packets around it to a pcapng file in DIR named by the time and
    /// kind of the incident (`dnspath-20261130T232652.123Z-race-drop.pcapng`), the incidents
    /// in its section header comments; the incident's record names the file (`evidence`).
    /// Incidents that overlap share a file. Files are created 0600.
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Seconds of packets before an incident that its file holds.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    record_before: f64,
    /// Seconds of packets after an incident that its file holds.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    record_after: f64,
    /// Megabytes of packets the recorder keeps in memory (its ring, and each file).
    #[arg(long, value_name = "MB", default_value_t = 64)]
    record_buffer: u64,
    /// Megabytes of recorder files DIR keeps; the oldest are deleted first.
    #[arg(long, value_name = "MB", default_value_t = 512)]
    record_max_size: u64,
    /// New recorder files per minute at most; the incidents beyond are counted in
    /// `stats.evidence.record.not_written`.
    #[arg(long, value_name = "N", default_value_t = 6)]
    record_rate: u32,
}

impl RecordArgs {
    pub(crate) fn config(
        &self,
    ) -> anyhow::Result<Option<dnspath::output::recorder::RecorderConfig>> {
        let Some(dir) = &self.record else {
            return Ok(None);
        };
        if !dir.is_dir() {
            anyhow::bail!("--record {}: not a directory", dir.display());
        }
        let ns = |s: f64, flag: &str| -> anyhow::Result<u64> {
            Ok(u64::try_from(positive_secs(s, flag)?.as_nanos()).unwrap_or(u64::MAX))
        };
        Ok(Some(dnspath::output::recorder::RecorderConfig {
            dir: dir.clone(),
            before_ns: ns(self.record_before, "--record-before")?,
            after_ns: ns(self.record_after, "--record-after")?,
            ring_bytes: usize::try_from(self.record_buffer.saturating_mul(1_000_000))
                .unwrap_or(usize::MAX),
            dir_max_bytes: self.record_max_size.saturating_mul(1_000_000),
            files_per_minute: self.record_rate.max(1),
            delay_ns: 0,
        }))
    }
}

#[derive(Args)]
struct AnalyzeArgs {
    /// pcap or pcapng file; `-` reads standard input.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Decode UDP/TCP packets from or to this port (repeatable); the others are skipped
    /// and counted on stderr.
    #[arg(short, long = "port", default_values_t = [53u16])]
    ports: Vec<u16>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// What to show [default: transactions for text, both for json].
    #[arg(long, value_enum)]
    view: Option<View>,
    /// Seconds (of capture time) after which an unanswered query counts as timed out.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    timeout: f64,
    #[command(flatten)]
    filter: FilterArgs,
}

/// What to show. Every stage still sees every packet: counters, the stats record, loop and
/// race detection (and `--until loop`, `--count`) are never filtered.
#[derive(Args)]
#[command(
    next_help_heading = "Filters: what is shown (counters, stats and loop/race detection still see everything)"
)]
struct FilterArgs {
    /// Only records of pods matching NS/NAME (glob, e.g. `kube-system/coredns-*`; without
    /// a `/`, in any namespace); a transaction matches if any of its hops does (repeatable).
    #[arg(long = "pod", value_name = "NS/NAME")]
    pods: Vec<String>,
    /// Only records of pods in this Kubernetes namespace (glob; repeatable).
    #[arg(long = "namespace", value_name = "NS")]
    namespaces: Vec<String>,
    /// Only this query name (glob, case-insensitive, trailing dot optional, e.g.
    /// `*.svc.cluster.local`; repeatable).
    #[arg(long = "name", value_name = "GLOB")]
    names: Vec<String>,
    /// Only these query types (comma-separated or repeated), e.g. `A,AAAA`.
    #[arg(long = "qtype", value_name = "TYPES")]
    qtypes: Vec<String>,
    /// Only responses (and transactions) with these rcodes, e.g. `NXDOMAIN,SERVFAIL`.
    #[arg(long = "rcode", value_name = "RCODES")]
    rcodes: Vec<String>,
    /// Only failures: unanswered, SERVFAIL or REFUSED, dropped, raced, looping.
    #[arg(long)]
    failures: bool,
    /// Only transactions (and races) slower than this, e.g. `100ms`, `1s`; an unanswered
    /// one counts as slower. Packets have no latency and are not shown.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    slower_than: Option<Duration>,
}

impl FilterArgs {
    fn filter(self) -> anyhow::Result<Filter> {
        Ok(Filter::new(&FilterSpec {
            pods: self.pods,
            namespaces: self.namespaces,
            names: self.names,
            qtypes: self.qtypes,
            rcodes: self.rcodes,
            failures: self.failures,
            slower_than_ns: self
                .slower_than
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        })?)
    }
}

#[derive(Args)]
struct TraceArgs {
    /// Interface of this network namespace to attach to (repeatable); default: all.
    #[arg(short, long = "interface", value_name = "IFACE")]
    interfaces: Vec<String>,
    /// Also attach to every interface (including `lo`) of every other network namespace:
    /// named ones (/run/netns) and those of running processes. New ones are picked up
    /// within a second.
    #[arg(long)]
    all_netns: bool,
    /// Also attach to all interfaces of this named network namespace (repeatable).
    #[arg(long = "netns", value_name = "NAME")]
    netns: Vec<String>,
    /// UDP/TCP port to capture (repeatable).
    #[arg(short, long = "port", default_values_t = [53u16])]
    ports: Vec<u16>,
    /// DNS bytes kept of each packet, after the UDP/TCP header (max 4096). The default
    /// holds whole every answer within the 1232-byte EDNS buffer size resolvers use since
    /// DNS Flag Day 2020, and every packet of a 1500-byte-MTU link (at most 1472 bytes of
    /// UDP payload). Longer messages (big answers over TCP or GSO, loopback's 64 KiB MTU)
    /// are decoded as far as they go and marked `capture_truncated`. A packet takes only
    /// its own size in the ring buffer, so small packets cost the same at any snaplen.
    #[arg(short, long, default_value_t = DEFAULT_SNAPLEN,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(tracer_common::MAX_SNAPLEN)))]
    snaplen: u32,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// What to show [default: transactions for text, both for json].
    #[arg(long, value_enum)]
    view: Option<View>,
    /// Seconds after which an unanswered query counts as timed out (resolv.conf default 5).
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    timeout: f64,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Stop after this many packets (at least 1).
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Do not trace kernel drops (skb:kfree_skb); for kernels without BTF.
    #[arg(long)]
    no_drops: bool,
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
    /// suffix k, m, g that many KiB, MiB, GiB (tcpdump's -C). Files get a sequence number
    /// before the extension (`trace-00001.pcapng`).
    #[arg(short = 'C', value_name = "MB", requires = "write", value_parser = parse_file_size)]
    file_size: Option<u64>,
    /// With -w: start a new file every this many seconds (tcpdump's -G). A FILE with `%`
    /// is a strftime pattern (UTC), e.g. `dns-%Y%m%dT%H%M%S.pcapng`.
    #[arg(short = 'G', value_name = "SECONDS", requires = "write")]
    rotate_seconds: Option<u64>,
    /// With -w: keep only the newest N files; older ones are deleted (tcpdump's -W).
    #[arg(short = 'W', value_name = "N", requires = "write")]
    file_count: Option<usize>,
    /// Seconds a packet may wait for its transaction to be decided before it is written
    /// (with -w or --record) without it [default: --timeout + 5].
    #[arg(long, value_name = "SECS")]
    write_delay: Option<f64>,
    /// Megabytes of packets waiting for their transaction; beyond, the oldest are written
    /// without it (counted in `stats.evidence.early`).
    #[arg(long, value_name = "MB", default_value_t = 64)]
    write_buffer: u64,
    #[command(flatten)]
    record: RecordArgs,
    /// Where the node's root file system is mounted (e.g. `/host` in `kubectl debug node/N
    /// --profile=sysadmin`): host processes (/proc), named namespaces (/run/netns,
    /// /var/run/netns) and kubelet's pod logs (/var/log/pods, for pod names) are read under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    host_root: PathBuf,
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

/// `--snaplen` default: a full 1500-byte-MTU packet's payload (1472 bytes of UDP) and more,
/// a power of two. The kernel program's own default (`tracer_common::DEFAULT_SNAPLEN`) only
/// applies when userspace does not set one.
const DEFAULT_SNAPLEN: u32 = 2048;

/// Exit status when `--until loop` found one.
const EXIT_LOOP_FOUND: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "warn,dnspath=debug",
        _ => "warn,dnspath=trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Errors can name files and interfaces: escaped as output is.
            eprintln!("dnspath: {}", dnspath::output::escape(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Longest `--duration`/`--timeout` accepted: about 31 years.
const MAX_SECS: f64 = 1e9;

fn positive_secs(s: f64, flag: &str) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        anyhow::bail!("{flag} must be a positive number of seconds, got {s}")
    }
    if s >= MAX_SECS {
        anyhow::bail!(
            "{flag} {s} is too long: at most {} seconds (about 31 years); leave --duration out to run until stopped",
            MAX_SECS - 1.0
        )
    }
    Ok(Duration::from_secs_f64(s))
}

/// `trace`'s flags that clap accepts but that would make a run capture nothing.
/// tcpdump's `-C`: millions of bytes, or KiB/MiB/GiB with a suffix k, m, g.
fn parse_file_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1_000_000),
    };
    match digits.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n.saturating_mul(unit)),
        _ => Err(format!(
            "{s:?} is not a file size: a positive whole number of MB, or with k, m, g"
        )),
    }
}

fn evidence_options(a: &TraceArgs) -> anyhow::Result<dnspath::trace::EvidenceOptions> {
    let stdout = a.write.as_deref() == Some(std::path::Path::new("-"));
    let rotation = dnspath::output::files::Rotation {
        max_bytes: a.file_size,
        every: a.rotate_seconds.map(|s| Duration::from_secs(s.max(1))),
        keep: a.file_count.map(|n| n.max(1)),
    };
    if stdout && rotation.rotates() {
        anyhow::bail!("-C, -G and -W rotate files: they need -w FILE, not -w -");
    }
    if let Some(w) = &a.write {
        let s = w.to_string_lossy();
        if s.contains('%') {
            dnspath::output::files::strftime(&s, 0).map_err(|e| anyhow::anyhow!("-w {e}"))?;
        }
    }
    Ok(dnspath::trace::EvidenceOptions {
        write: a.write.clone(),
        rotation,
        record: a.record.config()?,
        max_delay_ns: a
            .write_delay
            .map(|s| positive_secs(s, "--write-delay"))
            .transpose()?
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        buffer_bytes: usize::try_from(a.write_buffer.saturating_mul(1_000_000))
            .unwrap_or(usize::MAX),
    })
}

fn check_trace_args(a: &TraceArgs) -> anyhow::Result<()> {
    if a.ports.contains(&0) {
        anyhow::bail!("--port 0 is not a port: give UDP/TCP ports from 1 to 65535");
    }
    if a.count == Some(0) {
        anyhow::bail!(
            "--count 0 would stop before the first packet: give at least 1, or leave --count out to run until stopped"
        );
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // `-vv`: the kernel programs' own diagnostics too (they cost nothing when off).
    let cli_kernel_log = cli.verbose >= 2;
    match cli.command {
        Command::Trace(a) => {
            let a = *a;
            check_trace_args(&a)?;
            let duration = a
                .duration
                .map(|s| positive_secs(s, "--duration"))
                .transpose()?;
            if !a.host_root.is_dir() {
                anyhow::bail!("--host-root {}: not a directory", a.host_root.display());
            }
            dnspath::host::set_root(a.host_root.clone());
            let evidence = evidence_options(&a)?;
            let opts = TraceOptions {
                attach: AttachSpec {
                    interfaces: a.interfaces,
                    all_netns: a.all_netns,
                    netns: a.netns,
                    netns_unreadable: Default::default(),
                },
                ports: a.ports,
                snaplen: a.snaplen,
                format: a.output,
                view: a.view.unwrap_or(match a.output {
                    Format::Text => View::Transactions,
                    Format::Json => View::Both,
                }),
                timeout: positive_secs(a.timeout, "--timeout")?,
                duration,
                count: a.count,
                drops: !a.no_drops,
                kernel_log: cli_kernel_log,
                until_loop: a.until == Some(Until::Loop),
                evidence,
                filter: a.filter.filter()?,
                every_packet: true,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let until_loop = opts.until_loop;
            // `-w -` puts the pcapng on standard output; the records go to stderr then.
            let out: Box<dyn std::io::Write + Send> =
                if a.write.as_deref() == Some(std::path::Path::new("-")) {
                    Box::new(BufWriter::new(std::io::stderr()))
                } else {
                    Box::new(BufWriter::new(std::io::stdout()))
                };
            let otlp = a.otlp.config()?;
            let mut writer = trace::TraceWriter::new(&opts, out)?;
            // Every way out of `run_live` has detached and removed the pinned maps by now.
            let summary = match otlp {
                Some(cfg) => {
                    let exporter = dnspath::output::otlp::Exporter::start(cfg)?;
                    let mut sink = trace::OtlpSink::new(&mut writer, exporter);
                    rt.block_on(trace::run_live(opts, &mut sink))?
                }
                None => rt.block_on(trace::run_live(opts, &mut writer))?,
            };
            // `dnspath trace | head` (`summary.output_closed`): the reader has what it
            // wanted, which is no error.
            if until_loop && summary.loop_found {
                return Ok(ExitCode::from(EXIT_LOOP_FOUND));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Agent(a) => {
            if a.ports.contains(&0) {
                anyhow::bail!("--port 0 is not a port: give UDP/TCP ports from 1 to 65535");
            }
            if !a.host_root.is_dir() {
                anyhow::bail!("--host-root {}: not a directory", a.host_root.display());
            }
            dnspath::host::set_root(a.host_root.clone());
            let opts = dnspath::agent::run::AgentOptions {
                trace: TraceOptions {
                    attach: AttachSpec {
                        interfaces: Vec::new(),
                        all_netns: true,
                        netns: Vec::new(),
                        netns_unreadable: Default::default(),
                    },
                    ports: a.ports,
                    snaplen: a.snaplen,
                    format: Format::Json,
                    view: View::Transactions,
                    timeout: positive_secs(a.timeout, "--timeout")?,
                    duration: None,
                    count: None,
                    drops: !a.no_drops,
                    kernel_log: cli_kernel_log,
                    until_loop: false,
                    evidence: dnspath::trace::EvidenceOptions {
                        record: a.record.config()?,
                        buffer_bytes: 64_000_000,
                        ..Default::default()
                    },
                    // The agent counts and reports everything.
                    filter: dnspath::output::filter::Filter::default(),
                    // Its sink writes no packets: it counts them from the stats.
                    every_packet: false,
                },
                listen: a.listen,
                otlp: a.otlp.config()?,
                metrics: dnspath::agent::metrics::MetricsConfig {
                    namespace_label: a
                        .namespace_label
                        .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                    ..Default::default()
                },
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let out = std::io::LineWriter::new(std::io::stdout());
            rt.block_on(dnspath::agent::run::run(opts, out))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor(a) => doctor_cli::run(a, cli_kernel_log),
        Command::Analyze(a) => {
            let opts = AnalyzeOptions {
                path: a.file,
                view: a.view.unwrap_or(match a.output {
                    Format::Text => View::Transactions,
                    Format::Json => View::Both,
                }),
                format: a.output,
                timeout: positive_secs(a.timeout, "--timeout")?,
                ports: a.ports,
                filter: a.filter.filter()?,
            };
            let out = Box::new(std::io::stdout());
            match analyze::run(opts, out) {
                // `dnspath analyze big.pcap | head`: the reader has what it wanted.
                Err(AnalyzeError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                r => {
                    r?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

//! Flag groups more than one command takes (`#[command(flatten)]`), so that a flag means the
//! same and is spelled the same in `trace`, `agent`, `doctor` and `analyze`.
use std::path::PathBuf;

use clap::Args;
use dnspath::{
    kernel::ProbeOptions,
    output::filter::{Filter, FilterSpec},
};

use crate::units::{parse_secs, parse_size, Secs};

/// `--snaplen` default: a full 1500-byte-MTU packet's payload (1472 bytes of UDP) and more,
/// a power of two. The kernel program's own default (`tracer_common::DEFAULT_SNAPLEN`) only
/// applies when userspace does not set one.
pub const DEFAULT_SNAPLEN: u32 = 2048;

/// What the kernel programs capture, for `trace` and `agent`.
#[derive(Args)]
pub struct CaptureArgs {
    /// UDP/TCP port to capture (repeatable), e.g. `--port 53 --port 5353`. A port that
    /// conntrack shows one of these redirected to (a DNS proxy in a pod, `-j REDIRECT
    /// --to-ports 15053`) is captured too, from then on.
    #[arg(short, long = "port", default_values_t = [53u16])]
    pub ports: Vec<u16>,
    /// DNS bytes kept of each packet, after the UDP/TCP header (max 4096). The default
    /// holds whole every answer within the 1232-byte EDNS buffer size resolvers use since
    /// DNS Flag Day 2020, and every packet of a 1500-byte-MTU link (at most 1472 bytes of
    /// UDP payload). Longer messages (big answers over TCP or GSO, loopback's 64 KiB MTU)
    /// are decoded as far as they go and marked `capture_truncated`. A packet takes only
    /// its own size in the ring buffer, so small packets cost the same at any snaplen.
    #[arg(short, long, default_value_t = DEFAULT_SNAPLEN,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(tracer_common::MAX_SNAPLEN)))]
    pub snaplen: u32,
    /// Do not trace kernel drops (skb:kfree_skb); for kernels without BTF.
    #[arg(long)]
    pub no_drops: bool,
}

impl CaptureArgs {
    /// What the kernel programs capture, with `-vv`'s `kernel_log`.
    pub fn probe(&self, kernel_log: bool) -> ProbeOptions {
        ProbeOptions {
            ports: self.ports.clone(),
            snaplen: self.snaplen,
            drops: !self.no_drops,
            kernel_log,
        }
    }

    /// Refuses a port that would capture nothing.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.ports.contains(&0) {
            anyhow::bail!("--port 0 is not a port: give UDP/TCP ports from 1 to 65535");
        }
        Ok(())
    }
}

/// The correlate stage's timeout, for `trace`, `agent` and `doctor`.
#[derive(Args)]
pub struct TimeoutArgs {
    /// Seconds after which an unanswered query counts as timed out (resolv.conf default 5),
    /// e.g. `5`, `1.5`, `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = parse_secs)]
    pub timeout: Secs,
}

/// The node's root file system, for `trace`, `agent` and `doctor`.
#[derive(Args)]
pub struct HostRootArgs {
    /// Where the node's root file system is mounted (e.g. `/host` in `kubectl debug node/N
    /// --profile=sysadmin`): host processes (/proc), named namespaces (/run/netns,
    /// /var/run/netns), resolv.conf and kubelet's files (/var/log/pods, for pod names) are
    /// read under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub host_root: PathBuf,
}

impl HostRootArgs {
    /// Checks the directory and makes it the root every host file is read under.
    pub fn apply(&self) -> anyhow::Result<()> {
        if !self.host_root.is_dir() {
            anyhow::bail!("--host-root {}: not a directory", self.host_root.display());
        }
        dnspath::host::set_root(self.host_root.clone());
        Ok(())
    }
}

/// OTLP export, for `trace` and `agent` (docs/otlp.md).
#[derive(Args)]
pub struct OtlpArgs {
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
    /// Transactions at least this slow (seconds, or e.g. `500ms`) are exported regardless
    /// of sampling.
    #[arg(long, value_name = "DURATION", default_value = "1", value_parser = parse_secs)]
    otlp_slow: Secs,
    /// No query name or answer leaves the node in spans.
    #[arg(long)]
    otlp_redact_names: bool,
    /// The cluster secret the trace and span ids are keyed with (the same file on every
    /// node); else `DNSPATH_OTLP_SECRET`, else none (ids then reveal nothing a guess of the
    /// query could not confirm, but can be confirmed).
    #[arg(long, value_name = "FILE")]
    otlp_secret_file: Option<PathBuf>,
    /// Transactions waiting for the exporter (and at most 8 MiB of them); beyond, new ones
    /// are dropped and counted.
    #[arg(long, value_name = "N", default_value_t = 8192,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    otlp_queue: u64,
    /// Seconds the exporter may take at exit to send what is queued.
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = parse_secs)]
    otlp_flush_timeout: Secs,
    /// This node's name (a DaemonSet: the downward API's `spec.nodeName`): `k8s.node.name`
    /// on every span and `node` on every NDJSON record.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
}

impl OtlpArgs {
    /// The key trace ids are made with (`--otlp-secret-file`, `DNSPATH_OTLP_SECRET`), with
    /// `--node-name` checked.
    fn key(&self) -> anyhow::Result<dnspath::output::otlp::ids::IdKey> {
        let secret = match &self.otlp_secret_file {
            Some(f) => std::fs::read(f)
                .map_err(|e| anyhow::anyhow!("--otlp-secret-file {}: {e}", f.display()))?
                .trim_ascii()
                .to_vec(),
            None => std::env::var("DNSPATH_OTLP_SECRET")
                .unwrap_or_default()
                .into_bytes(),
        };
        if let Some(n) = &self.node_name {
            if n.is_empty() || n.chars().any(char::is_control) {
                anyhow::bail!("--node-name: give the node's name (no control characters)");
            }
        }
        Ok(dnspath::output::otlp::ids::IdKey::from_secret(&secret))
    }

    /// What NDJSON records carry besides themselves: `trace_id` (made with the key) and
    /// `node`.
    pub fn identity(&self) -> anyhow::Result<dnspath::output::otlp::Identity> {
        Ok(dnspath::output::otlp::Identity::new(
            self.key()?,
            self.node_name.as_deref(),
        ))
    }

    /// The exporter's settings if export is on.
    pub fn config(&self) -> anyhow::Result<Option<dnspath::output::otlp::OtlpConfig>> {
        use dnspath::output::otlp::{OtlpConfig, Protocol, SpanConfig};
        let key = self.key()?;
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
        cfg.slow_ns = self.otlp_slow.positive_ns("--otlp-slow")?;
        cfg.flush_timeout = self.otlp_flush_timeout.positive("--otlp-flush-timeout")?;
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

/// The flight recorder, for `trace`, `agent` and `doctor`.
#[derive(Args)]
pub struct RecordArgs {
    /// Flight recorder: keep the last packets in memory and, at each incident (a loop
    /// detected, a race drop, a kernel drop of a DNS packet, an unanswered query, a
    /// SERVFAIL), write the packets around it to a pcapng file in DIR named by the time and
    /// kind of the incident (`dnspath-20261130T232652.123Z-race-drop.pcapng`), the incidents
    /// in its section header comments; the incident's record names the file (`evidence`).
    /// Incidents that overlap share a file. Files are created 0600.
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Seconds of packets before an incident that its file holds.
    #[arg(long, value_name = "DURATION", default_value = "10", value_parser = parse_secs)]
    record_before: Secs,
    /// Seconds of packets after an incident that its file holds.
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = parse_secs)]
    record_after: Secs,
    /// Packets the recorder keeps in memory (its ring, and each file; as much again of
    /// packets waiting for their transaction), counted as held in memory: megabytes, or
    /// e.g. `256MiB`.
    #[arg(long, value_name = "SIZE", default_value = "64", value_parser = parse_size)]
    record_buffer: u64,
    /// Recorder files DIR keeps (megabytes, or e.g. `2GiB`); the oldest are deleted first.
    #[arg(long, value_name = "SIZE", default_value = "512", value_parser = parse_size)]
    record_max_size: u64,
    /// New recorder files per minute at most; the incidents beyond are counted in
    /// `stats.evidence.record.not_written`.
    #[arg(long, value_name = "N", default_value_t = 6)]
    record_rate: u32,
}

impl RecordArgs {
    pub fn config(&self) -> anyhow::Result<Option<dnspath::evidence::recorder::RecorderConfig>> {
        let Some(dir) = &self.record else {
            return Ok(None);
        };
        if !dir.is_dir() {
            anyhow::bail!("--record {}: not a directory", dir.display());
        }
        Ok(Some(dnspath::evidence::recorder::RecorderConfig {
            dir: dir.clone(),
            before_ns: self.record_before.positive_ns("--record-before")?,
            after_ns: self.record_after.positive_ns("--record-after")?,
            ring_bytes: usize::try_from(self.record_buffer).unwrap_or(usize::MAX),
            dir_max_bytes: self.record_max_size,
            files_per_minute: self.record_rate.max(1),
            delay_ns: 0,
        }))
    }
}

/// What to show. Every stage still sees every packet: counters, the stats record, loop and
/// race detection (and `--until loop`, `--count`) are never filtered.
#[derive(Args)]
#[command(
    next_help_heading = "Filters: what is shown (counters, stats and loop/race detection still see everything)"
)]
pub struct FilterArgs {
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
    /// Only transactions (and races) slower than this, e.g. `100ms`, `1s`, `0.5`; an
    /// unanswered one counts as slower. Packets have no latency and are not shown.
    #[arg(long, value_name = "DURATION", value_parser = parse_secs)]
    slower_than: Option<Secs>,
}

impl FilterArgs {
    pub fn filter(self) -> anyhow::Result<Filter> {
        let slower_than = self
            .slower_than
            .map(|s| s.non_negative("--slower-than"))
            .transpose()?;
        Ok(Filter::new(&FilterSpec {
            pods: self.pods,
            namespaces: self.namespaces,
            names: self.names,
            qtypes: self.qtypes,
            rcodes: self.rcodes,
            failures: self.failures,
            slower_than_ns: slower_than.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        })?)
    }
}

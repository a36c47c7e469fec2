//! `dnspath agent`'s command line: the DaemonSet mode's flags and its run.
use std::process::ExitCode;

use clap::Args;
use dnspath::trace::RunOptions;

use crate::args::{CaptureArgs, HostRootArgs, OtlpArgs, RecordArgs, TimeoutArgs};

#[derive(Args)]
pub struct AgentArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR:PORT", default_value_t = dnspath::agent::http::DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    #[command(flatten)]
    capture: CaptureArgs,
    #[command(flatten)]
    timeout: TimeoutArgs,
    #[command(flatten)]
    host_root: HostRootArgs,
    /// Add a `namespace` label (the client pod's Kubernetes namespace) to the per-query
    /// metrics; at most MAX distinct namespaces (default 100), the rest labelled `other`.
    #[arg(long, value_name = "MAX", num_args = 0..=1,
          default_missing_value = "100", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    namespace_label: Option<u64>,
    #[command(flatten)]
    record: RecordArgs,
    #[command(flatten)]
    otlp: OtlpArgs,
    /// Fold the traffic into doctor's findings over windows of SECS seconds: each window's
    /// findings become `finding` lines of the event stream and `dnspath_findings{kind}`.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    findings_window: u64,
    /// Trace only this named network namespace (`ip netns`, repeatable) besides the agent's
    /// own, instead of every namespace of the node: a testing aid for several "nodes" on one
    /// machine (docs/metrics.md, "Counted once across the cluster"). A DaemonSet leaves it out.
    #[arg(long = "netns", value_name = "NAME")]
    netns: Vec<String>,
}

pub fn run(a: AgentArgs, kernel_log: bool) -> anyhow::Result<ExitCode> {
    a.capture.check()?;
    a.host_root.apply()?;
    let mut trace = RunOptions::node_wide(
        a.capture.probe(kernel_log),
        a.timeout.timeout.positive("--timeout")?,
        a.record.config()?,
    );
    if !a.netns.is_empty() {
        trace.attach.all_netns = false;
        trace.attach.netns = a.netns;
    }
    let opts = dnspath::agent::run::AgentOptions {
        trace,
        listen: a.listen,
        otlp: a.otlp.config()?,
        metrics: dnspath::agent::metrics::MetricsConfig {
            namespace_label: a
                .namespace_label
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            ..Default::default()
        },
        events: dnspath::agent::events::EventsConfig {
            findings_window_ns: a.findings_window * 1_000_000_000,
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

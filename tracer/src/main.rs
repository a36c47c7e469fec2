//! `dnspath`: follow DNS packets through every hop of a Kubernetes node.
//!
//! One module a command (`main/trace.rs`, `main/top.rs`, …), the flag groups they share (`main/args.rs`),
//! and the one syntax of durations and sizes (`main/units.rs`).
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[path = "main/agent.rs"]
mod agent;
#[path = "main/analyze.rs"]
mod analyze;
#[path = "main/args.rs"]
mod args;
#[path = "main/doctor.rs"]
mod doctor;
#[path = "main/top.rs"]
mod top;
#[path = "main/trace.rs"]
mod trace;
#[path = "main/units.rs"]
mod units;

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
    Trace(Box<trace::TraceArgs>),
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
    Analyze(analyze::AnalyzeArgs),
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
    Agent(agent::AgentArgs),
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
    Doctor(doctor::DoctorArgs),
    /// Live tables of every namespace's DNS, refreshed every second: clients (questions/s,
    /// answered %, NXDOMAIN, SERVFAIL, unanswered, late, dropped, p50/p99, search-list
    /// expansion), servers (rcodes, unanswered, p50/p99, a forwarder's own time against its
    /// upstream's), names, and a status line (packets/s, loss, races, loops, kernel drops).
    /// Full-screen on a terminal (80×24 at least; `q` quits, Tab switches table, ←/→ sort);
    /// `--once` or `-o json` for scripts. Takes `trace`'s filters.
    ///
    /// Examples:
    ///   dnspath top                                   # full-screen, every namespace
    ///   dnspath top --namespace kube-system --sort p99_ms
    ///   dnspath top --once --duration 10              # one table after 10 s
    ///   dnspath top -o json --interval 5 | jq .servers  # a snapshot every 5 s
    #[command(verbatim_doc_comment)]
    Top(top::TopArgs),
}

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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // `-vv`: the kernel programs' own diagnostics too (they cost nothing when off).
    let kernel_log = cli.verbose >= 2;
    match cli.command {
        Command::Trace(a) => trace::run(*a, kernel_log),
        Command::Agent(a) => agent::run(a, kernel_log),
        Command::Doctor(a) => doctor::run(a, kernel_log),
        Command::Analyze(a) => analyze::run(a),
        Command::Top(a) => top::run(a, kernel_log),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks of every flag (names, groups, defaults parse).
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}

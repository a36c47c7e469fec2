//! The live section: dnsperf at fixed rates under nothing, `dnspath trace`, `dnspath agent`
//! (without and with OTLP export to a running Arize Phoenix) and tcpdump + tshark, and the eBPF programs' cost on packets that are not DNS.
use anyhow::anyhow;
use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use lab::{DnsPodConfig, DnsServerKind, Lab, LabConfig, Pod};

use super::{
    bpf::{print_progs, prog_delta, progs, ProgCosts},
    dnsperf::{dnsperf, Dnsperf},
    opt_u64,
    phoenix::Receiver,
    proc::{
        cpu_children_self, cpu_s, thread_cpu_delta, thread_cpu_line, thread_cpu_s, vm_hwm_kib,
        vm_rss_kib,
    },
    thousands,
    tool::{agent_get, is_stats, last_stats, metric, Tool, AGENT_LISTEN},
    truth::Truth,
    LiveOptions,
};

/// Queries dnsperf cycles through: names of the lab's zone, answered from dnsmasq's cache.
const QUERIES: &str = "www.lab.test A\nwww.lab.test AAAA\nalias.lab.test A\ntxt.lab.test TXT\n\
medium.lab.test TXT\n_dns._udp.lab.test SRV\nns.lab.test A\nns.lab.test AAAA\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nothing,
    Trace,
    Agent,
    /// The agent exporting every transaction (`--otlp-sample 1`) to Phoenix.
    AgentOtlp,
    /// The agent exporting a tenth of the traces (`--otlp-sample 0.1`) and every failing or
    /// slow transaction to Phoenix.
    AgentOtlpTenth,
    /// `dnspath top -o json`: its tables of every namespace, a snapshot a second.
    Top,
    Tcpdump,
}

impl Mode {
    /// The sampled export before the full one: Phoenix takes seconds to ingest what a
    /// full export sent it, and refuses more meanwhile.
    const ALL: [Mode; 7] = [
        Mode::Nothing,
        Mode::Trace,
        Mode::Agent,
        Mode::Top,
        Mode::AgentOtlpTenth,
        Mode::AgentOtlp,
        Mode::Tcpdump,
    ];

    /// `--otlp-sample` of an exporting agent's row.
    fn otlp_sample(self) -> Option<&'static str> {
        match self {
            Mode::AgentOtlp => Some("1"),
            Mode::AgentOtlpTenth => Some("0.1"),
            _ => None,
        }
    }

    fn is_agent(self) -> bool {
        matches!(self, Mode::Agent | Mode::AgentOtlp | Mode::AgentOtlpTenth)
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Nothing => "nothing",
            Mode::Trace => "dnspath trace --all-netns -o json",
            Mode::Agent => "dnspath agent",
            Mode::AgentOtlp => "dnspath agent --otlp (Phoenix)",
            Mode::AgentOtlpTenth => "dnspath agent --otlp --otlp-sample 0.1",
            Mode::Top => "dnspath top -o json",
            Mode::Tcpdump => "tcpdump -w + tshark -r",
        }
    }
}

/// One tool at one rate.
#[derive(Debug, Default)]
struct Row {
    perf: Dnsperf,
    /// CPU-seconds of the tool during the window (tcpdump's only for tcpdump).
    tool_cpu_s: Option<f64>,
    /// tshark's CPU-seconds (children included) reading the file afterwards, and its wall time.
    tshark: Option<(f64, f64)>,
    servers_cpu_s: f64,
    captured: Option<u64>,
    /// DNS packets netfilter counted on the lab's hops in the tool's run (every namespace;
    /// for tcpdump, the node's namespace it captures in).
    truth: Option<u64>,
    lost: Option<u64>,
    /// Summarised + shed (dnspath only).
    summarised: Option<u64>,
    hwm_kib: Option<u64>,
    /// VmRSS at the end of the run (steady state).
    rss_kib: Option<u64>,
    progs: ProgCosts,
}

impl Row {
    fn tool_us_per_query(&self) -> Option<f64> {
        let total = self.tool_cpu_s? + self.tshark.map_or(0.0, |t| t.0);
        Some(per_query_us(total, self.perf.completed))
    }
}

fn mib(kib: Option<u64>) -> String {
    kib.map(|k| format!("{:.0} MiB", k as f64 / 1024.0))
        .unwrap_or_else(|| "-".into())
}

fn per_query_us(cpu_s: f64, queries: u64) -> f64 {
    cpu_s * 1e6 / queries.max(1) as f64
}

fn servers_cpu(pids: &[String]) -> f64 {
    pids.iter().filter_map(|p| cpu_s(p, true)).sum()
}

/// What every measurement runs in: the lab, its netfilter counters, the binary, dnsperf's
/// query file and the DNS servers' PIDs.
struct Setup<'a> {
    lab: &'a Lab,
    truth: Truth<'a>,
    dnspath: String,
    queries: PathBuf,
    servers: Vec<String>,
    /// Phoenix's OTLP/HTTP endpoint in the node namespace, when it is installed.
    otlp: Option<String>,
}

/// `dnspath top -o json`'s snapshot lines (the last one says the run's packets).
fn is_top(line: &str) -> bool {
    line.contains("\"type\":\"top\"")
}

/// Runs dnsperf at `rate` under `mode` and measures.
fn measure(s: &Setup, mode: Mode, rate: u32, o: &LiveOptions) -> crate::Result<Row> {
    let Setup {
        lab,
        truth,
        dnspath,
        queries,
        servers,
        otlp,
    } = s;
    let dnspath = dnspath.as_str();
    let node = lab.node_ns();
    let pcap = lab.temp_dir().join(format!("bench-{rate}.pcap"));
    let pcap_s = pcap.to_string_lossy().into_owned();
    truth.zero();
    let tool = match mode {
        Mode::Nothing => None,
        Mode::Trace => Some(Tool::start(
            lab,
            node,
            &[dnspath, "trace", "--all-netns", "-o", "json"],
            is_stats,
            "dnspath: tracing",
        )?),
        Mode::Agent | Mode::AgentOtlp | Mode::AgentOtlpTenth => {
            let mut args = vec![dnspath, "agent", "--listen", AGENT_LISTEN];
            if let Some(sample) = mode.otlp_sample() {
                let url = otlp
                    .as_deref()
                    .ok_or_else(|| anyhow!("no OTLP receiver (`cargo xtask setup`)"))?;
                args.extend(["--otlp", url, "--otlp-sample", sample]);
            }
            let t = Tool::start(lab, node, &args, is_stats, "dnspath: tracing")?;
            let deadline = Instant::now() + Duration::from_secs(15);
            while agent_get(lab, "/readyz").is_none() {
                if Instant::now() > deadline {
                    let s = t.stop(libc::SIGTERM);
                    return Err(anyhow!("agent never ready: {}", s.stderr));
                }
                thread::sleep(Duration::from_millis(100));
            }
            Some(t)
        }
        Mode::Top => Some(Tool::start(
            lab,
            node,
            &[dnspath, "top", "-o", "json"],
            is_top,
            "dnspath: tracing",
        )?),
        Mode::Tcpdump => Some(Tool::start(
            lab,
            node,
            &[
                "tcpdump", "-i", "any", "-n", "-s", "0", "-w", &pcap_s, "udp", "port", "53",
            ],
            |_| false,
            "listening on",
        )?),
    };
    let pid = tool.as_ref().map(|t| t.pid().to_string());
    let before_tool = pid.as_deref().and_then(|p| cpu_s(p, false));
    let before_threads = pid.as_deref().map(thread_cpu_s).unwrap_or_default();
    let before_servers = servers_cpu(servers);
    let before_progs = tool.as_ref().map(|t| progs(t.pid())).unwrap_or_default();
    let perf = dnsperf(lab, queries, rate, o.seconds);
    // Let the tool drain what the last queries left.
    thread::sleep(Duration::from_secs(1));
    let after_tool = pid.as_deref().and_then(|p| cpu_s(p, false));
    let after_threads = pid.as_deref().map(thread_cpu_s).unwrap_or_default();
    let after_servers = servers_cpu(servers);
    let after_progs = tool.as_ref().map(|t| progs(t.pid())).unwrap_or_default();
    let hwm_kib = tool.as_ref().and_then(|t| vm_hwm_kib(t.pid()));
    let rss_kib = tool.as_ref().and_then(|t| vm_rss_kib(t.pid()));
    let scrape = mode
        .is_agent()
        .then(|| agent_get(lab, "/metrics"))
        .flatten();
    let stopped = tool.map(|t| {
        t.stop(if mode.is_agent() {
            libc::SIGTERM
        } else {
            libc::SIGINT
        })
    });
    if let Some(s) = stopped
        .as_ref()
        .filter(|s| !s.status.is_some_and(|st| st.success()))
    {
        eprintln!(
            "bench: {} exited {:?}: {}",
            mode.label(),
            s.status,
            s.stderr
        );
    }
    let (all, node) = truth.read();
    let perf = perf?;
    let mut row = Row {
        perf,
        truth: if mode == Mode::Tcpdump { node } else { all },
        tool_cpu_s: before_tool.zip(after_tool).map(|(b, a)| a - b),
        servers_cpu_s: after_servers - before_servers,
        hwm_kib,
        rss_kib,
        progs: prog_delta(&before_progs, &after_progs),
        ..Row::default()
    };
    match mode {
        Mode::Nothing => {}
        Mode::Trace => {
            let stats = stopped.as_ref().and_then(|s| last_stats(&s.stdout));
            let n = |k: &str| stats.as_ref().and_then(|s| s[k].as_u64());
            row.captured = n("packets");
            row.lost = n("lost");
            row.summarised = n("summarised").zip(n("shed")).map(|(a, b)| a + b);
            // Records its output's queue dropped because this reader did not keep up.
            for s in stats
                .iter()
                .flat_map(|s| s["sinks"].as_array().cloned().unwrap_or_default())
            {
                eprintln!(
                    "bench: dnspath trace's {} wrote {} records and dropped {}",
                    s["name"].as_str().unwrap_or("?"),
                    s["written"],
                    s["dropped"]
                );
            }
            if stats.is_none() {
                eprintln!(
                    "bench: dnspath trace printed no stats record: {}",
                    stopped.map(|s| s.stderr).unwrap_or_default()
                );
            }
        }
        Mode::Agent | Mode::AgentOtlp | Mode::AgentOtlpTenth => {
            eprintln!(
                "bench: {} CPU by thread: {}",
                mode.label(),
                thread_cpu_line(&before_threads, &after_threads)
            );
            let scrape = scrape.unwrap_or_default();
            row.captured = metric(&scrape, "dnspath_packets_total", "");
            row.lost = metric(&scrape, "dnspath_events_lost_total", "event=\"packet\"");
            row.summarised = metric(&scrape, "dnspath_summarised_packets_total", "");
            if mode.otlp_sample().is_some() {
                let spans = metric(&scrape, "dnspath_otlp_spans_exported_total", "");
                let txs = metric(&scrape, "dnspath_otlp_transactions_exported_total", "");
                let dropped = metric(&scrape, "dnspath_otlp_transactions_dropped_total", "");
                let sampled_out =
                    metric(&scrape, "dnspath_otlp_transactions_sampled_out_total", "");
                eprintln!(
                    "bench: {} exported {} transactions ({} spans), dropped {}, sampled out {}",
                    mode.label(),
                    opt_u64(txs),
                    opt_u64(spans),
                    opt_u64(dropped),
                    opt_u64(sampled_out)
                );
                // The exporter thread's CPU per transaction it sent (its thread is named).
                let export_s = thread_cpu_delta(&before_threads, &after_threads)
                    .iter()
                    .find(|(n, _)| n == "otlp-export")
                    .map(|(_, s)| *s);
                if let (Some(s), Some(t)) = (export_s, txs.filter(|t| *t > 0)) {
                    eprintln!(
                        "bench: {}: otlp-export thread {s:.2} s CPU, {:.1} µs per transaction exported",
                        mode.label(),
                        s * 1e6 / t as f64
                    );
                }
            }
        }
        Mode::Top => {
            // Its last snapshot, written at the end: the run's packets and losses.
            let last = stopped.as_ref().and_then(|s| {
                s.stdout
                    .iter()
                    .rev()
                    .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            });
            let status = last.as_ref().map(|v| &v["status"]);
            row.captured = status.and_then(|s| s["packets"].as_u64());
            row.lost = status.and_then(|s| s["lost"].as_u64());
            if last.is_none() {
                eprintln!(
                    "bench: dnspath top printed no snapshot: {}",
                    stopped.map(|s| s.stderr).unwrap_or_default()
                );
            }
        }
        Mode::Tcpdump => {
            let err = stopped.map(|s| s.stderr).unwrap_or_default();
            let count = |what: &str| {
                err.lines()
                    .find(|l| l.ends_with(what))
                    .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            };
            row.captured = count("packets captured");
            row.lost = count("packets dropped by kernel");
            row.tshark = Some(tshark(&pcap)?);
            let _ = fs::remove_file(&pcap);
        }
    }
    Ok(row)
}

/// CPU-seconds (children included: read as this process's reaped children's times) and
/// wall seconds of `tshark -r FILE -Y dns -T fields -e dns.qry.name -e dns.id > /dev/null`.
fn tshark(file: &Path) -> crate::Result<(f64, f64)> {
    let before = cpu_children_self();
    let start = Instant::now();
    let null = fs::File::create("/dev/null").map_err(|e| anyhow!("/dev/null: {e}"))?;
    let out = std::process::Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-Y",
            "dns",
            "-T",
            "fields",
            "-e",
            "dns.qry.name",
            "-e",
            "dns.id",
        ])
        .stdin(Stdio::null())
        .stdout(null)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| anyhow!("tshark: {e}"))?;
    let wall = start.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(anyhow!(
            "tshark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((cpu_children_self() - before, wall))
}

fn print_rate(rate: u32, seconds: u64, rows: &[(Mode, Row)]) {
    println!("\nlive: dnsperf -Q {rate} for {seconds} s, client pod → ClusterIP → 2 dnsmasq pods (cached answers)");
    println!(
        "  {:<34} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>13} {:>12} {:>11} {:>11} {:>8} {:>10} {:>8} {:>8}",
        "under",
        "qps",
        "lost",
        "avg ms",
        "p50 ms",
        "p99 ms",
        "sd ms",
        "max ms",
        "tool µs/q",
        "dnsmasq µs/q",
        "captured",
        "netfilter",
        "lost",
        "summarised",
        "VmRSS",
        "VmHWM"
    );
    for (mode, r) in rows {
        println!(
            "  {:<34} {:>8.0} {:>8} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.2} {:>13} {:>12.1} {:>11} {:>11} {:>8} {:>10} {:>8} {:>8}",
            mode.label(),
            r.perf.qps,
            r.perf.lost,
            r.perf.avg_ms,
            r.perf.p50_ms,
            r.perf.p99_ms,
            r.perf.stddev_ms,
            r.perf.max_ms,
            r.tool_us_per_query()
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "-".into()),
            per_query_us(r.servers_cpu_s, r.perf.completed),
            opt_u64(r.captured),
            opt_u64(r.truth),
            opt_u64(r.lost),
            opt_u64(r.summarised),
            mib(r.rss_kib),
            mib(r.hwm_kib),
        );
    }
    let tcpdump = rows
        .iter()
        .find(|(m, _)| *m == Mode::Tcpdump)
        .and_then(|(_, r)| r.tool_us_per_query());
    for (mode, r) in rows {
        let Some(us) = r.tool_us_per_query() else {
            continue;
        };
        let servers = per_query_us(r.servers_cpu_s, r.perf.completed);
        let mut line = format!(
            "  {}: {us:.1} µs CPU/query = {:.1}× the dnsmasq pods' {servers:.1} µs (same run)",
            mode.label(),
            us / servers.max(1e-9)
        );
        let agent = rows
            .iter()
            .find(|(m, _)| *m == Mode::Agent)
            .and_then(|(_, r)| r.tool_us_per_query());
        if let (Some(_), Some(a)) = (mode.otlp_sample(), agent) {
            line.push_str(&format!(
                " = {:.2}× the agent without export (same run, {:+.0} %)",
                us / a.max(1e-9),
                100.0 * (us / a.max(1e-9) - 1.0)
            ));
        }
        if let Some((cpu, wall)) = r.tshark {
            line.push_str(&format!(
                " [tcpdump {:.1} µs + tshark {:.1} µs, tshark took {wall:.1} s]",
                per_query_us(r.tool_cpu_s.unwrap_or(0.0), r.perf.completed),
                per_query_us(cpu, r.perf.completed)
            ));
        } else if let Some(t) = tcpdump {
            line.push_str(&format!(" = {:.2}× tcpdump+tshark", us / t.max(1e-9)));
        }
        if let Some(c) = r.captured {
            let per_query = c as f64 / r.perf.completed.max(1) as f64;
            line.push_str(&format!(
                "; {per_query:.1} packets/query read (≈ {:.0} packets/s), {:.1} µs per packet read",
                per_query * r.perf.qps,
                us / per_query.max(1e-9)
            ));
            if let Some(t) = r.truth {
                line.push_str(&format!(
                    "; read {c} of the {t} DNS packets netfilter counted on the hops ({:.1} %)",
                    100.0 * c as f64 / t.max(1) as f64
                ));
            }
            let lost = r.lost.unwrap_or(0);
            if lost > 0 {
                line.push_str(&format!(
                    "; {:.0}% of packets LOST before userspace: CPU/query understates the cost",
                    100.0 * lost as f64 / (lost + c).max(1) as f64
                ));
            }
        }
        println!("{line}");
        print_progs(&r.progs);
    }
    print_goals(rate, rows);
}

/// The goals of issues #44, #29 and #26 at this rate, each next to its figure of this run.
fn print_goals(rate: u32, rows: &[(Mode, Row)]) {
    use super::{goal, goal_no_loss};
    let row = |mode| rows.iter().find(|(m, _)| *m == mode).map(|(_, r)| r);
    let agent_us = row(Mode::Agent).and_then(Row::tool_us_per_query);
    if let Some(r) = row(Mode::Agent) {
        if let Some(us) = agent_us {
            let ratio = us / per_query_us(r.servers_cpu_s, r.perf.completed).max(1e-9);
            let shown = format!("{ratio:.2}×");
            println!(
                "{}",
                goal(
                    "agent CPU/query ≤ 0.25× the dnsmasq pods'",
                    &shown,
                    ratio,
                    0.25,
                    true
                )
            );
        }
        if let Some(c) = r.captured {
            let lost = r.lost.unwrap_or(0);
            println!("{}", goal_no_loss("agent: no packet lost", lost, lost + c));
        }
        if let Some(kib) = r.rss_kib {
            let mib = kib as f64 / 1024.0;
            let what = format!("agent VmRSS ≤ 64 MiB (the goal's rate: 20k qps; {rate})");
            println!("{}", goal(&what, &format!("{mib:.0} MiB"), mib, 64.0, true));
        }
    }
    if let Some(c) = row(Mode::Trace).and_then(|r| Some((r.captured?, r.lost.unwrap_or(0)))) {
        println!(
            "{}",
            goal_no_loss("trace --all-netns -o json: no packet lost", c.1, c.0 + c.1)
        );
    }
    if let (Some(us), Some(a)) = (row(Mode::Top).and_then(Row::tool_us_per_query), agent_us) {
        let ratio = us / a.max(1e-9);
        println!(
            "{}",
            goal(
                "top: ≤ 1× the agent's CPU/query (#46)",
                &format!("{us:.1} µs = {ratio:.2}×"),
                ratio,
                1.0,
                true
            )
        );
    }
    for mode in [Mode::AgentOtlpTenth, Mode::AgentOtlp] {
        let (Some(sample), Some(us), Some(a)) = (
            mode.otlp_sample(),
            row(mode).and_then(Row::tool_us_per_query),
            agent_us,
        ) else {
            continue;
        };
        let ratio = us / a.max(1e-9);
        let what = format!("agent --otlp-sample {sample}: ≤ 1.10× the agent's CPU");
        println!(
            "{}",
            goal(&what, &format!("{ratio:.2}×"), ratio, 1.10, true)
        );
    }
}

pub(super) fn run_live(dnspath: &Path, o: &LiveOptions) -> crate::Result<()> {
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::new(DnsServerKind::Dnsmasq); 2],
        ..LabConfig::default()
    };
    let lab = Lab::start(cfg).map_err(|e| anyhow!("lab: {e}"))?;
    let queries = lab.temp_dir().join("queries.txt");
    fs::write(&queries, QUERIES).map_err(|e| anyhow!("{}: {e}", queries.display()))?;
    let servers: Vec<String> = (0..lab.dns_pod_count())
        .filter_map(|i| lab.server_pid(Pod::Dns(i)))
        .map(|p| p.to_string())
        .collect();
    // Warm both pods' caches (the Service picks a pod at random per flow).
    dnsperf(&lab, &queries, 1_000, 1)?;
    // The OTLP receiver of the export rows, as the soak starts it; each export row starts
    // it again and gives it time to listen (`Receiver::restart_for_row`).
    let mut receiver = Receiver::start(&lab);
    let setup = Setup {
        lab: &lab,
        truth: Truth::install(&lab)?,
        dnspath: dnspath.to_string_lossy().into_owned(),
        queries,
        servers,
        otlp: receiver.as_ref().map(|r| r.url()),
    };
    for &rate in &o.rates {
        let mut rows = Vec::new();
        for mode in Mode::ALL {
            if mode.otlp_sample().is_some() && setup.otlp.is_none() {
                eprintln!("bench: live: no Phoenix (`cargo xtask setup`): no --otlp row");
                continue;
            }
            // An exporting row starts with a receiver that takes what it is sent, not one
            // still ingesting the last row's spans.
            if let (Some(_), Some(r)) = (mode.otlp_sample(), receiver.as_mut()) {
                r.restart_for_row();
            }
            eprintln!("bench: live: {} at {rate} qps", mode.label());
            rows.push((mode, measure(&setup, mode, rate, o)?));
        }
        print_rate(rate, o.seconds, &rows);
    }
    non_dns(&lab, &setup.dnspath)
}

/// UDP datagrams of the non-DNS burst.
const NON_DNS_PACKETS: u32 = 100_000;

/// The eBPF programs' cost on packets that are not DNS: `dnspath trace --all-netns` runs
/// while the client pod sends [`NON_DNS_PACKETS`] UDP datagrams to port 9 of a DNS pod,
/// where nothing listens (so each is also a kernel drop, `NO_SOCKET`: kfree_skb's cost on
/// non-DNS drops).
fn non_dns(lab: &Lab, dnspath: &str) -> crate::Result<()> {
    let t = Tool::start(
        lab,
        lab.node_ns(),
        &[dnspath, "trace", "--all-netns", "-o", "json"],
        is_stats,
        "dnspath: tracing",
    )?;
    let before = progs(t.pid());
    let target = lab.ip_of(Pod::Dns(0)).to_string();
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for i in range({NON_DNS_PACKETS}):\n    s.sendto(b'x' * 40, ('{target}', 9))\n"
    );
    let start = Instant::now();
    let o = lab.exec(lab.client_ns(), &["python3", "-c", &script]);
    let took = start.elapsed().as_secs_f64();
    thread::sleep(Duration::from_millis(500));
    let after = progs(t.pid());
    let stopped = t.stop(libc::SIGINT);
    if !o.status.success() {
        return Err(anyhow!(
            "non-DNS burst: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let read = last_stats(&stopped.stdout).and_then(|s| s["packets"].as_u64());
    println!(
        "\nlive, not DNS: {} UDP datagrams to {target}:9 (nothing listens) in {took:.1} s under \
         `dnspath trace --all-netns -o json` (which read {} DNS packets meanwhile, other labs' on the machine)",
        thousands(u64::from(NON_DNS_PACKETS)),
        opt_u64(read)
    );
    print_progs(&prog_delta(&before, &after));
    Ok(())
}

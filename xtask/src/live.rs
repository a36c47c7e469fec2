//! `cargo xtask bench`, live and storm sections, in a lab of our own (network namespaces,
//! real servers; traffic only to addresses inside them).
//!
//! Live: dnsperf in the client pod sends to the ClusterIP at fixed rates, two dnsmasq pods
//! behind it answer (from their cache after a warm-up), under nothing, `dnspath trace
//! --all-netns -o json`, `dnspath agent`, and `tcpdump -w` on the node's hops followed by
//! `tshark -r` of the file. For each: CPU per query of the tool and of the dnsmasq pods in
//! the same window (utime+stime from /proc/PID/stat), dnsperf's figures, packets captured
//! and lost, peak RSS (VmHWM) and bpf_stats ns/run of each program of the tool.
//!
//! Storm: the ping-pong forwarding loop of tests/tests/loops.rs (both dnsdist pods forward
//! to their own Service) with `dnspath trace` running, and healthy queries meanwhile.
//!
//! Figures only: nothing is asserted on timing.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use lab::{DnsPodConfig, DnsServerKind, Lab, LabConfig, Pod};
use serde_json::Value;

/// What the live and storm sections run.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// dnsperf's rates (`-Q`), queries/s.
    pub rates: Vec<u32>,
    /// Seconds of dnsperf per rate and tool.
    pub seconds: u64,
    /// Seconds of forwarding loop.
    pub storm_seconds: u64,
}

impl Default for LiveOptions {
    fn default() -> Self {
        Self {
            rates: vec![2_000, 10_000],
            seconds: 10,
            storm_seconds: 10,
        }
    }
}

/// The agent's metrics address, inside the lab's node namespace.
const AGENT_LISTEN: &str = "127.0.0.1:9253";
/// Queries dnsperf cycles through: names of the lab's zone, answered from dnsmasq's cache.
const QUERIES: &str = "www.lab.test A\nwww.lab.test AAAA\nalias.lab.test A\ntxt.lab.test TXT\n\
medium.lab.test TXT\n_dns._udp.lab.test SRV\nns.lab.test A\nns.lab.test AAAA\n";

// ---- /proc accounting ----

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Fields of /proc/PID/stat after the command name (field 3 first).
fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = stat.rsplit_once(')')?.1;
    Some(
        after_comm
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// utime+stime of `pid` (all its threads) in seconds; with `children`, plus those of its
/// waited-for children (cutime+cstime).
fn cpu_s(pid: &str, children: bool) -> Option<f64> {
    let f = stat_fields(pid)?;
    // proc(5): utime 14, stime 15, cutime 16, cstime 17; index 0 is field 3.
    let mut ticks = f.get(11)? + f.get(12)?;
    if children {
        ticks += f.get(13)? + f.get(14)?;
    }
    Some(ticks as f64 / clk_tck())
}

/// Peak resident set of `pid`, KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

// ---- bpf_stats ----

/// Turns `kernel.bpf_stats_enabled` on while it lives, and back to what it was on drop.
struct BpfStats {
    old: Option<String>,
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> Self {
        let old = fs::read_to_string(BPF_STATS_SYSCTL).ok();
        if let Err(e) = fs::write(BPF_STATS_SYSCTL, "1") {
            eprintln!("bench: cannot enable {BPF_STATS_SYSCTL}: {e}; no ns/run figures");
        }
        Self { old }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            if let Err(e) = fs::write(BPF_STATS_SYSCTL, old.trim()) {
                eprintln!("bench: could not restore {BPF_STATS_SYSCTL} to {old}: {e}");
            }
        }
    }
}

/// One eBPF program a process holds: run time and count so far.
#[derive(Debug, Clone, Default)]
struct Prog {
    label: String,
    run_time_ns: u64,
    run_cnt: u64,
}

fn prog_type_name(t: &str) -> String {
    // enum bpf_prog_type (include/uapi/linux/bpf.h)
    match t {
        "2" => "kprobe".into(),
        "3" => "sched_cls".into(),
        "5" => "tracepoint".into(),
        // the only tracing programs dnspath has
        "26" => "tracing (kfree_skb)".into(),
        other => format!("prog_type {other}"),
    }
}

fn attach_type_name(t: &str) -> String {
    // enum bpf_attach_type
    match t {
        "23" => "raw_tp".into(),
        "24" => "fentry".into(),
        "26" => "tp_btf".into(),
        "46" => "tcx_ingress".into(),
        "47" => "tcx_egress".into(),
        other => format!("attach_type {other}"),
    }
}

/// The eBPF programs `pid` holds open, by id, labelled by type and by how their links
/// attach them (from the links' fdinfo: TCX ingress/egress, tracing...).
fn progs(pid: u32) -> BTreeMap<u32, Prog> {
    let mut progs: BTreeMap<u32, Prog> = BTreeMap::new();
    let mut attach: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return progs;
    };
    for e in dir.flatten() {
        let Ok(text) = fs::read_to_string(e.path()) else {
            continue;
        };
        let kv: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let Some(id) = kv.get("prog_id").and_then(|v| v.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(link) = kv.get("link_type") {
            let how = kv
                .get("attach_type")
                .map(|a| attach_type_name(a.split_whitespace().next().unwrap_or(a)))
                .unwrap_or_else(|| (*link).to_string());
            attach.entry(id).or_default().insert(how);
        } else if let (Some(t), Some(ns), Some(n)) = (
            kv.get("prog_type"),
            kv.get("run_time_ns"),
            kv.get("run_cnt"),
        ) {
            progs.insert(
                id,
                Prog {
                    label: prog_type_name(t),
                    run_time_ns: ns.parse().unwrap_or(0),
                    run_cnt: n.parse().unwrap_or(0),
                },
            );
        }
    }
    for (id, p) in progs.iter_mut() {
        if let Some(a) = attach.get(id) {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            p.label = format!("{} {}", p.label, a.join("+"));
        }
    }
    progs
}

/// (label, ns/run, runs, programs) per kind of eBPF program.
type ProgCosts = Vec<(String, f64, u64, usize)>;

/// ns/run of the programs that ran between the two readings, summed over programs of the
/// same label (the tracer loads its programs once per network namespace): (label, ns/run,
/// runs, programs).
fn prog_delta(before: &BTreeMap<u32, Prog>, after: &BTreeMap<u32, Prog>) -> ProgCosts {
    let mut by_label: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    for (id, a) in after {
        let b = before.get(id).cloned().unwrap_or_default();
        let runs = a.run_cnt.saturating_sub(b.run_cnt);
        if runs == 0 {
            continue;
        }
        let e = by_label.entry(&a.label).or_default();
        e.0 += a.run_time_ns.saturating_sub(b.run_time_ns);
        e.1 += runs;
        e.2 += 1;
    }
    by_label
        .into_iter()
        .map(|(label, (ns, runs, n))| (label.to_owned(), ns as f64 / runs as f64, runs, n))
        .collect()
}

fn print_progs(progs: &ProgCosts) {
    for (label, ns, runs, n) in progs {
        println!(
            "      bpf {label}: {ns:.0} ns/run over {} runs ({n} program(s))",
            thousands(*runs)
        );
    }
}

// ---- processes we start ----

/// A process started in a lab namespace, its stdout filtered line by line (only lines
/// `keep` accepts are held, so hundreds of MB of records cost no memory), its stderr read.
struct Tool {
    child: Child,
    stdout: Option<thread::JoinHandle<Vec<String>>>,
    stderr: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

struct Stopped {
    status: Option<ExitStatus>,
    kept: Vec<String>,
    stderr: String,
}

impl Tool {
    fn start(
        lab: &Lab,
        ns: &str,
        args: &[&str],
        keep: fn(&str) -> bool,
        ready: &str,
    ) -> crate::Result<Tool> {
        let mut cmd = lab.command_in(ns, args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn");
        let mut child = lab
            .spawn(&mut cmd)
            .map_err(|e| format!("{}: {e}", args.join(" ")))?;
        let stdout = child.stdout.take().map(|out| {
            thread::spawn(move || {
                let mut kept = Vec::new();
                let mut r = BufReader::with_capacity(1 << 20, out);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if keep(&line) {
                        kept.push(line.trim_end().to_owned());
                    }
                    line.clear();
                }
                kept
            })
        });
        let (tx, rx) = mpsc::channel();
        if let Some(err) = child.stderr.take() {
            thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut t = Tool {
            child,
            stdout,
            stderr: rx,
            stderr_seen: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match t.stderr.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(ready);
                    t.stderr_seen.push(line);
                    if hit {
                        return Ok(t);
                    }
                }
                Err(_) => {
                    let seen = t.stderr_seen.join("\n");
                    let _ = t.stop(libc::SIGKILL);
                    return Err(format!(
                        "`{}` did not print {ready:?}; stderr:\n{seen}",
                        args.join(" ")
                    ));
                }
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Signals it (SIGINT, as Ctrl-C), waits, and collects what it printed.
    fn stop(mut self, sig: i32) -> Stopped {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, which we have not reaped yet.
            unsafe {
                libc::kill(pid, sig);
            }
        }
        let status = self.child.wait().ok();
        let kept = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.stderr_seen.push(line);
        }
        Stopped {
            status,
            kept,
            stderr: self.stderr_seen.join("\n"),
        }
    }
}

fn is_stats(line: &str) -> bool {
    line.contains("\"type\":\"stats\"")
}

/// The last `stats` record among `lines`.
fn last_stats(lines: &[String]) -> Option<Value> {
    lines
        .iter()
        .rev()
        .filter(|l| is_stats(l))
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
}

// ---- dnsperf ----

#[derive(Debug, Default, Clone)]
struct Dnsperf {
    completed: u64,
    lost: u64,
    qps: f64,
    avg_ms: f64,
    max_ms: f64,
    stddev_ms: f64,
}

/// The number after `label` on the line that starts with it (after leading spaces).
fn field(out: &str, label: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn parse_dnsperf(out: &str) -> Option<Dnsperf> {
    let max_s = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Average Latency (s):"))
        .and_then(|r| r.split("max ").nth(1))
        .and_then(|r| r.trim_end_matches(')').trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    Some(Dnsperf {
        completed: field(out, "Queries completed:")? as u64,
        lost: field(out, "Queries lost:")? as u64,
        qps: field(out, "Queries per second:")?,
        avg_ms: field(out, "Average Latency (s):")? * 1e3,
        max_ms: max_s * 1e3,
        stddev_ms: field(out, "Latency StdDev (s):").unwrap_or(0.0) * 1e3,
    })
}

fn dnsperf(lab: &Lab, queries: &Path, rate: u32, seconds: u64) -> crate::Result<Dnsperf> {
    let server = lab.cluster_ip().to_string();
    let file = queries.to_string_lossy().into_owned();
    let (rate, seconds) = (rate.to_string(), seconds.to_string());
    let o = lab.exec(
        lab.client_ns(),
        &[
            "dnsperf", "-s", &server, "-d", &file, "-Q", &rate, "-l", &seconds, "-c", "8", "-q",
            "1000", "-t", "2",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    match parse_dnsperf(&out) {
        Some(d) if o.status.success() => Ok(d),
        _ => Err(format!(
            "dnsperf failed ({}): {out}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )),
    }
}

// ---- the live section ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nothing,
    Trace,
    Agent,
    Tcpdump,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::Nothing, Mode::Trace, Mode::Agent, Mode::Tcpdump];

    fn label(self) -> &'static str {
        match self {
            Mode::Nothing => "nothing",
            Mode::Trace => "dnspath trace --all-netns -o json",
            Mode::Agent => "dnspath agent",
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
    lost: Option<u64>,
    /// Summarised + shed (dnspath only).
    summarised: Option<u64>,
    hwm_kib: Option<u64>,
    progs: ProgCosts,
}

impl Row {
    fn tool_us_per_query(&self) -> Option<f64> {
        let total = self.tool_cpu_s? + self.tshark.map_or(0.0, |t| t.0);
        Some(per_query_us(total, self.perf.completed))
    }
}

fn per_query_us(cpu_s: f64, queries: u64) -> f64 {
    cpu_s * 1e6 / queries.max(1) as f64
}

fn servers_cpu(pids: &[String]) -> f64 {
    pids.iter().filter_map(|p| cpu_s(p, true)).sum()
}

/// Sum of the samples of `metric` (any labels) in a Prometheus exposition; `labels` must
/// appear in the sample's label set.
fn metric(scrape: &str, metric: &str, labels: &str) -> Option<u64> {
    let mut found = false;
    let sum: f64 = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            (name == metric && rest.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .inspect(|_| found = true)
        .sum();
    found.then_some(sum as u64)
}

fn curl(lab: &Lab, path: &str) -> Option<String> {
    let url = format!("http://{AGENT_LISTEN}{path}");
    let o = lab.exec(lab.node_ns(), &["curl", "-sf", "-m", "5", &url]);
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Runs dnsperf at `rate` under `mode` and measures.
fn measure(
    lab: &Lab,
    dnspath: &str,
    queries: &Path,
    servers: &[String],
    mode: Mode,
    rate: u32,
    o: &LiveOptions,
) -> crate::Result<Row> {
    let node = lab.node_ns();
    let pcap = lab.temp_dir().join(format!("bench-{rate}.pcap"));
    let pcap_s = pcap.to_string_lossy().into_owned();
    let tool = match mode {
        Mode::Nothing => None,
        Mode::Trace => Some(Tool::start(
            lab,
            node,
            &[dnspath, "trace", "--all-netns", "-o", "json"],
            is_stats,
            "dnspath: tracing",
        )?),
        Mode::Agent => {
            let t = Tool::start(
                lab,
                node,
                &[dnspath, "agent", "--listen", AGENT_LISTEN],
                is_stats,
                "dnspath: tracing",
            )?;
            let deadline = Instant::now() + Duration::from_secs(15);
            while curl(lab, "/readyz").is_none() {
                if Instant::now() > deadline {
                    let s = t.stop(libc::SIGTERM);
                    return Err(format!("agent never ready: {}", s.stderr));
                }
                thread::sleep(Duration::from_millis(100));
            }
            Some(t)
        }
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
    let before_servers = servers_cpu(servers);
    let before_progs = tool.as_ref().map(|t| progs(t.pid())).unwrap_or_default();
    let perf = dnsperf(lab, queries, rate, o.seconds);
    // Let the tool drain what the last queries left.
    thread::sleep(Duration::from_secs(1));
    let after_tool = pid.as_deref().and_then(|p| cpu_s(p, false));
    let after_servers = servers_cpu(servers);
    let after_progs = tool.as_ref().map(|t| progs(t.pid())).unwrap_or_default();
    let hwm_kib = tool.as_ref().and_then(|t| vm_hwm_kib(t.pid()));
    let scrape = match mode {
        Mode::Agent => curl(lab, "/metrics"),
        _ => None,
    };
    let stopped = tool.map(|t| {
        t.stop(if mode == Mode::Agent {
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
    let perf = perf?;
    let mut row = Row {
        perf,
        tool_cpu_s: before_tool.zip(after_tool).map(|(b, a)| a - b),
        servers_cpu_s: after_servers - before_servers,
        hwm_kib,
        progs: prog_delta(&before_progs, &after_progs),
        ..Row::default()
    };
    match mode {
        Mode::Nothing => {}
        Mode::Trace => {
            let stats = stopped.as_ref().and_then(|s| last_stats(&s.kept));
            let n = |k: &str| stats.as_ref().and_then(|s| s[k].as_u64());
            row.captured = n("packets");
            row.lost = n("lost");
            row.summarised = n("summarised").zip(n("shed")).map(|(a, b)| a + b);
            if stats.is_none() {
                eprintln!(
                    "bench: dnspath trace printed no stats record: {}",
                    stopped.map(|s| s.stderr).unwrap_or_default()
                );
            }
        }
        Mode::Agent => {
            let scrape = scrape.unwrap_or_default();
            row.captured = metric(&scrape, "dnspath_packets_total", "");
            row.lost = metric(&scrape, "dnspath_events_lost_total", "event=\"packet\"");
            row.summarised = metric(&scrape, "dnspath_summarised_packets_total", "");
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
    let null = fs::File::create("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
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
        .map_err(|e| format!("tshark: {e}"))?;
    let wall = start.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!(
            "tshark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((cpu_children_self() - before, wall))
}

/// cutime+cstime of this process: the CPU of every child it has reaped.
fn cpu_children_self() -> f64 {
    stat_fields("self")
        .and_then(|f| Some((f.get(13)? + f.get(14)?) as f64 / clk_tck()))
        .unwrap_or(0.0)
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn opt_u64(v: Option<u64>) -> String {
    v.map(thousands).unwrap_or_else(|| "-".into())
}

fn print_rate(rate: u32, seconds: u64, rows: &[(Mode, Row)]) {
    println!("\nlive: dnsperf -Q {rate} for {seconds} s, client pod → ClusterIP → 2 dnsmasq pods (cached answers)");
    println!(
        "  {:<34} {:>8} {:>8} {:>8} {:>8} {:>8} {:>13} {:>12} {:>11} {:>8} {:>10} {:>8}",
        "under",
        "qps",
        "lost",
        "avg ms",
        "sd ms",
        "max ms",
        "tool µs/q",
        "dnsmasq µs/q",
        "captured",
        "lost",
        "summarised",
        "VmHWM"
    );
    for (mode, r) in rows {
        println!(
            "  {:<34} {:>8.0} {:>8} {:>8.3} {:>8.3} {:>8.2} {:>13} {:>12.1} {:>11} {:>8} {:>10} {:>8}",
            mode.label(),
            r.perf.qps,
            r.perf.lost,
            r.perf.avg_ms,
            r.perf.stddev_ms,
            r.perf.max_ms,
            r.tool_us_per_query()
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "-".into()),
            per_query_us(r.servers_cpu_s, r.perf.completed),
            opt_u64(r.captured),
            opt_u64(r.lost),
            opt_u64(r.summarised),
            r.hwm_kib
                .map(|k| format!("{:.0} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "-".into()),
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
}

pub fn run_live(dnspath: &Path, o: &LiveOptions) -> crate::Result<()> {
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::new(DnsServerKind::Dnsmasq); 2],
        ..LabConfig::default()
    };
    let lab = Lab::start(cfg).map_err(|e| format!("lab: {e}"))?;
    let queries = lab.temp_dir().join("queries.txt");
    fs::write(&queries, QUERIES).map_err(|e| format!("{}: {e}", queries.display()))?;
    let servers: Vec<String> = (0..lab.dns_pod_count())
        .filter_map(|i| lab.server_pid(Pod::Dns(i)))
        .map(|p| p.to_string())
        .collect();
    // Warm both pods' caches (the Service picks a pod at random per flow).
    dnsperf(&lab, &queries, 1_000, 1)?;
    let dnspath = dnspath.to_string_lossy().into_owned();
    for &rate in &o.rates {
        let mut rows = Vec::new();
        for mode in Mode::ALL {
            eprintln!("bench: live: {} at {rate} qps", mode.label());
            rows.push((
                mode,
                measure(&lab, &dnspath, &queries, &servers, mode, rate, o)?,
            ));
        }
        print_rate(rate, o.seconds, &rows);
    }
    non_dns(&lab, &dnspath)
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
        return Err(format!(
            "non-DNS burst: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let read = last_stats(&stopped.kept).and_then(|s| s["packets"].as_u64());
    println!(
        "\nlive, not DNS: {} UDP datagrams to {target}:9 (nothing listens) in {took:.1} s under \
         `dnspath trace --all-netns -o json` (which read {} DNS packets meanwhile, other labs' on the machine)",
        thousands(u64::from(NON_DNS_PACKETS)),
        opt_u64(read)
    );
    print_progs(&prog_delta(&before, &after));
    Ok(())
}

// ---- the storm section ----

fn keep_storm(line: &str) -> bool {
    is_stats(line)
        || line.contains("\"type\":\"loop\"")
        || (line.contains("\"type\":\"transaction\"") && line.contains(".bench.lab.test."))
}

pub fn run_storm(dnspath: &Path, o: &LiveOptions) -> crate::Result<()> {
    let mut lab = Lab::start(LabConfig::default()).map_err(|e| format!("lab: {e}"))?;
    let dnspath = dnspath.to_string_lossy().into_owned();
    let node = lab.node_ns().to_owned();
    let t = Tool::start(
        &lab,
        &node,
        &[&dnspath, "trace", "-o", "json", "--view", "transactions"],
        keep_storm,
        "dnspath: tracing",
    )?;
    let pid = t.pid().to_string();
    let looping = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    let healthy = DnsPodConfig::new(DnsServerKind::Dnsdist);
    let result = (|| -> crate::Result<(f64, f64, ProgCosts, u64, u64)> {
        for i in 0..2 {
            lab.reconfigure_dns_pod(i, looping.clone())
                .map_err(|e| format!("lab: {e}"))?;
        }
        let cpu0 = cpu_s(&pid, false).unwrap_or(0.0);
        let progs0 = progs(t.pid());
        let start = Instant::now();
        let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
        // Healthy queries straight to the upstream meanwhile, one a second.
        let up = format!("@{}", lab.ip_of(Pod::Upstream));
        let (mut sent, mut answered) = (0u64, 0u64);
        while start.elapsed() < Duration::from_secs(o.storm_seconds) {
            thread::sleep(Duration::from_millis(500));
            let name = format!("h{sent}.bench.lab.test.");
            sent += 1;
            let r = lab.dig(&["+time=2", "+tries=1", &up, &name, "A"]);
            if r.status.success() {
                answered += 1;
            }
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = cpu_s(&pid, false).unwrap_or(0.0) - cpu0;
        let progs1 = progs(t.pid());
        for i in 0..2 {
            lab.reconfigure_dns_pod(i, healthy.clone())
                .map_err(|e| format!("lab: {e}"))?;
        }
        // The loop ends 2 s after its last packet.
        thread::sleep(Duration::from_secs(3));
        Ok((wall, cpu, prog_delta(&progs0, &progs1), sent, answered))
    })();
    let hwm = vm_hwm_kib(t.pid());
    let stopped = t.stop(libc::SIGINT);
    let (wall, cpu, progs, sent, answered) = result?;
    let recs: Vec<Value> = stopped
        .kept
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let stats = recs
        .iter()
        .rev()
        .find(|r| r["type"] == "stats")
        .ok_or_else(|| format!("storm: no stats record; stderr: {}", stopped.stderr))?;
    let loops = |state: &str| -> Vec<&Value> {
        recs.iter()
            .filter(|r| r["type"] == "loop" && r["state"] == state)
            .collect()
    };
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let peak = recs
        .iter()
        .filter(|r| r["type"] == "loop")
        .map(|r| n(r, "rate_pps"))
        .max()
        .unwrap_or(0);
    let traced: BTreeSet<&str> = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && r["outcome"] == "answered")
        .filter_map(|r| r["question"]["name"].as_str())
        .filter(|n| n.ends_with(".bench.lab.test."))
        .collect();
    println!(
        "\nstorm: ping-pong forwarding loop through the Service (2 dnsdist pods forwarding to it), {:.0} s, \
         `dnspath trace -o json --view transactions` in the node namespace",
        wall
    );
    println!(
        "  loops detected: {}, ended: {}",
        loops("detected").len(),
        loops("ended").len()
    );
    for l in loops("ended") {
        let span_s = n(l, "last_seen_ns").saturating_sub(n(l, "detected_ns")) as f64 / 1e9;
        println!(
            "  loop {}: {} packets since detection in {span_s:.1} s = {:.0} packets/s (peak rate_pps {}); summarised {} ({:.1}%)",
            l["question"]["name"].as_str().unwrap_or("?"),
            thousands(n(l, "packets")),
            n(l, "packets") as f64 / span_s.max(1e-9),
            thousands(peak),
            thousands(n(l, "summarised")),
            100.0 * n(l, "summarised") as f64 / n(l, "packets").max(1) as f64
        );
    }
    let k = &stats["kernel"];
    println!(
        "  stats: packets {} (summarised {}), shed in the kernel {}, lost {} (ring buffer {}), kernel matched {}",
        thousands(n(stats, "packets")),
        thousands(n(stats, "summarised")),
        thousands(n(stats, "shed")),
        thousands(n(stats, "lost")),
        thousands(n(k, "packets_lost_ringbuf")),
        thousands(n(k, "packets_matched")),
    );
    println!(
        "  healthy queries meanwhile: {sent} sent, {answered} answered, {} traced as answered transactions{}",
        traced.len(),
        if traced.len() as u64 >= answered { " (all)" } else { " (NOT all)" }
    );
    println!(
        "  dnspath trace: {:.2} CPU-seconds per second of storm, VmHWM {}",
        cpu / wall.max(1e-9),
        hwm.map(|k| format!("{:.0} MiB", k as f64 / 1024.0))
            .unwrap_or_else(|| "-".into())
    );
    print_progs(&progs);
    Ok(())
}

/// Live and storm sections, with bpf_stats on for their duration.
pub fn run(dnspath: &Path, o: &LiveOptions, live: bool, storm: bool) -> crate::Result<()> {
    let _stats = BpfStats::enable();
    if live {
        run_live(dnspath, o)?;
    }
    if storm {
        run_storm(dnspath, o)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dnsperf_output_is_parsed() {
        let out = "Statistics:\n\n  Queries sent:         20000\n  Queries completed:    19990 (99.95%)\n  \
Queries lost:         10 (0.05%)\n\n  Response codes:       NOERROR 19990 (100.00%)\n  \
Average packet size:  request 30, response 46\n  Run time (s):         10.000460\n  \
Queries per second:   1998.908\n\n  Average Latency (s):  0.000183 (min 0.000042, max 0.003046)\n  \
Latency StdDev (s):   0.000113\n";
        let d = parse_dnsperf(out).unwrap_or_default();
        assert_eq!((d.completed, d.lost), (19990, 10));
        assert!((d.qps - 1998.908).abs() < 1e-6);
        assert!((d.avg_ms - 0.183).abs() < 1e-9);
        assert!((d.max_ms - 3.046).abs() < 1e-9);
    }

    #[test]
    fn metrics_are_summed_over_matching_labels() {
        let s = "# HELP x\ndnspath_events_lost_total{event=\"packet\"} 3\n\
dnspath_events_lost_total{event=\"drop\"} 4\ndnspath_packets_total 120\n";
        assert_eq!(
            metric(s, "dnspath_events_lost_total", "event=\"packet\""),
            Some(3)
        );
        assert_eq!(metric(s, "dnspath_packets_total", ""), Some(120));
        assert_eq!(metric(s, "dnspath_missing", ""), None);
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(123), "123");
    }
}

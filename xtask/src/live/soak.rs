//! `cargo xtask soak`: the agent for minutes under load and faults, as a DaemonSet pod lives
//! (issue #28). Figures only, nothing asserted on them: RSS over time under the DaemonSet's
//! memory limit (a cgroup limit here), CPU per query, every loss next to the fault that
//! caused it, each loop and race reported once, `/healthz` and `/readyz` through it, and
//! nothing left behind.
//!
//! Load: dnsperf at `--qps` from the client pod to the ClusterIP (two dnsmasq pods) over a
//! mix of cached names, new names, NXDOMAIN and a large TXT; a second dnsperf over TCP; a
//! query a second to a server that never answers. dnsperf's output is read as it comes (a
//! pipe left unread fills with its timeout messages during a loop, and dnsperf then stops
//! sending); its rate every 10 s is printed beside the agent's packets per query, the check
//! that the agent sees the load through the faults. Faults, on a schedule scaled to the run:
//! pod namespaces with veths created and deleted several times a second (all run long), a
//! forwarding loop started and stopped, forced conntrack races, `nf_conntrack_max` lowered
//! until the table is full, the flight recorder's directory on a 4 MiB tmpfs, the agent
//! stopped (SIGSTOP) for 5 s so the ring buffer overflows, the OTLP receiver (Arize Phoenix,
//! if installed) killed and restarted, and the agent SIGKILLed and started again.
use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::anyhow;
use lab::{
    hole::{Hole, HOLE_ADDR},
    race::{force_race, RaceRig},
    DnsPodConfig, DnsServerKind, Lab, LabConfig,
};
use serde_json::Value;

use super::{
    phoenix::Receiver,
    proc::{cpu_s, vm_rss_kib},
    thousands,
    tool::{metric, Tool},
};

/// The agent's metrics address, inside the lab's node namespace.
const LISTEN: &str = "127.0.0.1:9263";
/// deploy/daemonset.yaml's `resources.limits.memory`.
const MEMORY_LIMIT: u64 = 384 << 20;

#[derive(Debug, Clone, clap::Args)]
pub struct SoakOptions {
    /// Minutes of load and faults (at least 3).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(3..))]
    pub minutes: u64,
    /// dnsperf's UDP rate, queries/s (TCP: a fiftieth of it).
    #[arg(long, default_value_t = 10_000)]
    pub qps: u32,
    /// The agent's memory cgroup limit, MiB (deploy/daemonset.yaml's limit by default).
    #[arg(long = "memory", value_name = "MIB", default_value_t = MEMORY_LIMIT >> 20)]
    pub memory_mib: u64,
    /// No OTLP export (else to Arize Phoenix, killed and restarted meanwhile).
    #[arg(long)]
    pub no_otlp: bool,
}

/// A memory cgroup with the DaemonSet's limit (v2 where mounted, else v1's memory
/// controller); removed on drop once its processes are gone.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn create(name: &str, limit: u64) -> crate::Result<Cgroup> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = if v2 {
            PathBuf::from("/sys/fs/cgroup").join(name)
        } else {
            PathBuf::from("/sys/fs/cgroup/memory").join(name)
        };
        fs::create_dir_all(&dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        let (file, value) = if v2 {
            ("memory.max", limit.to_string())
        } else {
            ("memory.limit_in_bytes", limit.to_string())
        };
        cg.write(file, &value)?;
        Ok(cg)
    }
    fn write(&self, file: &str, value: &str) -> crate::Result<()> {
        let p = self.dir.join(file);
        fs::write(&p, value).map_err(|e| anyhow!("{}: {e}", p.display()))
    }
    fn procs(&self) -> String {
        self.dir.join("cgroup.procs").to_string_lossy().into_owned()
    }
    fn read_u64(&self, file: &str, key: Option<&str>) -> Option<u64> {
        let text = fs::read_to_string(self.dir.join(file)).ok()?;
        match key {
            None => text.trim().parse().ok(),
            Some(k) => text.lines().find_map(|l| {
                let (name, v) = l.split_once(' ')?;
                (name == k).then(|| v.trim().parse().ok())?
            }),
        }
    }
    /// Memory charged to the cgroup now (anonymous, kernel and page cache).
    fn current(&self) -> Option<u64> {
        if self.v2 {
            self.read_u64("memory.current", None)
        } else {
            self.read_u64("memory.usage_in_bytes", None)
        }
    }
    /// (anonymous, kernel) bytes of [`Cgroup::current`] (v2; v1: rss, and no kernel figure).
    fn split(&self) -> (Option<u64>, Option<u64>) {
        if self.v2 {
            (
                self.read_u64("memory.stat", Some("anon")),
                self.read_u64("memory.stat", Some("kernel")),
            )
        } else {
            (self.read_u64("memory.stat", Some("rss")), None)
        }
    }
    fn oom_kills(&self) -> Option<u64> {
        if self.v2 {
            self.read_u64("memory.events", Some("oom_kill"))
        } else {
            self.read_u64("memory.oom_control", Some("oom_kill"))
        }
    }
    fn peak(&self) -> Option<u64> {
        if self.v2 {
            self.read_u64("memory.peak", None)
        } else {
            self.read_u64("memory.max_usage_in_bytes", None)
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("soak: {} left behind", self.dir.display());
    }
}

/// The event stream's lines the soak reads back.
fn keep(line: &str) -> bool {
    [
        "\"loop\"",
        "\"race\"",
        "\"warning\"",
        "\"agent\"",
        "\"stats\"",
    ]
    .iter()
    .any(|t| line.contains(&format!("\"type\":{t}")))
}

fn curl(lab: &Lab, path: &str) -> (bool, String) {
    let url = format!("http://{LISTEN}{path}");
    let o = lab.exec(
        lab.node_ns(),
        &["curl", "-s", "-m", "2", "-w", "\n%{http_code}", &url],
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let code = text.lines().last().unwrap_or("000").to_string();
    (code == "200", text)
}

fn start_agent(
    lab: &Lab,
    dnspath: &str,
    cg: &Cgroup,
    record: &Path,
    otlp: Option<&str>,
) -> crate::Result<Tool> {
    let record = record.to_string_lossy().into_owned();
    let procs = cg.procs();
    // Into the cgroup before `ip netns exec`, which mounts a /sys of its own without it.
    let mut args: Vec<&str> = vec![
        "-c",
        "echo $$ > \"$0\" && exec \"$@\"",
        &procs,
        "ip",
        "netns",
        "exec",
        lab.node_ns(),
    ];
    // A heap profiler around the agent (e.g. `heaptrack -o DIR/agent` with a build of
    // `--features system-allocator`): the soak as a measurement of where memory goes.
    let wrap = std::env::var("DNSPATH_SOAK_WRAP").unwrap_or_default();
    args.extend(wrap.split_whitespace());
    args.extend([
        dnspath,
        "agent",
        "--listen",
        LISTEN,
        "--record",
        &record,
        "--record-buffer",
        "16",
    ]);
    if let Some(url) = otlp {
        args.extend(["--otlp", url, "--otlp-sample", "0.01"]);
    }
    let mut cmd = Command::new("sh");
    cmd.args(&args);
    let t = Tool::start_cmd(lab, cmd, "dnspath agent (soak)", keep, "dnspath: tracing")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !curl(lab, "/readyz").0 {
        if Instant::now() > deadline {
            let s = t.stop(libc::SIGKILL);
            return Err(anyhow!("agent never ready: {}", s.stderr));
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(t)
}

/// Pod namespaces with a veth into the node, created and deleted several times a second
/// until `stop`; returns how many were made.
fn churn(prefix: &str, node: &str, stop: &AtomicBool, made: &AtomicU64) {
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let ns = format!("{prefix}-churn{}", i % 4);
        let host = format!("{prefix}c{}", i % 4);
        let run = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        let _ = run(&["netns", "del", &ns]);
        if run(&["netns", "add", &ns])
            && run(&[
                "-n", node, "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])
        {
            let _ = run(&["-n", node, "link", "set", &host, "up"]);
            let _ = run(&["-n", &ns, "link", "set", "eth0", "up"]);
            made.fetch_add(1, Ordering::Relaxed);
        }
        i += 1;
        thread::sleep(Duration::from_millis(200));
    }
    for k in 0..4 {
        let _ = Command::new("ip")
            .args(["netns", "del", &format!("{prefix}-churn{k}")])
            .stderr(Stdio::null())
            .status();
    }
}

/// dnsperf's query mix: cached names, new names (each once per pass), NXDOMAIN, a large TXT.
fn query_file(dir: &Path) -> crate::Result<(PathBuf, PathBuf)> {
    let mut q = String::new();
    for i in 0..20_000 {
        match i % 10 {
            0..=4 => q.push_str("www.lab.test A\nwww.lab.test AAAA\n"),
            5 | 6 => q.push_str(&format!("new{i}.lab.test A\n")),
            7 | 8 => q.push_str(&format!("nx{i}.nowhere.lab.test AAAA\n")),
            _ => q.push_str("big.lab.test TXT\n"),
        }
    }
    let udp = dir.join("soak-queries.txt");
    fs::write(&udp, q).map_err(|e| anyhow!("{}: {e}", udp.display()))?;
    let tcp = dir.join("soak-tcp.txt");
    fs::write(
        &tcp,
        "www.lab.test A\nbig.lab.test TXT\nmedium.lab.test TXT\n",
    )
    .map_err(|e| anyhow!("{}: {e}", tcp.display()))?;
    Ok((udp, tcp))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    LoopStart,
    LoopStop,
    Race,
    CtFull,
    CtRestore,
    Stop,
    ReceiverKill,
    ReceiverStart,
    Kill,
}

fn schedule(total_s: u64) -> Vec<(u64, Fault)> {
    let at = |f: f64| (total_s as f64 * f) as u64;
    let mut s = Vec::new();
    // A loop every 5 minutes (at least two), 20 s each.
    let loops = (total_s / 300).max(2);
    for k in 0..loops {
        let t = at(0.12) + k * (at(0.88) - at(0.12)) / loops;
        s.push((t, Fault::LoopStart));
        s.push((t + 20, Fault::LoopStop));
    }
    s.extend([
        (at(0.25), Fault::Race),
        (at(0.72), Fault::Race),
        (at(0.33), Fault::CtFull),
        (at(0.33) + 15, Fault::CtRestore),
        (at(0.42), Fault::Stop),
        (at(0.84), Fault::Stop),
        (at(0.28), Fault::ReceiverKill),
        (at(0.28) + 30, Fault::ReceiverStart),
        (at(0.6), Fault::Kill),
    ]);
    s.sort_by_key(|(t, _)| *t);
    s
}

/// One sample of the agent.
struct Sample {
    t_s: u64,
    rss_kib: Option<u64>,
    cpu_s: f64,
    healthz: bool,
    readyz: bool,
    /// The agent's counters; `None`: the scrape failed.
    packets: Option<u64>,
    lost: Option<u64>,
    oom_kills: u64,
    /// The cgroup's charge: the most seen since the last sample (read every loop turn),
    /// and its anonymous and kernel parts now.
    cg_max: Option<u64>,
    anon: Option<u64>,
    kernel: Option<u64>,
}

/// The agent's packet and lost-event counters; `None` when the scrape failed.
fn scrape(lab: &Lab) -> Option<(u64, u64)> {
    let (ok, text) = curl(lab, "/metrics");
    if !ok {
        return None;
    }
    Some((
        metric(&text, "dnspath_packets_total", "").unwrap_or(0),
        metric(&text, "dnspath_events_lost_total", "").unwrap_or(0),
    ))
}

pub fn run(dnspath: &Path, o: &SoakOptions) -> crate::Result<()> {
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::new(DnsServerKind::Dnsmasq); 2],
        ..LabConfig::default()
    };
    let mut lab = Lab::start(cfg).map_err(|e| anyhow!("lab: {e}"))?;
    let dnspath = dnspath.to_string_lossy().into_owned();
    let record = lab.temp_dir().join("record");
    fs::create_dir_all(&record).map_err(|e| anyhow!("{}: {e}", record.display()))?;
    let rec_s = record.to_string_lossy().into_owned();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", &rec_s])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let cg = Cgroup::create(
        &format!("dnspath-soak-{}", std::process::id()),
        o.memory_mib << 20,
    )?;
    let ct_max_path = "/proc/sys/net/netfilter/nf_conntrack_max";
    let ct_max = fs::read_to_string(ct_max_path).unwrap_or_default();
    let result = soak(&mut lab, &dnspath, o, &cg, &record, &ct_max);
    // Whatever happened: the host's conntrack limit back, the tmpfs away.
    if !ct_max.trim().is_empty() {
        let _ = fs::write(ct_max_path, ct_max.trim());
    }
    if mounted {
        let _ = Command::new("umount").arg(&rec_s).status();
    }
    result
}

fn soak(
    lab: &mut Lab,
    dnspath: &str,
    o: &SoakOptions,
    cg: &Cgroup,
    record: &Path,
    ct_max: &str,
) -> crate::Result<()> {
    let total_s = o.minutes * 60;
    let (udp_q, tcp_q) = query_file(lab.temp_dir())?;
    let hole = Hole::new(lab).map_err(|e| anyhow!("hole: {e}"))?;
    let mut receiver = if !o.no_otlp {
        Receiver::start(lab)
    } else {
        None
    };
    let otlp = receiver.as_ref().map(Receiver::url);
    let mut agent = Some(start_agent(lab, dnspath, cg, record, otlp.as_deref())?);
    let mut restarts = 0u32;
    let mut lines: Vec<String> = Vec::new();
    let (udp_s, tcp_s) = (
        udp_q.to_string_lossy().into_owned(),
        tcp_q.to_string_lossy().into_owned(),
    );
    let cip = lab.cluster_ip().to_string();
    let qps = o.qps.to_string();
    let tcp_qps = (o.qps / 50).max(1).to_string();
    let udp_args: Vec<String> = [
        "dnsperf", "-s", &cip, "-d", &udp_s, "-Q", &qps, "-c", "8", "-q", "2000", "-t", "2",
    ]
    .map(String::from)
    .to_vec();
    let tcp_args: Vec<String> = [
        "dnsperf", "-m", "tcp", "-s", &cip, "-d", &tcp_s, "-Q", &tcp_qps, "-c", "2", "-t", "2",
    ]
    .map(String::from)
    .to_vec();
    let started_epoch = epoch_s();
    let stuck = AtomicU64::new(0);
    let client = &lab.client_ns().to_owned();
    let stop = AtomicBool::new(false);
    let made = AtomicU64::new(0);
    let prefix = lab.prefix().to_owned();
    let node = lab.node_ns().to_owned();
    let looping = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    let healthy = DnsPodConfig::new(DnsServerKind::Dnsmasq);
    let mut samples: Vec<Sample> = Vec::new();
    let mut faults_done: Vec<(u64, String)> = Vec::new();
    let mut races_forced = 0u32;
    let mut crashes = 0u32;
    let start = Instant::now();
    let (result, udp_out, tcp_out) = thread::scope(|s| {
        s.spawn(|| churn(&prefix, &node, &stop, &made));
        let (stop, stuck) = (&stop, &stuck);
        let udp = s.spawn(move || load(client, &udp_args, total_s, start, stop, stuck));
        let tcp = s.spawn(move || load(client, &tcp_args, total_s, start, stop, stuck));
        // Faults that fail are reported, not fatal: the churn thread must be told to stop.
        let mut run = || -> crate::Result<()> {
            let mut plan = schedule(total_s).into_iter().peekable();
            let mut next_sample = 0u64;
            let mut unanswered_sent = 0u64;
            let mut cg_max: Option<u64> = None;
            while start.elapsed().as_secs() < total_s {
                let now = start.elapsed().as_secs();
                while let Some((t, f)) = plan.next_if(|(t, _)| *t <= now) {
                    let what = match f {
                        Fault::LoopStart => {
                            for i in 0..2 {
                                lab.reconfigure_dns_pod(i, looping.clone())
                                    .map_err(|e| anyhow!("lab: {e}"))?;
                            }
                            let _ = lab.dig(&[
                                "+time=1",
                                "+tries=1",
                                &format!("storm{t}.lab.test."),
                                "A",
                            ]);
                            "forwarding loop started".to_string()
                        }
                        Fault::LoopStop => {
                            for i in 0..2 {
                                lab.reconfigure_dns_pod(i, healthy.clone())
                                    .map_err(|e| anyhow!("lab: {e}"))?;
                            }
                            "forwarding loop stopped".to_string()
                        }
                        Fault::Race => match RaceRig::install(lab, 300) {
                            Ok(rig) => {
                                let shot = force_race(lab, &format!("race{t}.lab.test."));
                                let _ = rig.remove();
                                if shot.as_ref().is_ok_and(|s| !s.a_answered) {
                                    races_forced += 1;
                                }
                                format!(
                                    "conntrack race forced ({})",
                                    if shot.is_ok_and(|s| !s.a_answered) {
                                        "A lost"
                                    } else {
                                        "not lost"
                                    }
                                )
                            }
                            Err(e) => format!("race rig failed: {e}"),
                        },
                        Fault::CtFull => {
                            let count =
                                fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
                                    .ok()
                                    .and_then(|c| c.trim().parse::<u64>().ok())
                                    .unwrap_or(0);
                            let max = (count / 2).max(64);
                            let _ = fs::write(
                                "/proc/sys/net/netfilter/nf_conntrack_max",
                                max.to_string(),
                            );
                            format!("nf_conntrack_max {max} (table holds {count}): full for 15 s")
                        }
                        Fault::CtRestore => {
                            let _ = fs::write(
                                "/proc/sys/net/netfilter/nf_conntrack_max",
                                ct_max.trim(),
                            );
                            "nf_conntrack_max restored".to_string()
                        }
                        Fault::Stop => {
                            if let Some(a) = &agent {
                                let pid = a.pid() as i32;
                                // SAFETY: signalling our own child by PID.
                                unsafe { libc::kill(pid, libc::SIGSTOP) };
                                thread::sleep(Duration::from_secs(4));
                                let ready = curl_quick(lab);
                                // SAFETY: as above.
                                unsafe { libc::kill(pid, libc::SIGCONT) };
                                format!(
                                    "agent SIGSTOPped 5 s (readyz answered while stopped: {ready})"
                                )
                            } else {
                                "no agent".into()
                            }
                        }
                        Fault::ReceiverKill => match receiver.as_mut() {
                            Some(r) => {
                                r.kill();
                                "OTLP receiver killed".into()
                            }
                            None => "no OTLP receiver".into(),
                        },
                        Fault::ReceiverStart => match receiver.as_mut() {
                            Some(r) => {
                                r.restart();
                                "OTLP receiver restarted".into()
                            }
                            None => "no OTLP receiver".into(),
                        },
                        Fault::Kill => {
                            if let Some(a) = agent.take() {
                                let f = a.stop(libc::SIGKILL);
                                lines.extend(f.stdout);
                            }
                            let t0 = Instant::now();
                            match start_agent(lab, dnspath, cg, record, otlp.as_deref()) {
                                Ok(a) => {
                                    agent = Some(a);
                                    restarts += 1;
                                    format!(
                                        "agent SIGKILLed, started again, ready in {:.1} s",
                                        t0.elapsed().as_secs_f64()
                                    )
                                }
                                Err(e) => format!("agent SIGKILLed, FAILED to start again: {e}"),
                            }
                        }
                    };
                    eprintln!("soak: +{now} s: {what}");
                    faults_done.push((now, what));
                }
                // A query a second nobody answers.
                let _ = lab
                    .command_in(
                        lab.client_ns(),
                        &[
                            "dig",
                            "+time=1",
                            "+tries=1",
                            &format!("@{HOLE_ADDR}"),
                            &format!("u{unanswered_sent}.lab.test."),
                            "A",
                        ],
                    )
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map(|mut c| {
                        let _ = c.wait();
                    });
                unanswered_sent += 1;
                cg_max = cg_max.max(cg.current());
                // Died (OOM-killed, crashed): restarted as kubelet would.
                if agent.as_mut().is_some_and(Tool::exited) {
                    if let Some(a) = agent.take() {
                        let f = a.stop(libc::SIGKILL);
                        let why = format!(
                            "agent DIED ({}; OOM kills so far {}; cgroup at most {} MiB since the last sample): {}",
                            f.status.map_or("?".into(), |s| s.to_string()),
                            cg.oom_kills().unwrap_or(0),
                            cg_max.map_or("-".into(), |b| (b >> 20).to_string()),
                            f.stderr
                                .lines()
                                .rev()
                                .take(2)
                                .collect::<Vec<_>>()
                                .join(" / ")
                        );
                        eprintln!("soak: +{now} s: {why}");
                        faults_done.push((now, why));
                        lines.extend(f.stdout);
                    }
                    crashes += 1;
                    match start_agent(lab, dnspath, cg, record, otlp.as_deref()) {
                        Ok(a) => agent = Some(a),
                        Err(e) => {
                            let why = format!("agent restart after the crash FAILED: {e}");
                            eprintln!("soak: +{now} s: {why}");
                            faults_done.push((now, why));
                        }
                    }
                }
                if now >= next_sample {
                    next_sample = now + 10;
                    if let Some(a) = &agent {
                        let pid = a.pid();
                        let (healthz, _) = curl(lab, "/healthz");
                        let (readyz, _) = curl(lab, "/readyz");
                        let scraped = scrape(lab);
                        let (packets, lost) = (scraped.map(|s| s.0), scraped.map(|s| s.1));
                        let (anon, kernel) = cg.split();
                        samples.push(Sample {
                            cg_max: cg_max.take(),
                            anon,
                            kernel,
                            t_s: now,
                            rss_kib: vm_rss_kib(pid),
                            cpu_s: cpu_s(&pid.to_string(), false).unwrap_or(0.0),
                            healthz,
                            readyz,
                            packets,
                            lost,
                            oom_kills: cg.oom_kills().unwrap_or(0),
                        });
                    }
                }
                thread::sleep(Duration::from_millis(300));
            }
            Ok(())
        };
        let r = run();
        stop.store(true, Ordering::Relaxed);
        (
            r,
            udp.join().unwrap_or_default(),
            tcp.join().unwrap_or_default(),
        )
    });
    result?;
    stop.store(true, Ordering::Relaxed);
    let pid = agent.as_ref().map(Tool::pid);
    let (packets_end, lost_end) = scrape(lab).unwrap_or_default();
    let stopped = agent.take().map(|a| {
        let ooms_before = cg.oom_kills().unwrap_or(0);
        let started = Instant::now();
        let done = AtomicBool::new(false);
        let (f, cg_max) = thread::scope(|s| {
            // The cgroup's charge through the stop, which settles every open transaction.
            let watch = s.spawn(|| {
                let mut max = cg.current();
                while !done.load(Ordering::Relaxed) {
                    max = max.max(cg.current());
                    thread::sleep(Duration::from_millis(10));
                }
                max
            });
            let f = a.stop(libc::SIGTERM);
            done.store(true, Ordering::Relaxed);
            (f, watch.join().unwrap_or(None))
        });
        lines.extend(f.stdout);
        Stopped {
            status: f.status.map(|s| s.to_string()),
            secs: started.elapsed().as_secs_f64(),
            oom_kills: cg.oom_kills().unwrap_or(0).saturating_sub(ooms_before),
            cg_max,
        }
    });
    drop(hole);
    drop(receiver);
    // The event stream, for reading a report's figures back (one file, each run's over the
    // last one's).
    let kept = Path::new(dnspath).with_file_name("soak-events.ndjson");
    match fs::write(&kept, lines.join("\n")) {
        Ok(()) => eprintln!("soak: the agent's event stream is in {}", kept.display()),
        Err(e) => eprintln!("soak: {}: {e}", kept.display()),
    }
    report(&Report {
        o,
        samples: &samples,
        faults: &faults_done,
        lines: &lines,
        cg,
        restarts,
        crashes,
        races_forced,
        pods_made: made.load(Ordering::Relaxed),
        udp_rate: rates(&udp_out, started_epoch),
        stuck: stuck.load(Ordering::Relaxed),
        udp: &udp_out,
        tcp: &tcp_out,
        end: (packets_end, lost_end),
        record,
        leftovers: leftovers(lab, pid),
        stopped,
    });
    Ok(())
}

/// dnsperf's runs are this long: one that stops sending after a fault (a TCP dnsperf whose
/// connections the server closed spins on them; a UDP one stopped answering-and-sending after
/// the conntrack table was full) holds the load back for this long at most.
const CHUNK_S: u64 = 30;

/// dnsperf (`args`, without `-l`) run again and again in [`CHUNK_S`] runs until `total_s`
/// after `start` or `stop`; a run not ended [`CHUNK_S`] + 5 s after it began is killed and
/// counted in `stuck`. Its output is read as it comes (a pipe left unread fills with its
/// messages and stops it) and returned, every run's one after the other.
fn load(
    client_ns: &str,
    args: &[String],
    total_s: u64,
    start: Instant,
    stop: &AtomicBool,
    stuck: &AtomicU64,
) -> String {
    let mut out = String::new();
    loop {
        let left = total_s.saturating_sub(start.elapsed().as_secs());
        if left < 2 || stop.load(Ordering::Relaxed) {
            return out;
        }
        let secs = left.min(CHUNK_S);
        let l = secs.to_string();
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(["-l", &l, "-S", "10", "-O", "suppress=timeout,unexpected"]);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", client_ns])
            .args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let Ok(mut child) = cmd.spawn() else {
            thread::sleep(Duration::from_secs(1));
            continue;
        };
        let Some(mut so) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return out;
        };
        let reader = thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = so.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        });
        let deadline = Instant::now() + Duration::from_secs(secs + 5);
        loop {
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            if Instant::now() > deadline {
                stuck.fetch_add(1, Ordering::Relaxed);
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        out.push_str(&reader.join().unwrap_or_default());
    }
}

fn epoch_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// dnsperf's `-S` lines (`EPOCH: QPS`, the rate of answers over the last interval) as
/// (seconds since `start`, queries per second).
pub(super) fn rates(out: &str, start: f64) -> Vec<(f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let (t, q) = l.split_once(": ")?;
            let t: f64 = t.trim().parse().ok()?;
            Some((t - start, q.trim().parse().ok()?))
        })
        .collect()
}

/// The rate dnsperf reported for the interval that ended nearest `t` (seconds), within 6 s.
pub(super) fn rate_at(rates: &[(f64, f64)], t: u64) -> Option<f64> {
    rates
        .iter()
        .map(|&(at, q)| ((at - t as f64).abs(), q))
        .filter(|(d, _)| *d <= 6.0)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, q)| q)
}

/// Whether `/readyz` answers within a second (a stopped agent cannot).
fn curl_quick(lab: &Lab) -> bool {
    let url = format!("http://{LISTEN}/readyz");
    lab.exec(lab.node_ns(), &["curl", "-sf", "-m", "1", &url])
        .status
        .success()
}

/// What a stopped agent may have left: TC filters on the lab's veths, pins in bpffs.
fn leftovers(lab: &Lab, _pid: Option<u32>) -> Vec<String> {
    let mut left = Vec::new();
    for dev in lab.veths() {
        for dir in ["ingress", "egress"] {
            let o = lab.exec(lab.node_ns(), &["tc", "filter", "show", "dev", dev, dir]);
            if String::from_utf8_lossy(&o.stdout).contains("dnspath") {
                left.push(format!("tc filter on {dev} {dir}"));
            }
        }
    }
    if let Ok(rd) = fs::read_dir("/sys/fs/bpf") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("dnspath") {
                left.push(format!("/sys/fs/bpf/{n}"));
            }
        }
    }
    left
}

struct Report<'a> {
    o: &'a SoakOptions,
    samples: &'a [Sample],
    faults: &'a [(u64, String)],
    lines: &'a [String],
    cg: &'a Cgroup,
    restarts: u32,
    crashes: u32,
    races_forced: u32,
    pods_made: u64,
    /// dnsperf UDP's answers per second, every 10 s: (seconds into the soak, rate).
    udp_rate: Vec<(f64, f64)>,
    /// dnsperf runs killed for not ending.
    stuck: u64,
    udp: &'a str,
    tcp: &'a str,
    end: (u64, u64),
    record: &'a Path,
    leftovers: Vec<String>,
    stopped: Option<Stopped>,
}

/// The agent's SIGTERM stop at the end.
struct Stopped {
    /// Its exit status; `None` if waiting for it failed.
    status: Option<String>,
    secs: f64,
    /// OOM kills in the cgroup during the stop.
    oom_kills: u64,
    /// The cgroup's most charged memory seen during the stop.
    cg_max: Option<u64>,
}

/// The sum of a statistic over every dnsperf run in `out`.
fn field(out: &str, label: &str) -> Option<f64> {
    out.lines()
        .filter_map(|l| l.trim_start().strip_prefix(label))
        .filter_map(|r| r.split_whitespace().next())
        .filter_map(|v| v.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

fn report(r: &Report) {
    let mib = |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.0}", k as f64 / 1024.0));
    println!(
        "\nsoak: {} min, dnsperf {} qps UDP (cached, new, NXDOMAIN, large TXT) + {} qps TCP + 1 qps unanswered, \
         `dnspath agent --record` (4 MiB tmpfs) under a {} MiB memory cgroup",
        r.o.minutes,
        r.o.qps,
        (r.o.qps / 50).max(1),
        r.o.memory_mib
    );
    println!(
        "  {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12} {:>10} {:>4} {:>8} {:>6}",
        "t s",
        "VmRSS",
        "cg max",
        "anon",
        "kernel",
        "CPU %",
        "ready",
        "packets",
        "lost",
        "OOM",
        "qps",
        "pkt/q"
    );
    let mut per_query: Vec<(u64, f64)> = Vec::new();
    let mib_b = |b: Option<u64>| b.map_or("-".into(), |b| (b >> 20).to_string());
    let mut prev: Option<&Sample> = None;
    for s in r.samples {
        // CPU per query is the run's (below): dnsperf's own rate varies with the faults.
        let cpu_pct = match prev {
            Some(p) if s.t_s > p.t_s && s.cpu_s >= p.cpu_s => {
                format!(
                    "{:.0}",
                    100.0 * (s.cpu_s - p.cpu_s) / (s.t_s - p.t_s) as f64
                )
            }
            _ => "-".into(),
        };
        // Packets the agent counted per query answered to dnsperf, over the interval
        // (not across a restart: its counter starts again).
        let qps = rate_at(&r.udp_rate, s.t_s);
        let pkt_q = match (prev.and_then(|p| Some((p.t_s, p.packets?))), s.packets, qps) {
            (Some((t0, before)), Some(now), Some(q)) if s.t_s > t0 && now >= before && q >= 1.0 => {
                let v = (now - before) as f64 / (s.t_s - t0) as f64 / q;
                per_query.push((s.t_s, v));
                format!("{v:.1}")
            }
            _ => "-".into(),
        };
        println!(
            "  {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12} {:>10} {:>4} {:>8} {:>6}",
            s.t_s,
            mib(s.rss_kib),
            mib_b(s.cg_max),
            mib_b(s.anon),
            mib_b(s.kernel),
            cpu_pct,
            format!(
                "{}/{}",
                if s.healthz { "h" } else { "-" },
                if s.readyz { "r" } else { "-" }
            ),
            s.packets.map_or("-".into(), thousands),
            s.lost.map_or("-".into(), thousands),
            s.oom_kills,
            qps.map_or("-".into(), |q| format!("{q:.0}")),
            pkt_q
        );
        prev = Some(s);
    }
    let warm = r
        .samples
        .iter()
        .filter(|s| s.t_s >= 120)
        .filter_map(|s| s.rss_kib);
    let (lo, hi) = warm.fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi > 0 {
        println!(
            "  VmRSS after 2 min of warm-up: {:.0}–{:.0} MiB; cgroup peak {} MiB of {}; OOM kills {}",
            lo as f64 / 1024.0,
            hi as f64 / 1024.0,
            r.cg.peak().map_or("-".into(), |p| (p >> 20).to_string()),
            r.o.memory_mib,
            r.cg.oom_kills().map_or("-".into(), |k| k.to_string())
        );
    }
    load_checks(r, &per_query);
    println!("  faults:");
    for (t, what) in r.faults {
        println!("    +{t:>4} s  {what}");
    }
    let recs: Vec<Value> = r
        .lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let count =
        |ty: &str, k: &str, v: &str| recs.iter().filter(|x| x["type"] == ty && x[k] == v).count();
    let loops_started = r
        .faults
        .iter()
        .filter(|(_, w)| w.starts_with("forwarding loop started"))
        .count();
    let loops = loop_reports(&recs);
    println!(
        "  loops: {loops_started} started; detected {} (questions {}, detected again after an end {} \
         — the query file asks each name again every few seconds —, detected again while still \
         active {}: a fault if not 0), ended {} (event stream, across {} SIGKILL restart(s) and \
         {} crash(es))",
        loops.detected,
        loops.questions,
        loops.again_after_end,
        loops.again_while_active,
        count("loop", "state", "ended"),
        r.restarts,
        r.crashes
    );
    println!(
        "  races: {} forced with the A lost; race-drop events {}",
        r.races_forced,
        count("race", "verdict", "race-drop")
    );
    println!(
        "  ring-buffer loss: agent's last counter {} (since its last start); warnings in the stream {}",
        thousands(r.end.1),
        recs.iter().filter(|x| x["type"] == "warning").count()
    );
    println!(
        "  pod namespaces created and deleted meanwhile: {}",
        r.pods_made
    );
    let files = fs::read_dir(r.record).map(|d| d.count()).unwrap_or(0);
    println!("  recorder files on the 4 MiB tmpfs at the end: {files}");
    let queries = field(r.udp, "Queries completed:").unwrap_or(0.0)
        + field(r.udp, "Queries lost:").unwrap_or(0.0)
        + field(r.tcp, "Queries completed:").unwrap_or(0.0)
        + field(r.tcp, "Queries lost:").unwrap_or(0.0);
    let cpu: f64 = r
        .samples
        .windows(2)
        .map(|w| (w[1].cpu_s - w[0].cpu_s).max(0.0))
        .sum();
    println!(
        "  agent CPU: {cpu:.1} s between samples (restarts excluded) for {queries:.0} queries sent = {:.0} µs/query",
        cpu * 1e6 / queries.max(1.0)
    );
    println!(
        "  dnsperf ({CHUNK_S}-s runs; {} killed for not ending): UDP completed {}, lost {}; TCP completed {}, lost {}",
        r.stuck,
        field(r.udp, "Queries completed:").unwrap_or(0.0),
        field(r.udp, "Queries lost:").unwrap_or(0.0),
        field(r.tcp, "Queries completed:").unwrap_or(0.0),
        field(r.tcp, "Queries lost:").unwrap_or(0.0),
    );
    if let Some(st) = &r.stopped {
        println!(
            "  SIGTERM stop: {} in {:.1} s; cgroup charge up to {} MiB of {} meanwhile; OOM kills meanwhile {}",
            st.status.as_deref().unwrap_or("exit status unknown"),
            st.secs,
            mib_b(st.cg_max),
            r.o.memory_mib,
            st.oom_kills
        );
    }
    if r.leftovers.is_empty() {
        println!(
            "  left behind after SIGTERM: nothing (TC filters on the lab's veths, bpffs pins)"
        );
    } else {
        println!("  LEFT BEHIND: {}", r.leftovers.join(", "));
    }
}

/// dnsperf's rate through the faults, and the agent's packets per answered query: an
/// interval with under half the run's median (the ring buffer overflowing, the agent stopped)
/// is named with the faults around it.
fn load_checks(r: &Report, per_query: &[(u64, f64)]) {
    let median = |v: &mut Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mut q: Vec<f64> = r.udp_rate.iter().map(|(_, q)| *q).collect();
    let n = q.len();
    let low: Vec<String> = r
        .udp_rate
        .iter()
        .filter(|(_, q)| *q < f64::from(r.o.qps) / 2.0)
        .map(|(t, _)| format!("+{t:.0}"))
        .collect();
    let med = median(&mut q);
    println!(
        "  dnsperf UDP answers/s every 10 s: min {:.0}, median {med:.0}, max {:.0} of {} asked; \
         under half the rate in {} of {n} intervals{}",
        q.first().copied().unwrap_or(0.0),
        q.last().copied().unwrap_or(0.0),
        r.o.qps,
        low.len(),
        if low.is_empty() {
            String::new()
        } else {
            format!(" (ending at {} s)", low.join(", "))
        }
    );
    let mut v: Vec<f64> = per_query.iter().map(|(_, v)| *v).collect();
    let med = median(&mut v);
    let blind: Vec<String> = per_query
        .iter()
        .filter(|(_, v)| *v < med / 2.0)
        .map(|(t, v)| format!("+{t} s ({v:.1})"))
        .collect();
    println!(
        "  agent packets per answered query: median {med:.1} over {} intervals; under half of it in {}: {}",
        per_query.len(),
        blind.len(),
        if blind.is_empty() {
            "none".to_string()
        } else {
            blind.join(", ")
        }
    );
}

/// The event stream's loop reports, per question.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LoopReports {
    pub detected: usize,
    pub questions: usize,
    /// A question detected again after its loop ended: asked again (dnsperf replays its
    /// names), a new loop — or an end reported too early.
    pub again_after_end: usize,
    /// A question detected again on the same cycle while its loop was still going on (not
    /// ended): one loop reported twice. Each agent start begins afresh (a SIGKILLed agent ends none).
    pub again_while_active: usize,
}

pub(crate) fn loop_reports(recs: &[Value]) -> LoopReports {
    let mut out = LoopReports::default();
    let mut active: std::collections::BTreeMap<(String, String), usize> = Default::default();
    let mut seen: std::collections::BTreeSet<(String, String)> = Default::default();
    let mut questions: std::collections::BTreeSet<String> = Default::default();
    for x in recs {
        if x["type"] == "agent" && x["state"] == "start" {
            active.clear();
            continue;
        }
        if x["type"] != "loop" {
            continue;
        }
        let q = x["question"]["name"].as_str().unwrap_or("?").to_owned();
        // Reports are keyed by question (name, type, class: the soak asks www.lab.test. for
        // A and AAAA, two loops) and cycle: a second cycle is another loop.
        let key = (
            format!("{q} {} {}", x["question"]["type"], x["question"]["class"]),
            x["cycle"].to_string(),
        );
        match x["state"].as_str() {
            Some("detected") => {
                out.detected += 1;
                let n = active.entry(key.clone()).or_default();
                if *n > 0 {
                    out.again_while_active += 1;
                } else if seen.contains(&key) {
                    out.again_after_end += 1;
                }
                *n += 1;
                seen.insert(key);
                questions.insert(q);
            }
            Some("ended") => {
                if let Some(n) = active.get_mut(&key) {
                    *n = n.saturating_sub(1);
                }
            }
            _ => {}
        }
    }
    out.questions = questions.len();
    out
}

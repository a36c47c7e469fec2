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
    path::Path,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::anyhow;
use lab::{
    hole::{Hole, HOLE_ADDR},
    race::{force_race, RaceRig},
    DnsPodConfig, DnsServerKind, Lab, LabConfig,
};

use super::{
    phoenix::Receiver,
    proc::{cpu_s, vm_rss_kib},
    tool::{metric, Tool},
};

mod cgroup;
mod faults;
mod load;
mod report;
#[cfg(test)]
mod tests;

use cgroup::Cgroup;
use faults::{churn, schedule, Fault};
use load::{epoch_s, load, query_file, rates};
use report::{report, Report, Sample, Stopped};

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

//! `cargo xtask bench --only scale` (issue #43): the agent on a node of 110 pods with no DNS
//! traffic. The lab's node namespace gets 110 more pod namespaces, each a veth into the
//! node, before `dnspath agent` starts; then it idles, then 20 pods are replaced. Printed
//! next to each goal: start → `/readyz`, CPU spent attaching, CPU with no traffic, RSS
//! before the first query, TC programs loaded, namespaces whose conntrack is followed, and
//! CPU per new pod. Figures only: nothing is asserted on timing.
use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::anyhow;
use lab::{Lab, LabConfig};

use super::{
    goal,
    proc::{cpu_s, thread_cpu_line, thread_cpu_s, vm_rss_kib},
    tool::{agent_get, Tool, AGENT_LISTEN},
};

/// Kubernetes' default maximum of pods per node.
pub(super) const PODS: usize = 110;
/// Pods replaced after the idle window.
const REPLACED: usize = 20;
/// How long the agent is watched doing nothing.
const IDLE: Duration = Duration::from_secs(10);

/// Pod namespaces of the bench's own, each with a veth into the node namespace; removed on
/// drop (only those it made).
struct IdlePods {
    prefix: String,
    node: String,
    made: Vec<String>,
}

impl IdlePods {
    fn new(node: &str) -> Self {
        Self {
            prefix: format!("dps{:x}", std::process::id() & 0xffff),
            node: node.to_string(),
            made: Vec::new(),
        }
    }

    fn name(&self, i: usize) -> (String, String) {
        (
            format!("{}-p{i}", self.prefix),
            format!("{}v{i}", self.prefix),
        )
    }

    /// Creates pods `range`: a namespace each, its `eth0` the peer of a veth in the node.
    fn create(&mut self, range: std::ops::Range<usize>) -> crate::Result<()> {
        let mut netns = String::new();
        let mut node = String::new();
        for i in range.clone() {
            let (ns, veth) = self.name(i);
            netns.push_str(&format!("netns add {ns}\n"));
            node.push_str(&format!(
                "link add {veth} type veth peer name eth0 netns {ns}\nlink set {veth} up\n"
            ));
        }
        ip_batch(&[], &netns)?;
        for i in range.clone() {
            self.made.push(self.name(i).0);
        }
        ip_batch(&["-n", &self.node], &node)?;
        for i in range {
            let (ns, _) = self.name(i);
            let a = 10 + i / 250;
            let b = i % 250 + 2;
            ip_batch(
                &["-n", &ns],
                &format!("link set lo up\nlink set eth0 up\naddr add 10.{a}.{b}.2/24 dev eth0\n"),
            )?;
        }
        Ok(())
    }

    /// Deletes pods `range` (their veths go with them).
    fn delete(&mut self, range: std::ops::Range<usize>) -> crate::Result<()> {
        let mut netns = String::new();
        for i in range {
            let (ns, _) = self.name(i);
            netns.push_str(&format!("netns delete {ns}\n"));
            self.made.retain(|m| *m != ns);
        }
        ip_batch(&[], &netns)
    }
}

impl Drop for IdlePods {
    fn drop(&mut self) {
        let batch: String = self
            .made
            .iter()
            .map(|ns| format!("netns delete {ns}\n"))
            .collect();
        if let Err(e) = ip_batch(&["-force"], &batch) {
            eprintln!("bench scale: removing the pods: {e}");
        }
    }
}

fn ip_batch(args: &[&str], batch: &str) -> crate::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let mut c = Command::new("ip");
    c.args(args).args(["-batch", "-"]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().map_err(|e| anyhow!("ip -batch: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        stdin.write_all(batch.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(anyhow!(
            "ip {} -batch: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// TC programs and other BPF programs the process holds open.
fn bpf_programs(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy() == "anon_inode:bpf-prog")
                .count()
        })
        .unwrap_or(0)
}

/// What a run of the section measured.
#[derive(Debug, Default)]
pub(super) struct ScaleFigures {
    pub ready_s: f64,
    pub attach_cpu_s: f64,
    pub idle_core_pct: f64,
    pub rss_mib: f64,
    pub programs: usize,
    /// The agent's own line on how many namespaces it follows conntrack in, if it said one.
    pub conntrack_line: Option<String>,
    pub churn_cpu_ms_per_pod: f64,
    /// New non-DNS flows a second the flood made through the node, and the agent's CPU
    /// above idle meanwhile (% of a core).
    pub flood_flows_per_s: f64,
    pub flood_core_pct: f64,
}

impl ScaleFigures {
    /// The figures, each next to its goal (issue #43).
    pub(super) fn lines(&self) -> Vec<String> {
        let mut out = vec![
            format!("scale: {PODS} pod namespaces, {REPLACED} replaced, no DNS traffic"),
            goal(
                "start → /readyz ≤ 5 s",
                &format!("{:.1} s", self.ready_s),
                self.ready_s,
                5.0,
                true,
            ),
            goal(
                "CPU spent attaching ≤ 2 s",
                &format!("{:.2} s", self.attach_cpu_s),
                self.attach_cpu_s,
                2.0,
                true,
            ),
            goal(
                "CPU with no DNS traffic ≤ 1 % of a core",
                &format!("{:.1} %", self.idle_core_pct),
                self.idle_core_pct,
                1.0,
                true,
            ),
            goal(
                "RSS before the first query ≤ 48 MiB",
                &format!("{:.0} MiB", self.rss_mib),
                self.rss_mib,
                48.0,
                true,
            ),
            goal(
                "BPF programs loaded: one set (≤ 8)",
                &self.programs.to_string(),
                self.programs as f64,
                8.0,
                true,
            ),
            goal(
                &format!(
                    "CPU above idle, {} new non-DNS flows/s ≤ 2 % of a core",
                    super::thousands(self.flood_flows_per_s as u64)
                ),
                &format!("{:.1} %", self.flood_core_pct),
                self.flood_core_pct,
                2.0,
                true,
            ),
            goal(
                "CPU per new pod ≤ 20 ms",
                &format!("{:.0} ms", self.churn_cpu_ms_per_pod),
                self.churn_cpu_ms_per_pod,
                20.0,
                true,
            ),
        ];
        out.push(format!(
            "  conntrack: {}",
            self.conntrack_line
                .as_deref()
                .unwrap_or("every namespace followed (no cap reached)")
        ));
        out
    }
}

/// New non-DNS flows a second through the node during the flood (issue #43's busy node).
const FLOOD_RATE: u32 = 22_000;
/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(10);

/// [`FLOOD_RATE`] UDP datagrams a second for [`FLOOD`] from the client pod to a DNS pod,
/// each to another port (4 source sockets × ports 1024–65535: each datagram a new flow,
/// nothing listening); returns how many were sent.
fn flood(lab: &Lab) -> crate::Result<u64> {
    let target = lab.ip_of(lab::Pod::Dns(0)).to_string();
    let secs = FLOOD.as_secs();
    let script = format!(
        "import socket, time\n\
         socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(4)]\n\
         sent, start = 0, time.monotonic()\n\
         while True:\n\
         \x20   now = time.monotonic() - start\n\
         \x20   if now >= {secs}: break\n\
         \x20   due = int(now * {FLOOD_RATE}) + 100\n\
         \x20   while sent < due:\n\
         \x20       s = socks[(sent // 64512) % 4]\n\
         \x20       s.sendto(b'x', ('{target}', 1024 + sent % 64512))\n\
         \x20       sent += 1\n\
         \x20   time.sleep(0.001)\n\
         print(sent)\n"
    );
    let o = lab.exec(lab.client_ns(), &["python3", "-c", &script]);
    if !o.status.success() {
        return Err(anyhow!("flood: {}", String::from_utf8_lossy(&o.stderr)));
    }
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .map_err(|e| anyhow!("flood: {e}"))
}

/// The scale section: a lab node with [`PODS`] pods, the agent idle on it, then churn.
pub fn run_scale(dnspath: &Path) -> crate::Result<()> {
    let lab = Lab::start(LabConfig::default()).map_err(|e| anyhow!("lab: {e}"))?;
    let mut pods = IdlePods::new(lab.node_ns());
    pods.create(0..PODS)?;
    let dnspath = dnspath.to_string_lossy().into_owned();
    let started = Instant::now();
    let agent = Tool::start(
        &lab,
        lab.node_ns(),
        &[&dnspath, "agent", "--listen", AGENT_LISTEN],
        |_| false,
        "dnspath: agent serving",
    )?;
    let pid = agent.pid().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    while agent_get(&lab, "/readyz").is_none() {
        if Instant::now() > deadline {
            let s = agent.stop(libc::SIGTERM);
            return Err(anyhow!("agent never ready: {}", s.stderr));
        }
        thread::sleep(Duration::from_millis(50));
    }
    let mut f = ScaleFigures {
        ready_s: started.elapsed().as_secs_f64(),
        attach_cpu_s: cpu_s(&pid, false).unwrap_or(0.0),
        ..Default::default()
    };
    // A second for the first rescan to settle, then the idle window.
    thread::sleep(Duration::from_secs(1));
    f.rss_mib = vm_rss_kib(agent.pid()).unwrap_or(0) as f64 / 1024.0;
    f.programs = bpf_programs(agent.pid());
    let before = cpu_s(&pid, false).unwrap_or(0.0);
    let t0 = Instant::now();
    thread::sleep(IDLE);
    let idle_cpu = cpu_s(&pid, false).unwrap_or(0.0) - before;
    f.idle_core_pct = idle_cpu * 100.0 / t0.elapsed().as_secs_f64();
    // Churn: REPLACED pods go and come back; what it cost above idle, per new pod.
    let before = cpu_s(&pid, false).unwrap_or(0.0);
    let t0 = Instant::now();
    // New sandboxes get new names, as kubelet's do (and the old veths may outlive their
    // namespace for a moment: the kernel cleans a namespace up asynchronously).
    pods.delete(0..REPLACED)?;
    pods.create(PODS..PODS + REPLACED)?;
    thread::sleep(Duration::from_secs(5));
    let churn_cpu = cpu_s(&pid, false).unwrap_or(0.0) - before;
    let idle_share = idle_cpu / IDLE.as_secs_f64() * t0.elapsed().as_secs_f64();
    f.churn_cpu_ms_per_pod = (churn_cpu - idle_share).max(0.0) * 1000.0 / REPLACED as f64;
    // A node busy with other traffic: new non-DNS flows through the node, each a conntrack
    // entry (and an event) in the node's namespace; what the agent spends above idle.
    let before = cpu_s(&pid, false).unwrap_or(0.0);
    let before_threads = thread_cpu_s(&pid);
    let t0 = Instant::now();
    let sent = flood(&lab)?;
    let took = t0.elapsed().as_secs_f64();
    let flood_cpu = cpu_s(&pid, false).unwrap_or(0.0) - before;
    eprintln!(
        "bench: scale: the agent's CPU by thread during the flood: {}",
        thread_cpu_line(&before_threads, &thread_cpu_s(&pid))
    );
    let idle_share = idle_cpu / IDLE.as_secs_f64() * took;
    f.flood_flows_per_s = sent as f64 / took;
    f.flood_core_pct = (flood_cpu - idle_share).max(0.0) * 100.0 / took;
    let finished = agent.stop(libc::SIGTERM);
    f.conntrack_line = finished
        .stderr
        .lines()
        .find(|l| l.contains("conntrack: watching"))
        .map(|l| l.trim().to_string());
    for line in f.lines() {
        println!("{line}");
    }
    drop(pods);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_printed_next_to_its_goal() {
        let f = ScaleFigures {
            ready_s: 17.8,
            attach_cpu_s: 1.5,
            idle_core_pct: 0.4,
            rss_mib: 177.0,
            programs: 228,
            conntrack_line: Some("conntrack: watching 64 of 112 namespaces".into()),
            churn_cpu_ms_per_pod: 270.0,
            flood_flows_per_s: 21_950.0,
            flood_core_pct: 1.8,
        };
        let lines = f.lines();
        let find = |what: &str| {
            lines
                .iter()
                .find(|l| l.contains(what))
                .unwrap_or_else(|| panic!("{what} not in {lines:#?}"))
                .clone()
        };
        assert!(find("/readyz").ends_with("missed by 3.56×"), "{lines:#?}");
        assert!(find("attaching").ends_with("met"), "{lines:#?}");
        assert!(
            find("CPU with no DNS traffic").ends_with("met"),
            "{lines:#?}"
        );
        assert!(find("RSS").contains("177 MiB"), "{lines:#?}");
        assert!(find("programs").contains("228"), "{lines:#?}");
        assert!(
            find("per new pod").ends_with("missed by 13.50×"),
            "{lines:#?}"
        );
        assert!(find("conntrack:").contains("64 of 112"), "{lines:#?}");
        let flood = find("non-DNS flows");
        assert!(flood.contains("21,950 new"), "{lines:#?}");
        assert!(flood.ends_with("met"), "{lines:#?}");
    }
}

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! What must hold on every kernel nodes run. `cargo xtask vm-test` runs this binary inside
//! VMs booted with Debian's 5.10, 6.1 and 6.12 kernels, and on the host; in the normal suite
//! it covers the host kernel. One lab and two tracer starts (loading is slow when emulated):
//!
//! 1. `load`: the programs load and the tracer starts (attach mode and hooks reported);
//! 2. `restart`: it is SIGKILLed and a second one started: only the live tracer's TC filters
//!    are attached, the dead one's programs are gone, each packet is captured once per hop;
//! 3. `path`: a dig through the ClusterIP is seen, decoded, at every hop;
//! 4. `drop`: an iptables DROP of a DNS packet is a `drop` record, with a reason from 5.17
//!    on and without one before;
//! 5. `clean-exit`: after SIGINT nothing of ours is left (TC filters, bpffs pins, programs,
//!    processes).
//!
//! With `DNSPATH_MATRIX_REPORT=FILE` the findings are also written to FILE as `key=value`
//! lines (`release`, `tc_attach`, `hooks`, `drop_reason`, `degraded`, `check.NAME`), which
//! `cargo xtask vm-test` turns into one line per kernel. Root only; `--test-threads=1`.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Write,
    os::unix::fs::MetadataExt,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use lab::{
    tracer::{dnspath_bin, ndjson, Tracer, TracerOutput},
    Lab, LabConfig, Pod,
};
use serde_json::Value;

/// Loading and verifying every program takes a while in an emulated (TCG) VM.
const START_TIMEOUT: Duration = Duration::from_secs(150);
/// Generous for an emulated VM; the lab answers in milliseconds on real hardware.
const DIG_TIME: &str = "+time=5";
/// How long a program may take to be freed once nothing holds it.
const PROG_FREE_WAIT: Duration = Duration::from_secs(20);

type Check = Result<String, String>;

#[derive(Default)]
struct Report {
    release: String,
    tc_attach: Option<String>,
    hooks: Option<String>,
    drop_reason: Option<bool>,
    degraded: Option<String>,
    checks: Vec<(&'static str, Check)>,
    /// What the test is doing now: on a timeout the report says where it hung.
    step: String,
    started: Option<Instant>,
}

impl Report {
    fn elapsed(&self) -> f64 {
        self.started.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// Says (on stderr and in the report) what comes next.
    fn step(&mut self, what: &str) {
        eprintln!("kernel_matrix: [{:6.1} s] {what}", self.elapsed());
        self.step = what.to_owned();
        self.write();
    }

    fn check(&mut self, name: &'static str, result: Check) {
        let t = self.elapsed();
        match &result {
            Ok(note) => eprintln!("kernel_matrix: [{t:6.1} s] {name}: ok {note}"),
            Err(e) => eprintln!("kernel_matrix: [{t:6.1} s] {name}: FAIL {e}"),
        }
        self.checks.push((name, result));
        self.write();
    }

    fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter_map(|(n, r)| r.as_ref().err().map(|e| format!("{n}: {e}")))
            .collect()
    }

    /// Attach mode and hooks: from the `stats` record's `kernel` object, else from the
    /// `dnspath: kernel ...` line on stderr.
    fn kernel_info(&mut self, out: &TracerOutput, recs: &[Value]) {
        if let Some(k) = stats(recs).and_then(kernel_object) {
            self.tc_attach = k["tc_attach"].as_str().map(str::to_owned);
            self.hooks = k["hooks"].as_array().map(|a| {
                a.iter()
                    .map(|h| h.as_str().unwrap_or("?"))
                    .collect::<Vec<_>>()
                    .join(",")
            });
            self.drop_reason = k["drop_reason"].as_bool();
            self.degraded = k["degraded"].as_array().map(|a| {
                a.iter()
                    .map(|h| h.as_str().map_or_else(|| h.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join("; ")
            });
        }
        if let Some(line) = out
            .stderr
            .lines()
            .find(|l| l.starts_with("dnspath: kernel "))
        {
            if self.tc_attach.is_none() {
                self.tc_attach = line
                    .split("tc attach ")
                    .nth(1)
                    .and_then(|s| s.split([';', ' ']).next())
                    .map(str::to_owned);
            }
            if self.hooks.is_none() {
                self.hooks = line.split_once(": ").map(|(_, rest)| rest.to_owned());
            }
        }
    }

    fn write(&self) {
        let Some(path) = std::env::var_os("DNSPATH_MATRIX_REPORT") else {
            return;
        };
        let opt = |o: &Option<String>| one_line(o.as_deref().unwrap_or("?"));
        let mut s = format!(
            "release={}\ntc_attach={}\nhooks={}\ndrop_reason={}\ndegraded={}\n",
            self.release,
            opt(&self.tc_attach),
            opt(&self.hooks),
            self.drop_reason.map_or("?".to_owned(), |b| b.to_string()),
            opt(&self.degraded),
        );
        s += &format!("step={}\n", one_line(&self.step));
        for (name, r) in &self.checks {
            match r {
                Ok(note) => s += &format!("check.{name}=ok {}\n", one_line(note)),
                Err(e) => s += &format!("check.{name}=FAIL {}\n", one_line(e)),
            }
        }
        fs::write(&path, s).unwrap();
    }
}

fn one_line(s: &str) -> String {
    s.trim().replace('\n', " | ")
}

/// First and last lines of a tracer's stderr (a verifier log can run to thousands).
fn stderr_summary(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let cut = |l: &&str| l.chars().take(240).collect::<String>();
    if lines.len() <= 10 {
        return lines.iter().map(cut).collect::<Vec<_>>().join("\n");
    }
    let head: Vec<String> = lines[..3].iter().map(cut).collect();
    let tail: Vec<String> = lines[lines.len() - 6..].iter().map(cut).collect();
    format!(
        "{}\n... ({} lines) ...\n{}",
        head.join("\n"),
        lines.len() - 9,
        tail.join("\n")
    )
}

fn release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}

/// (major, minor) of a release such as `6.1.0-57-amd64`.
fn version(release: &str) -> (u32, u32) {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

fn stats(recs: &[Value]) -> Option<&Value> {
    recs.iter().rev().find(|r| r["type"] == "stats")
}

/// The `stats` record's `kernel` object: release, attach mode, hooks.
fn kernel_object(stats: &Value) -> Option<&Value> {
    let k = &stats["kernel"];
    k.get("tc_attach").is_some().then_some(k)
}

fn qname(r: &Value) -> Option<&str> {
    r["dns"]["questions"][0]["name"].as_str()
}

fn records(out: &TracerOutput) -> Result<Vec<Value>, String> {
    if !out.status.success() {
        return Err(format!(
            "dnspath exited with {}: {}",
            out.status,
            stderr_summary(&out.stderr)
        ));
    }
    Ok(ndjson(&out.stdout))
}

fn ensure(ok: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(msg())
    }
}

/// `dnspath trace -o json` in the node, and in every pod namespace too (pod `eth0`s).
fn trace_args(lab: &Lab) -> Vec<&str> {
    let mut args = vec!["trace", "-o", "json"];
    for ns in lab.namespaces().into_iter().skip(1) {
        args.extend(["--netns", ns]);
    }
    args
}

fn start(lab: &Lab) -> Result<Tracer, String> {
    Tracer::start_waiting(lab, lab.node_ns(), &trace_args(lab), true, START_TIMEOUT).map_err(|e| {
        let e = e.to_string();
        // "... stderr so far:\n<the tracer's stderr>"
        match e.split_once("stderr so far:\n") {
            Some((head, err)) => format!("{} {}", head.trim(), stderr_summary(err)),
            None => e,
        }
    })
}

// ---- what the kernel holds for a process ----

/// IDs of the BPF programs `pid` holds (programs and links, from `/proc/PID/fdinfo`).
fn prog_ids(pid: u32) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for fd in fds.flatten() {
        let Ok(info) = fs::read_to_string(fd.path()) else {
            continue;
        };
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("prog_id:") {
                if let Ok(id) = v.trim().parse() {
                    ids.insert(id);
                }
            }
        }
    }
    ids
}

/// The BPF programs loaded now, by id, with their names (aya walks BPF_PROG_GET_NEXT_ID).
/// A program freed while the walk runs is left out, as it should be.
fn loaded_programs() -> BTreeMap<u32, String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| (p.id(), p.name_as_str().unwrap_or("?").to_owned()))
        .collect()
}

/// Name of a loaded BPF program, for messages.
fn prog_name(id: u32) -> String {
    match loaded_programs().get(&id) {
        Some(name) => format!("#{id} {name}"),
        None => format!("#{id}"),
    }
}

/// Polls until none of `ids` is loaded; returns those still loaded after `timeout`
/// (programs are freed a moment after their last reference goes).
fn wait_unloaded(ids: &BTreeSet<u32>, timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let loaded = loaded_programs();
        let left: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| loaded.contains_key(id))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A TC filter running one of our programs: (netns, dev, direction, program id, its name).
type Filter = (String, String, &'static str, Option<u32>, String);

/// Every `dnspath_*` TC filter (clsact) on every interface of every lab namespace.
/// TCX attachments do not show here; they are links held by the process.
/// Two commands per namespace (`ip link`, then one `tc -json -batch`): each exec is slow
/// in an emulated VM.
fn tc_filters(lab: &Lab) -> Vec<Filter> {
    let mut found = Vec::new();
    for ns in lab.namespaces() {
        let links = Command::new("ip")
            .args(["-n", ns, "-o", "link", "show"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&links.stdout).into_owned();
        let mut shows = Vec::new();
        for dev in links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|d| d.split('@').next().unwrap_or(d))
        {
            for dir in ["ingress", "egress"] {
                shows.push((dev.to_owned(), dir));
            }
        }
        let batch: String = shows
            .iter()
            .map(|(dev, dir)| format!("filter show dev {dev} {dir}\n"))
            .collect();
        let mut tc = Command::new("tc")
            .args(["-json", "-force", "-n", ns, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        tc.stdin
            .take()
            .unwrap()
            .write_all(batch.as_bytes())
            .unwrap();
        let out = tc.wait_with_output().unwrap();
        // One JSON array per command, in order (`[]` where there is no clsact qdisc).
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let arrays = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
        for ((dev, dir), arr) in shows.iter().zip(arrays) {
            let Ok(Value::Array(filters)) = arr else {
                continue;
            };
            for f in filters {
                let opts = &f["options"];
                let name = opts["bpf_name"]
                    .as_str()
                    .or(opts["prog"]["name"].as_str())
                    .unwrap_or_default();
                if !name.contains("dnspath") && !f.to_string().contains("dnspath") {
                    continue;
                }
                let id = opts["prog"]["id"]
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok());
                let name = if name.is_empty() {
                    f.to_string()
                } else {
                    name.to_owned()
                };
                found.push((ns.to_owned(), dev.clone(), *dir, id, name));
            }
        }
    }
    found
}

fn bpffs_entries() -> BTreeSet<String> {
    fs::read_dir("/sys/fs/bpf")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("dnspath"))
                .collect()
        })
        .unwrap_or_default()
}

/// PIDs of `dnspath` processes in the lab's node namespace.
fn tracer_processes(lab: &Lab) -> Vec<u32> {
    let node = fs::metadata(format!("/run/netns/{}", lab.node_ns()))
        .map(|m| (m.dev(), m.ino()))
        .ok();
    let bin = fs::canonicalize(dnspath_bin()).unwrap_or_else(|_| dnspath_bin());
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let exe = fs::read_link(e.path().join("exe")).ok()?;
            let ns = fs::metadata(e.path().join("ns/net")).ok()?;
            (exe == bin && Some((ns.dev(), ns.ino())) == node).then_some(pid)
        })
        .collect()
}

// ---- the checks ----

/// Query seen at the client pod's `eth0`, the node side of its veth, DNAT'd at a CoreDNS
/// pod's veth and `eth0`, that pod's query to the upstream, and the answers back.
fn check_path(lab: &Lab, recs: &[Value], name: &str) -> Check {
    let seen = |ns: &str, ifname: &str, dir: &str, qr: bool, dst: Option<&str>| {
        recs.iter().any(|r| {
            r["type"] == "packet"
                && qname(r) == Some(name)
                && r["netns"] == ns
                && r["ifname"] == ifname
                && r["dir"] == dir
                && r["dns"]["qr"] == qr
                && dst.is_none_or(|d| r["dst"] == d)
        })
    };
    let cip = format!("{}:53", lab.cluster_ip());
    let node = lab.node_ns();
    let mut missing = Vec::new();
    let mut want = |ok: bool, hop: String| {
        if !ok {
            missing.push(hop);
        }
    };
    want(
        seen(lab.client_ns(), "eth0", "egress", false, Some(&cip)),
        format!("query at {}/eth0 to {cip}", lab.client_ns()),
    );
    want(
        seen(node, lab.veth_of(Pod::Client), "ingress", false, Some(&cip)),
        format!("query at {node}/{}", lab.veth_of(Pod::Client)),
    );
    let backend = (0..lab.dns_pod_count()).find(|&i| {
        let ip = format!("{}:53", lab.ip_of(Pod::Dns(i)));
        seen(node, lab.veth_of(Pod::Dns(i)), "egress", false, Some(&ip))
    });
    let up = format!("{}:53", lab.ip_of(Pod::Upstream));
    match backend {
        None => want(false, "DNAT'd query at any CoreDNS pod's veth".to_owned()),
        Some(i) => {
            let ip = format!("{}:53", lab.ip_of(Pod::Dns(i)));
            want(
                seen(lab.ns_of(Pod::Dns(i)), "eth0", "ingress", false, Some(&ip)),
                format!("DNAT'd query at {}/eth0", lab.ns_of(Pod::Dns(i))),
            );
            want(
                seen(lab.ns_of(Pod::Dns(i)), "eth0", "egress", false, Some(&up)),
                format!("forwarded query at {}/eth0", lab.ns_of(Pod::Dns(i))),
            );
        }
    }
    want(
        seen(node, lab.veth_of(Pod::Upstream), "egress", false, Some(&up)),
        format!("forwarded query at {node}/{}", lab.veth_of(Pod::Upstream)),
    );
    want(
        seen(lab.upstream_ns(), "eth0", "ingress", false, Some(&up)),
        format!("forwarded query at {}/eth0", lab.upstream_ns()),
    );
    let answered = recs.iter().any(|r| {
        r["type"] == "packet"
            && qname(r) == Some(name)
            && r["netns"] == lab.client_ns()
            && r["dir"] == "ingress"
            && r["src"] == cip.as_str()
            && r["dns"]["answers"]
                .as_array()
                .is_some_and(|a| a.iter().any(|rr| rr["data"] == "10.250.0.80"))
    });
    want(
        answered,
        format!("decoded answer from {cip} at {}/eth0", lab.client_ns()),
    );
    if missing.is_empty() {
        let hops = recs
            .iter()
            .filter(|r| r["type"] == "packet" && qname(r) == Some(name))
            .count();
        Ok(format!("{hops} packets of {name}"))
    } else {
        let seen: Vec<String> = recs
            .iter()
            .filter(|r| r["type"] == "packet")
            .take(30)
            .map(|r| {
                format!(
                    "{}/{} {} {}>{} {}",
                    r["netns"].as_str().unwrap_or("?"),
                    r["ifname"].as_str().unwrap_or("?"),
                    r["dir"].as_str().unwrap_or("?"),
                    r["src"].as_str().unwrap_or("?"),
                    r["dst"].as_str().unwrap_or("?"),
                    qname(r).unwrap_or("-")
                )
            })
            .collect();
        Err(format!(
            "not seen: {}; packets seen: [{}]",
            missing.join(", "),
            seen.join("; ")
        ))
    }
}

fn check_drop(recs: &[Value], name: &str, release: &str) -> Check {
    let drops: Vec<&Value> = recs.iter().filter(|r| r["type"] == "drop").collect();
    let Some(d) = drops.iter().find(|d| qname(d) == Some(name)) else {
        let names: Vec<&str> = drops.iter().filter_map(|d| qname(d)).collect();
        return Err(format!(
            "no drop record for {name} ({} drop records, of {names:?})",
            drops.len()
        ));
    };
    let reason = d.get("reason").filter(|r| !r.is_null());
    let has_reason = version(release) >= (5, 17);
    let what = || {
        format!(
            "drop record of {name} in {} at {} has reason {}",
            d["netns"].as_str().unwrap_or("?"),
            d["location"].as_str().unwrap_or("?"),
            reason.map_or("null".to_owned(), |r| r.to_string())
        )
    };
    if has_reason {
        ensure(reason.is_some_and(|r| r == "NETFILTER_DROP"), || {
            format!("{}; expected NETFILTER_DROP (kernel >= 5.17)", what())
        })?;
    } else {
        // docs/output.md: `UNKNOWN` with `reason_code` null where the tracepoint has none.
        ensure(
            reason.is_some_and(|r| r == "UNKNOWN") && d["reason_code"].is_null(),
            || {
                format!(
                    "{}; expected UNKNOWN with reason_code null: kfree_skb has no reason before 5.17",
                    what()
                )
            },
        )?;
    }
    if let Some(k) = stats(recs).and_then(kernel_object) {
        ensure(k["drop_reason"] == has_reason, || {
            format!("stats kernel.drop_reason should be {has_reason}: {k}")
        })?;
    }
    Ok(format!(
        "reason {} at {}",
        reason.map_or("none".to_owned(), |r| r.to_string()),
        d["location"].as_str().unwrap_or("?")
    ))
}

/// After the tracer `pid` (holding `ids`) exited: none of its filters, pins, programs or
/// processes remain.
fn check_clean(lab: &Lab, ids: &BTreeSet<u32>, pins_before: &BTreeSet<String>) -> Check {
    let mut problems = Vec::new();
    let filters = tc_filters(lab);
    if !filters.is_empty() {
        let refs: Vec<&Filter> = filters.iter().collect();
        problems.push(format!(
            "{} TC filters left: {}",
            filters.len(),
            filter_list(&refs)
        ));
    }
    let pins: Vec<String> = bpffs_entries().difference(pins_before).cloned().collect();
    if !pins.is_empty() {
        problems.push(format!("bpffs pins left: {pins:?}"));
    }
    let procs = tracer_processes(lab);
    if !procs.is_empty() {
        problems.push(format!("dnspath processes left: {procs:?}"));
    }
    // Programs are freed after RCU grace periods, slow in an emulated VM.
    let left = programs_left(ids, &filters);
    if !left.is_empty() {
        problems.push(format!(
            "{} programs still loaded {} s after exit: {left:?}",
            left.len(),
            PROG_FREE_WAIT.as_secs()
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "{} programs unloaded; no filters, pins or processes left",
            ids.len()
        ))
    } else {
        Err(problems.join("; "))
    }
}

/// Each capture of `name`, keyed by hop and packet: a count above 1 is a double capture.
fn captures_per_hop(recs: &[Value], name: &str) -> BTreeMap<String, usize> {
    let mut per_hop = BTreeMap::new();
    for r in recs
        .iter()
        .filter(|r| r["type"] == "packet" && qname(r) == Some(name))
    {
        let key = format!(
            "{}/{} {} {}>{} id {} qr {}",
            r["netns"].as_str().unwrap_or("?"),
            r["ifname"].as_str().unwrap_or("?"),
            r["dir"].as_str().unwrap_or("?"),
            r["src"].as_str().unwrap_or("?"),
            r["dst"].as_str().unwrap_or("?"),
            r["dns"]["id"],
            r["dns"]["qr"]
        );
        *per_hop.entry(key).or_default() += 1;
    }
    per_hop
}

/// After a SIGKILLed tracer (`dead_*`) and a new start (`live_*`): every TC filter runs a
/// program of the live tracer, as many as one tracer attaches.
fn check_attached(
    dead_ids: &BTreeSet<u32>,
    dead_filters: &[Filter],
    live_ids: &BTreeSet<u32>,
    filters: &[Filter],
) -> Result<(), String> {
    ensure(!dead_ids.is_empty() && !live_ids.is_empty(), || {
        format!("no BPF program fds in /proc/PID/fdinfo (killed {dead_ids:?}, live {live_ids:?})")
    })?;
    let foreign: Vec<&Filter> = filters
        .iter()
        .filter(|f| f.3.is_none_or(|id| !live_ids.contains(&id)))
        .collect();
    ensure(foreign.is_empty(), || {
        format!(
            "{} TC filters are not the live tracer's (its programs {live_ids:?}): {}",
            foreign.len(),
            filter_list(&foreign)
        )
    })?;
    ensure(filters.len() == dead_filters.len(), || {
        format!(
            "{} TC filters after the restart, {} with one tracer",
            filters.len(),
            dead_filters.len()
        )
    })
}

fn filter_list(filters: &[&Filter]) -> String {
    let mut v: Vec<String> = filters
        .iter()
        .take(4)
        .map(|f| {
            let prog = f.4.split_whitespace().find(|w| w.contains("dnspath"));
            format!(
                "{}/{} {} {} id {}",
                f.0,
                f.1,
                f.2,
                prog.unwrap_or(&f.4),
                f.3.map_or("?".to_owned(), |id| id.to_string())
            )
        })
        .collect();
    if filters.len() > 4 {
        v.push(format!("... {} more", filters.len() - 4));
    }
    v.join(" | ")
}

/// The programs of `ids` still loaded after [`PROG_FREE_WAIT`], except those a leftover TC
/// filter holds (already reported as such).
fn programs_left(ids: &BTreeSet<u32>, filters: &[Filter]) -> Vec<String> {
    let held: BTreeSet<u32> = filters.iter().filter_map(|f| f.3).collect();
    let free: BTreeSet<u32> = ids.difference(&held).copied().collect();
    wait_unloaded(&free, PROG_FREE_WAIT)
        .into_iter()
        .map(prog_name)
        .collect()
}

/// One tracer started (`load`), SIGKILLed, a second started (`restart`), a query through
/// every hop (`path`) and one into an iptables DROP (`drop`), SIGINT (`clean-exit`).
fn run(lab: &Lab, r: &mut Report) {
    let pins_before = bpffs_entries();
    r.step("load: starting the tracer");
    let first = match start(lab) {
        Ok(t) => t,
        Err(e) => return r.check("load", Err(e)),
    };
    let dead_ids = prog_ids(first.pid());
    let dead_filters = tc_filters(lab);
    r.check(
        "load",
        Ok(format!(
            "{} programs, {} clsact filters",
            dead_ids.len(),
            dead_filters.len()
        )),
    );

    r.step("restart: SIGKILL, then a new tracer");
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(first.pid() as libc::pid_t, libc::SIGKILL) };
    let killed = first.wait();
    let live = match start(lab) {
        Ok(t) => t,
        Err(e) => return r.check("restart", Err(format!("start after SIGKILL: {e}"))),
    };
    let live_ids = prog_ids(live.pid());
    let filters = tc_filters(lab);
    let attached = check_attached(&dead_ids, &dead_filters, &live_ids, &filters);

    r.step("path: dig www.lab.test via the ClusterIP");
    let dig = lab.dig(&[DIG_TIME, "+tries=1", "www.lab.test.", "A"]);
    r.step("drop: dig dropped.lab.test against an iptables DROP");
    let ins = lab.pod_dns_drop("-I");
    let _ = lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    let _ = lab.pod_dns_drop("-D");
    thread::sleep(Duration::from_millis(500));
    r.step("stopping the tracer (SIGINT)");
    let out = live.stop();
    match records(&out) {
        Err(e) => {
            r.kernel_info(&killed, &[]);
            r.check("path", Err(e.clone()));
            r.check("restart", attached.and(Err(e)));
        }
        Ok(recs) => {
            r.kernel_info(&out, &recs);
            let path = ensure(dig.status.success(), || {
                format!("dig failed: {}", String::from_utf8_lossy(&dig.stdout))
            })
            .and_then(|()| check_path(lab, &recs, "www.lab.test."));
            r.check("path", path);
            let drop = ensure(ins.status.success(), || format!("iptables -I: {ins:?}"))
                .and_then(|()| check_drop(&recs, "dropped.lab.test.", &r.release));
            r.check("drop", drop);
            let restart = attached.and_then(|()| {
                let left = programs_left(&dead_ids, &[]);
                ensure(left.is_empty(), || {
                    format!("programs of the SIGKILLed tracer still loaded: {left:?}")
                })?;
                let per_hop = captures_per_hop(&recs, "www.lab.test.");
                let twice: Vec<_> = per_hop.iter().filter(|(_, n)| **n > 1).collect();
                ensure(twice.is_empty(), || {
                    format!("captured more than once: {twice:?}")
                })?;
                Ok(format!(
                    "killed tracer's {} programs gone ({} clsact filters replaced); \
                     {} hop captures, each once",
                    dead_ids.len(),
                    dead_filters.len(),
                    per_hop.len()
                ))
            });
            r.check("restart", restart);
        }
    }
    r.step("clean-exit: checking what is left");
    r.check("clean-exit", check_clean(lab, &live_ids, &pins_before));
}

#[test]
fn kernel_matrix() {
    if !lab::tracer::root_or_skip("network namespaces, eBPF") {
        return;
    }
    let mut report = Report {
        release: release(),
        started: Some(Instant::now()),
        ..Report::default()
    };
    report.step("lab: starting");
    let cfg = LabConfig {
        readiness_timeout: Duration::from_secs(90),
        ..LabConfig::default()
    };
    match Lab::start(cfg) {
        Ok(lab) => run(&lab, &mut report),
        Err(e) => report.check("lab", Err(format!("lab did not start: {e}"))),
    }
    report.step("done");
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "kernel {}: {}",
        report.release,
        failures.join("\n")
    );
}

/// The TC programs on crafted frames (`BPF_PROG_TEST_RUN`) run in this binary too, so that
/// every kernel of the VM matrix verifies and exercises them.
#[path = "lab/prog_test_run.rs"]
mod prog_test_run;

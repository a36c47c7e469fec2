//! The golden captures under `tests/golden/` and their expected outputs (issue 25).
//!
//! - `cargo xtask bless`: `dnspath analyze` of every capture, in the four outputs of
//!   `lab::golden::OUTPUTS`, written to the expected files; says which changed.
//! - `cargo xtask captures [NAME...]`: makes the captures again — `hostile.pcap` by hand
//!   (below), the others (root) by `dnspath trace -w` of the real lab doing what each
//!   scenario says — then blesses. Captures differ from run to run (times, ports, ids, the
//!   lab's prefix): the expected files of the ones remade change with them.
use anyhow::anyhow;
use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use lab::{
    golden,
    hole::{Hole, SLOW_ADDR},
    tracer::{is_root, Tracer},
    DnsPodConfig, DnsServerKind, Lab, LabConfig, Pod,
};

use crate::bench::capture::{frame, pcap_writer, write_frame};

/// Rewrites every expected output from the release binary `bin`; prints which changed.
pub fn bless(bin: &Path) -> crate::Result<()> {
    let dir = golden::dir();
    let captures = golden::captures(&dir).map_err(|e| anyhow!("{e}"))?;
    let (mut changed, mut same) = (Vec::new(), 0);
    for capture in &captures {
        for (output, flags) in golden::OUTPUTS {
            let path = golden::expected(capture, output);
            let actual = golden::run(bin, capture, flags).map_err(|e| anyhow!("{e}"))?;
            let old = fs::read(&path).ok();
            if old.as_deref() == Some(actual.as_slice()) {
                same += 1;
                continue;
            }
            fs::write(&path, &actual).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let name = file_name(&path);
            match old {
                None => changed.push(format!("{name} (new)")),
                Some(old) => {
                    let lines = |b: &[u8]| b.split(|&c| c == b'\n').count();
                    changed.push(format!(
                        "{name} ({} → {} lines)",
                        lines(&old),
                        lines(&actual)
                    ));
                }
            }
        }
    }
    for entry in fs::read_dir(&dir).map_err(|e| anyhow!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| anyhow!("{e}"))?.path();
        let ours = captures.iter().any(|c| {
            golden::OUTPUTS
                .iter()
                .any(|(o, _)| golden::expected(c, o) == path)
        });
        if path.extension().is_some_and(|e| e == "out") && !ours {
            eprintln!(
                "xtask: bless: {} is the output of no capture: remove it",
                path.display()
            );
        }
    }
    eprintln!(
        "xtask: bless: {} captures, {} outputs unchanged, {} changed{}",
        captures.len(),
        same,
        changed.len(),
        if changed.is_empty() { "" } else { ":" }
    );
    for c in &changed {
        eprintln!("  {c}");
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The lab's scenarios, by capture name.
const LAB_SCENARIOS: [&str; 6] = ["lab", "tcp", "drops", "loop", "late", "fragments"];

/// Makes the captures named in `only` (all when empty) again, then blesses.
pub fn captures(bin: &Path, only: &[String]) -> crate::Result<()> {
    let dir = golden::dir();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    if wanted("hostile") {
        write_hostile(&dir.join("hostile.pcap"))?;
        eprintln!("xtask: captures: hostile.pcap written");
    }
    let lab_ones: Vec<&str> = LAB_SCENARIOS.into_iter().filter(|n| wanted(n)).collect();
    if !lab_ones.is_empty() {
        if !is_root() {
            return Err(anyhow!(
                "captures {lab_ones:?} are made in the lab, which needs root"
            ));
        }
        // SAFETY: setting a variable before any thread is started.
        unsafe { std::env::set_var("DNSPATH_BIN", bin) };
        for name in lab_ones {
            // A fresh lab for each: one scenario's leftovers (a loop's last packets, a
            // reconfigured pod) stay out of the next one's capture.
            let mut lab = Lab::start(LabConfig::default()).map_err(|e| anyhow!("lab: {e}"))?;
            let out = dir.join(format!("{name}.pcapng"));
            scenario(&mut lab, name, &out)?;
            let size = fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
            eprintln!("xtask: captures: {name}.pcapng written ({size} bytes)");
        }
    }
    bless(bin)
}

fn dig(lab: &Lab, args: &[&str]) {
    let o = lab.dig(args);
    eprintln!(
        "xtask: captures: dig {} → {}",
        args.join(" "),
        if o.status.success() {
            "answered"
        } else {
            "failed"
        }
    );
}

/// Runs scenario `name` in `lab` under `dnspath trace -w`, the capture going to `out`.
fn scenario(lab: &mut Lab, name: &str, out: &Path) -> crate::Result<()> {
    let tmp: PathBuf = lab.temp_dir().join(format!("{name}.pcapng"));
    let file = tmp.to_string_lossy().into_owned();
    let mut hole = None;
    let mut server = None;
    let mut extra_ns: Vec<String> = Vec::new();
    let mut extra_args: Vec<&str> = Vec::new();
    // What must exist before the tracer attaches.
    match name {
        "late" => {
            let h = Hole::slow(lab, Duration::from_millis(1600), 1).map_err(|e| anyhow!("{e}"))?;
            extra_ns.push(h.ns().to_string());
            hole = Some(h);
        }
        "fragments" => {
            server = Some(frag_server(lab)?);
            extra_args.extend(["--port", "5353"]);
        }
        _ => {}
    }
    let mut args = vec![
        "trace",
        "-o",
        "json",
        "--timeout",
        "2",
        "--snaplen",
        "4096",
        "-w",
    ];
    args.push(&file);
    args.extend(extra_args);
    let namespaces: Vec<String> = lab
        .namespaces()
        .into_iter()
        .skip(1)
        .map(str::to_string)
        .chain(extra_ns)
        .collect();
    for ns in &namespaces {
        args.extend(["--netns", ns.as_str()]);
    }
    let tracer = Tracer::start(lab, lab.node_ns(), &args).map_err(|e| anyhow!("dnspath: {e}"))?;
    match name {
        // Through the ClusterIP's DNAT to a "CoreDNS" pod and its upstream: A, AAAA, NXDOMAIN,
        // and AAAA over IPv6 straight to the upstream.
        "lab" => {
            dig(lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
            dig(lab, &["+time=2", "+tries=1", "www.lab.test.", "AAAA"]);
            dig(lab, &["+time=2", "+tries=1", "nope.lab.test.", "A"]);
            let up6 = format!("@{}", lab.ip6_of(Pod::Upstream));
            dig(lab, &["+time=2", "+tries=1", &up6, "www.lab.test.", "AAAA"]);
        }
        // A ~3 KB TXT answer over TCP through the ClusterIP.
        "tcp" => dig(
            lab,
            &["+tcp", "+time=2", "+tries=1", "big.lab.test.", "TXT"],
        ),
        // Kernel drops: the node's FORWARD rule drops queries to the pods (NETFILTER_DROP, the
        // ClusterIP from conntrack); a rule in the client's namespace drops an answer.
        "drops" => {
            run_ok(lab.pod_dns_drop("-I"))?;
            dig(lab, &["+time=1", "+tries=2", "dropped.lab.test.", "A"]);
            run_ok(lab.pod_dns_drop("-D"))?;
            let rule = ["INPUT", "-p", "udp", "--sport", "53", "-j", "DROP"];
            run_ok(lab.iptables_rule(lab.client_ns(), "-I", &rule))?;
            dig(lab, &["+time=1", "+tries=1", "www.lab.test.", "A"]);
            run_ok(lab.iptables_rule(lab.client_ns(), "-D", &rule))?;
        }
        // Both "CoreDNS" pods forward to their own Service: a forwarding loop, for a second
        // (cut to its first 300 packets, below).
        "loop" => {
            let to_service = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
            for i in 0..lab.dns_pod_count() {
                lab.reconfigure_dns_pod(i, to_service.clone())
                    .map_err(|e| anyhow!("lab: {e}"))?;
            }
            dig(lab, &["+time=1", "+tries=1", "loop.lab.test.", "A"]);
            let healthy = DnsPodConfig::new(DnsServerKind::Dnsdist);
            for i in 0..lab.dns_pod_count() {
                lab.reconfigure_dns_pod(i, healthy.clone())
                    .map_err(|e| anyhow!("lab: {e}"))?;
            }
        }
        // A server answering after 1.6 s: dig (1 s) has given up, the answer is late and
        // dropped at the client (no socket); a patient dig gets its answer.
        "late" => {
            let at = format!("@{SLOW_ADDR}");
            dig(lab, &["+time=1", "+tries=1", &at, "late.lab.test.", "A"]);
            dig(lab, &["+time=3", "+tries=1", &at, "patient.lab.test.", "A"]);
        }
        // A ~3.5 KB answer over UDP (EDNS 4096) from a pod whose MTU is 1280: three IP
        // fragments, over IPv4 and IPv6.
        "fragments" => {
            for server in [
                lab.ip_of(Pod::Upstream).to_string(),
                lab.ip6_of(Pod::Upstream).to_string(),
            ] {
                let at = format!("@{server}");
                dig(
                    lab,
                    &[
                        "+bufsize=4096",
                        "+notcp",
                        "+ignore",
                        "+time=2",
                        "+tries=1",
                        "-p",
                        "5353",
                        &at,
                        FRAG_NAME,
                        "TXT",
                    ],
                );
            }
        }
        other => return Err(anyhow!("no lab scenario {other:?}")),
    }
    // Let the last transactions be decided (the timeout is 2 s) before stopping.
    thread::sleep(Duration::from_millis(3000));
    let done = tracer.stop();
    if !done.status.success() {
        return Err(anyhow!(
            "dnspath exited with {}:\n{}",
            done.status,
            done.stderr
        ));
    }
    if let Some(mut s) = server {
        let _ = s.kill();
        let _ = s.wait();
    }
    drop(hole);
    if name == "loop" {
        cut_loop(&tmp, out)?;
    } else {
        fs::copy(&tmp, out).map_err(|e| anyhow!("{} → {}: {e}", tmp.display(), out.display()))?;
    }
    fs::set_permissions(out, fs::Permissions::from_mode(0o644))
        .map_err(|e| anyhow!("{}: {e}", out.display()))?;
    if name == "fragments" {
        fs::write(out.with_file_name("fragments.args"), "--port\n5353\n")
            .map_err(|e| anyhow!("fragments.args: {e}"))?;
    }
    Ok(())
}

/// Copies the loop's capture `from` to `to` without the thousands of packets (MBs) of the
/// loop's own hops: the first 300 packets (the loop found and going round) and every packet
/// of the other interfaces (the client, the other pod, the drops, the lab's probes after the
/// fix) are kept. The loop's interfaces are those with more than 200 packets.
fn cut_loop(from: &Path, to: &Path) -> crate::Result<()> {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(from)
        .args(["-T", "fields", "-e", "frame.interface_name"])
        .output()
        .map_err(|e| anyhow!("tshark: {e}"))?;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        *counts.entry(l.to_string()).or_default() += 1;
    }
    let busy: Vec<String> = counts
        .into_iter()
        .filter(|(_, n)| *n > 200)
        .map(|(i, _)| format!("frame.interface_name == \"{i}\""))
        .collect();
    let filter = if busy.is_empty() {
        "frame".to_string()
    } else {
        format!("frame.number <= 300 || !({})", busy.join(" || "))
    };
    run_ok(
        Command::new("tshark")
            .arg("-r")
            .arg(from)
            .args(["-Y", &filter, "-F", "pcapng", "-w"])
            .arg(to)
            .output()
            .map_err(|e| anyhow!("tshark: {e}"))?,
    )
}

fn run_ok(o: std::process::Output) -> crate::Result<()> {
    if o.status.success() {
        Ok(())
    } else {
        Err(anyhow!("{}", String::from_utf8_lossy(&o.stderr).trim()))
    }
}

const FRAG_NAME: &str = "big.frag.test.";

/// dnsmasq on port 5353 in the upstream pod answering [`FRAG_NAME`] TXT with 16 strings of
/// 200 bytes, the pod's MTU 1280 (as tests/tests/lab/fragments.rs does).
fn frag_server(lab: &Lab) -> crate::Result<std::process::Child> {
    let up = lab.upstream_ns();
    run_ok(lab.exec(up, &["ip", "link", "set", "dev", "eth0", "mtu", "1280"]))?;
    let mut args = vec![
        "/usr/sbin/dnsmasq".to_string(),
        "-k".into(),
        "-C".into(),
        "/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--user=root".into(),
        "--log-facility=-".into(),
        format!(
            "--pid-file={}",
            lab.temp_dir().join("frag-dnsmasq.pid").display()
        ),
        "--port=5353".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={}", lab.ip_of(Pod::Upstream)),
        format!("--listen-address={}", lab.ip6_of(Pod::Upstream)),
        "--edns-packet-max=4096".into(),
    ];
    for i in 0..16 {
        args.push(format!(
            "--txt-record={},\"{i:02}{}\"",
            FRAG_NAME.trim_end_matches('.'),
            "f".repeat(198)
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = lab.spawn_in(up, &args).map_err(|e| anyhow!("{e}"))?;
    let at = format!("@{}", lab.ip_of(Pod::Upstream));
    for _ in 0..100 {
        let o = lab.exec(
            up,
            &[
                "dig", "+short", "+time=1", "+tries=1", "-p", "5353", &at, FRAG_NAME, "TXT",
            ],
        );
        if o.status.success() && !o.stdout.is_empty() {
            return Ok(server);
        }
        thread::sleep(Duration::from_millis(100));
    }
    Err(anyhow!("dnsmasq on port 5353 did not answer"))
}

// --- hostile.pcap: crafted messages no real server sends ---

fn header(id: u16, flags: u16, counts: [u16; 4]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&flags.to_be_bytes());
    for c in counts {
        m.extend_from_slice(&c.to_be_bytes());
    }
    m
}

/// Uncompressed wire form of `labels` (each given as raw bytes), root-terminated.
fn name(labels: &[&[u8]]) -> Vec<u8> {
    let mut n = Vec::new();
    for l in labels {
        n.push(l.len() as u8);
        n.extend_from_slice(l);
    }
    n.push(0);
    n
}

fn question(m: &mut Vec<u8>, qname: &[u8], qtype: u16) {
    m.extend_from_slice(qname);
    m.extend_from_slice(&qtype.to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes());
}

/// A resource record of class IN, TTL 60, owner `owner` (wire bytes, maybe a pointer).
fn rr(m: &mut Vec<u8>, owner: &[u8], rtype: u16, rdata: &[u8]) {
    m.extend_from_slice(owner);
    m.extend_from_slice(&rtype.to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes());
    m.extend_from_slice(&60u32.to_be_bytes());
    m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    m.extend_from_slice(rdata);
}

const A: u16 = 1;
const CNAME: u16 = 5;
const TXT: u16 = 16;
const QUERY: u16 = 0x0100; // RD
const ANSWER: u16 = 0x8180; // QR RD RA, NOERROR
/// Pointer to the question's name (offset 12).
const TO_QNAME: [u8; 2] = [0xc0, 12];

/// Query and answer pairs (and strays) whose names and records are hostile: escapes, control
/// and terminal bytes, bad compression pointers, cut messages.
fn hostile_messages() -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut v = Vec::new();
    // 1. Labels with a dot, a backslash, quotes, a space, `;`, NUL, 0xff, a newline and an
    //    ANSI escape: every one must come out escaped, on one line. Answered by a CNAME
    //    through a pointer to the question, and an A record behind a pointer to the CNAME's
    //    target.
    let qname = name(&[
        b"a.b",
        b"back\\slash",
        b"\"q\" ;x",
        b"\x00\xff",
        b"nl\nx\x1b[31m",
        b"lab",
        b"test",
    ]);
    let mut q = header(0x1001, QUERY, [1, 0, 0, 0]);
    question(&mut q, &qname, A);
    let mut a = header(0x1001, ANSWER, [1, 2, 0, 0]);
    question(&mut a, &qname, A);
    let target_at = (a.len() + 2 + 10) as u8; // after the CNAME's owner pointer and fixed part
    let mut target = name(&[b"t\x7f"]);
    target.truncate(target.len() - 1);
    target.extend_from_slice(&TO_QNAME); // "t\x7f" + the question's name
    rr(&mut a, &TO_QNAME, CNAME, &target);
    rr(&mut a, &[0xc0, target_at], A, &[10, 0, 0, 1]);
    v.push((q, Some(a)));
    // 2. A compression pointer to itself in the answer's owner: a loop.
    let qname = name(&[b"ptr-loop", b"lab", b"test"]);
    let mut q = header(0x1002, QUERY, [1, 0, 0, 0]);
    question(&mut q, &qname, A);
    let mut a = header(0x1002, ANSWER, [1, 1, 0, 0]);
    question(&mut a, &qname, A);
    let at = a.len() as u8;
    rr(&mut a, &[0xc0, at], A, &[10, 0, 0, 2]);
    v.push((q, Some(a)));
    // 3. A pointer forward, past the end of the message.
    let qname = name(&[b"ptr-out", b"lab", b"test"]);
    let mut q = header(0x1003, QUERY, [1, 0, 0, 0]);
    question(&mut q, &qname, A);
    let mut a = header(0x1003, ANSWER, [1, 1, 0, 0]);
    question(&mut a, &qname, A);
    rr(&mut a, &[0xc1, 0xff], A, &[10, 0, 0, 3]);
    v.push((q, Some(a)));
    // 4. Two pointers to each other in the question itself.
    let mut q = header(0x1004, QUERY, [1, 0, 0, 0]);
    q.extend_from_slice(&[1, b'x', 0xc0, 16, 1, b'y', 0xc0, 12]);
    q.extend_from_slice(&A.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    v.push((q, None));
    // 5. A name over 255 bytes made of pointers to a 63-byte label chain.
    let long: Vec<u8> = vec![b'l'; 63];
    let qname = name(&[&long, &long, &long, b"lab", b"test"]);
    let mut q = header(0x1005, QUERY, [1, 0, 0, 0]);
    question(&mut q, &qname, A);
    let mut a = header(0x1005, ANSWER, [1, 1, 0, 0]);
    question(&mut a, &qname, A);
    let mut owner = vec![63];
    owner.extend_from_slice(&long);
    owner.extend_from_slice(&TO_QNAME); // 64 + 63*3 + 9 + 1 > 255
    rr(&mut a, &owner, A, &[10, 0, 0, 5]);
    v.push((q, Some(a)));
    // 6. A reserved label type (0x40) in the question.
    let mut q = header(0x1006, QUERY, [1, 0, 0, 0]);
    q.extend_from_slice(&[0x41, b'z', 0]);
    q.extend_from_slice(&A.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    v.push((q, None));
    // 7. An answer that says it has two records and holds one, then stops mid-record.
    let qname = name(&[b"cut", b"lab", b"test"]);
    let mut q = header(0x1007, QUERY, [1, 0, 0, 0]);
    question(&mut q, &qname, A);
    let mut a = header(0x1007, ANSWER, [1, 2, 0, 0]);
    question(&mut a, &qname, A);
    rr(&mut a, &TO_QNAME, A, &[10, 0, 0, 7]);
    a.extend_from_slice(&TO_QNAME);
    a.extend_from_slice(&A.to_be_bytes());
    v.push((q, Some(a)));
    // 8. TXT strings of control bytes, quotes, backslashes and UTF-8 (and invalid UTF-8).
    let qname = name(&[b"txt", b"lab", b"test"]);
    let mut q = header(0x1008, QUERY, [1, 0, 0, 0]);
    question(&mut q, &qname, TXT);
    let mut a = header(0x1008, ANSWER, [1, 1, 0, 0]);
    question(&mut a, &qname, TXT);
    let mut txt = Vec::new();
    for s in [
        &b"say \"hi\"\\ \x1b]0;title\x07"[..],
        "caf\u{e9} \u{1f600}".as_bytes(),
        b"\xc3\x28\r\n\t\x00",
    ] {
        txt.push(s.len() as u8);
        txt.extend_from_slice(s);
    }
    rr(&mut a, &TO_QNAME, TXT, &txt);
    v.push((q, Some(a)));
    // 9. A stray answer no query asked, with a header only.
    v.push((header(0x1009, ANSWER, [0, 0, 0, 0]), None));
    v
}

/// Writes `hostile.pcap`: each query from 10.244.1.2 to 10.96.0.10:53 and its answer 1 ms
/// later, a pair every 10 ms from 2026-01-01T00:00:00Z.
fn write_hostile(path: &Path) -> crate::Result<()> {
    let mut w = pcap_writer(path)?;
    let io = |e: pcap_file::PcapError| anyhow!("{}: {e}", path.display());
    let client = [10, 244, 1, 2];
    let server = ([10, 96, 0, 10], 53);
    let mut t_us: u64 = 1_767_225_600_000_000;
    for (i, (q, a)) in hostile_messages().into_iter().enumerate() {
        let port = 40_000 + i as u16;
        write_frame(&mut w, t_us, &frame((client, port), server, i as u16, &q)).map_err(io)?;
        if let Some(a) = a {
            write_frame(
                &mut w,
                t_us + 1_000,
                &frame(server, (client, port), i as u16, &a),
            )
            .map_err(io)?;
        }
        t_us += 10_000;
    }
    w.into_writer()
        .into_inner()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(())
}

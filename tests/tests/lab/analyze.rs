//! `dnspath analyze` on real captures of lab traffic: tcpdump on `any` (Linux cooked SLL and
//! SLL2) and on one veth (Ethernet), pcapng from editcap and from a live tshark, a file cut
//! mid-packet, and files that are not captures at all.
//! Run as root with `--test-threads=1` (`cargo xtask test`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    thread,
    time::{Duration, Instant},
};

use lab::{
    tracer::{dnspath_bin, ndjson},
    watch::{read_all, Watched},
    Lab, Pod,
};
use serde_json::Value;

use crate::shared::{dig_ok, lab_with_tools as lab};

/// A directory of this test's files, removed on drop (also when the test panics).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("dnspath-analyze-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A capture tool running in a lab namespace.
struct Capture(Watched<String>);

impl Capture {
    /// Starts `args` in `ns` and waits until it prints a line containing `ready`.
    fn start(lab: &Lab, ns: &str, args: &[&str], ready: &str) -> Capture {
        let child = lab.spawn_in(ns, args).unwrap();
        let mut run = Watched::new(child, format!("{args:?}"), read_all);
        if let Err(e) = run.wait_for_stderr(ready, Duration::from_secs(20)) {
            run.signal(libc::SIGKILL);
            panic!("{e}");
        }
        // tshark says so as dumpcap starts, a moment before its socket is up.
        thread::sleep(Duration::from_millis(500));
        Capture(run)
    }

    /// SIGINT (the tools flush and close the file on it), then waits for the exit.
    fn stop(self) -> String {
        // Let the last packets reach the capture file: on SIGINT tcpdump stops reading its
        // socket, so what it has not read yet (a busy machine) would be lost.
        thread::sleep(Duration::from_millis(1500));
        self.0.signal(libc::SIGINT);
        let done = self.0.finish_draining(Duration::from_secs(2));
        let status = done.status.unwrap();
        let log = done.stderr;
        assert!(status.success(), "capture exited with {status}: {log}");
        log
    }
}

fn tcpdump(lab: &Lab, ns: &str, iface: &str, file: &Path, extra: &[&str]) -> Capture {
    let file = file.to_string_lossy().into_owned();
    // --immediate-mode: hand each packet over at once (TPACKET_V3 otherwise holds them in
    // blocks for up to a second, and SIGINT discards those); -U: write each packet out at
    // once; -Z root: keep the permission to write the file.
    // -s 4096: in immediate mode libpcap uses TPACKET_V2, whose ring holds only 8 frames of
    // the default 256 KiB snaplen, and a DNS-over-TCP exchange overflows it ("N packets
    // dropped by kernel"); 4096 bytes holds every packet of this lab whole.
    let mut args = vec![
        "tcpdump",
        "--immediate-mode",
        "-U",
        "-s",
        "4096",
        "-n",
        "-Z",
        "root",
        "-i",
        iface,
        "-w",
        file.as_str(),
    ];
    args.extend_from_slice(extra);
    Capture::start(lab, ns, &args, "listening on")
}

struct Analysis {
    out: Output,
    recs: Vec<Value>,
    stderr: String,
}

fn analyze(file: &Path, extra: &[&str]) -> Analysis {
    let out = Command::new(dnspath_bin())
        .arg("analyze")
        .arg(file)
        .args(["-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let recs = ndjson(&String::from_utf8_lossy(&out.stdout));
    Analysis { out, recs, stderr }
}

fn analyze_ok(file: &Path) -> Analysis {
    let a = analyze(file, &[]);
    assert!(
        a.out.status.success(),
        "dnspath analyze failed: {:?}\n{}",
        a.out.status,
        a.stderr
    );
    assert!(!a.stderr.contains("warning"), "{}", a.stderr);
    a
}

fn stats(recs: &[Value]) -> &Value {
    let last = recs.last().unwrap_or_else(|| panic!("no output"));
    assert_eq!(last["type"], "stats", "the stats record comes last: {last}");
    last
}

fn packets(recs: &[Value]) -> Vec<&Value> {
    recs.iter().filter(|r| r["type"] == "packet").collect()
}

/// `dig www.lab.test` over UDP and TCP, via the ClusterIP.
fn queries(lab: &Lab) {
    dig_ok(lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    dig_ok(lab, &["+tcp", "+time=2", "+tries=1", "www.lab.test.", "A"]);
}

/// The client's query to the ClusterIP over `proto` and the answer back to it (un-DNAT'd,
/// with 10.250.0.80), as seen on the client's veth. Returns them.
fn query_and_answer<'a>(lab: &Lab, recs: &'a [Value], proto: &str) -> (&'a Value, &'a Value) {
    let client = format!("{}:", lab.ip_of(Pod::Client));
    let service = format!("{}:53", lab.cluster_ip());
    let all = packets(recs);
    let q = all
        .iter()
        .find(|r| {
            r["proto"] == proto
                && r["dns"]["qr"] == false
                && r["dst"] == service.as_str()
                && r["src"].as_str().is_some_and(|s| s.starts_with(&client))
                && r["dns"]["questions"][0]["name"] == "www.lab.test."
                && r["dns"]["questions"][0]["type"] == "A"
        })
        .unwrap_or_else(|| {
            panic!(
                "{proto} query from {client} to {service} not found in\n{}",
                brief(&all)
            )
        });
    let a = all
        .iter()
        .find(|r| {
            r["proto"] == proto
                && r["dns"]["qr"] == true
                && r["src"] == service.as_str()
                && r["dst"] == q["src"]
                && r["dns"]["id"] == q["dns"]["id"]
                && r["dns"]["answers"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|rr| rr["type"] == "A" && rr["data"] == "10.250.0.80")
                })
        })
        .unwrap_or_else(|| {
            panic!(
                "{proto} answer 10.250.0.80 to {} not found in\n{}",
                q["src"],
                brief(&all)
            )
        });
    (q, a)
}

/// One line per packet record, for failure messages.
fn brief(recs: &[&Value]) -> String {
    recs.iter()
        .map(|r| {
            format!(
                "{}/{}({}) {} {} {} > {} id {} qr {} {} {}",
                r["netns"],
                r["ifname"],
                r["ifindex"],
                r["dir"],
                r["proto"],
                r["src"],
                r["dst"],
                r["dns"]["id"],
                r["dns"]["qr"],
                r["dns"]["questions"][0]["name"],
                r["dns"]["answers"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The correlate stage runs offline too: the client's question becomes one transaction, its
/// query leg through the DNAT (joined without conntrack) and the CoreDNS pod's forward to the
/// upstream under it.
fn assert_transaction(lab: &Lab, recs: &[Value], proto: &str) {
    let client = format!("{}:", lab.ip_of(Pod::Client));
    let txs: Vec<&Value> = recs.iter().filter(|r| r["type"] == "transaction").collect();
    let t = txs
        .iter()
        .find(|t| {
            t["question"]["name"] == "www.lab.test."
                && t["client"].as_str().is_some_and(|c| c.starts_with(&client))
                && t["legs"][0]["proto"] == proto
        })
        .unwrap_or_else(|| panic!("no {proto} transaction of {client}: {txs:#?}"));
    assert_eq!(t["outcome"], "answered", "{t}");
    assert_eq!(t["answers"][0], "A 10.250.0.80", "{t}");
    let legs = t["legs"].as_array().unwrap();
    assert_eq!(legs[0]["server"], format!("{}:53", lab.cluster_ip()), "{t}");
    let up = format!("{}:53", lab.ip_of(Pod::Upstream));
    assert!(
        legs.iter()
            .any(|l| l["role"] == "forward" && l["parent"] == 0 && l["server"] == up.as_str()),
        "the forward to the upstream under the client's leg: {t}"
    );
}

fn ifindex(lab: &Lab, ns: &str, dev: &str) -> u64 {
    let o = lab.exec(ns, &["cat", &format!("/sys/class/net/{dev}/ifindex")]);
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// Start of each packet record of a pcap file (24-byte header, 16-byte record headers).
fn pcap_records(bytes: &[u8]) -> Vec<(usize, usize)> {
    assert_eq!(
        &bytes[..4],
        &0xa1b2_c3d4u32.to_le_bytes(),
        "little-endian µs pcap expected"
    );
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push((at, 16 + incl));
        at += 16 + incl;
    }
    assert_eq!(at, bytes.len(), "capture not flushed whole");
    out
}

#[test]
fn cooked_captures_of_the_any_interface() {
    let Some(lab) = lab(&["tcpdump"]) else { return };
    let dir = Scratch::new("any");
    let sll = dir.file("any-sll.pcap");
    let sll2 = dir.file("any-sll2.pcap");
    let plain = dir.file("any.pcap");
    let node = lab.node_ns();
    // One capture at a time: three tcpdumps on `any` at once lose packets here ("dropped by
    // kernel"), which is tcpdump's trouble, not what this test is about.
    for (file, extra) in [
        (&sll, &["-y", "LINUX_SLL", "port", "53"][..]),
        (&sll2, &["-y", "LINUX_SLL2", "port", "53"][..]),
        // What a user gets without choosing.
        (&plain, &["port", "53"][..]),
    ] {
        let c = tcpdump(&lab, node, "any", file, extra);
        queries(&lab);
        let log = c.stop();
        assert!(
            log.lines()
                .any(|l| l.trim() == "0 packets dropped by kernel"),
            "tcpdump lost packets: {log}"
        );
    }

    let veth = ifindex(&lab, node, lab.veth_of(Pod::Client));
    for (file, has_ifindex) in [(&sll, false), (&sll2, true), (&plain, false)] {
        let a = analyze_ok(file);
        for proto in ["udp", "tcp"] {
            let (q, ans) = query_and_answer(&lab, &a.recs, proto);
            // On `any`, the cooked header says whether the node sent or received it.
            assert_eq!(q["dir"], "ingress", "{q}");
            assert_eq!(ans["dir"], "egress", "{ans}");
            let stem = file.file_stem().unwrap().to_str().unwrap();
            assert_eq!(q["netns"], stem, "{q}");
            assert!(q["cpu"].is_null(), "{q}");
            if has_ifindex {
                assert_eq!(q["ifindex"], veth, "SLL2 names the interface: {q}");
                assert_eq!(ans["ifindex"], veth, "{ans}");
            }
        }
        for proto in ["udp", "tcp"] {
            assert_transaction(&lab, &a.recs, proto);
        }
        let s = stats(&a.recs);
        assert_eq!(s["malformed"], 0, "{s}");
        assert!(s["decoded"].as_u64().unwrap() >= 8, "{s}");
        assert!(a.stderr.contains("0 skipped"), "{}", a.stderr);
    }
}

#[test]
fn ethernet_capture_of_one_veth() {
    let Some(lab) = lab(&["tcpdump"]) else { return };
    let dir = Scratch::new("eth");
    let file = dir.file("client-veth.pcap");
    let cap = tcpdump(&lab, lab.node_ns(), lab.veth_of(Pod::Client), &file, &[]);
    queries(&lab);
    // Something that is not DNS, to be skipped and counted.
    let up = lab.ip_of(Pod::Upstream);
    let o = lab.exec(
        lab.client_ns(),
        &["bash", "-c", &format!("printf x > /dev/udp/{up}/9")],
    );
    assert!(o.status.success(), "{o:?}");
    cap.stop();

    let a = analyze(&file, &[]);
    assert!(a.out.status.success(), "{}", a.stderr);
    for proto in ["udp", "tcp"] {
        let (q, ans) = query_and_answer(&lab, &a.recs, proto);
        // A pcap of one interface does not say which way a packet went.
        assert_eq!(q["dir"], "unknown", "{q}");
        assert_eq!(ans["ifname"], "if0", "{ans}");
    }
    assert!(a.stderr.contains("1 on other ports"), "{}", a.stderr);
    // With that port included, the datagram is decoded (and is no DNS message).
    let all = analyze(&file, &["--port", "53", "--port", "9"]);
    assert!(all.out.status.success(), "{}", all.stderr);
    assert_eq!(
        stats(&all.recs)["malformed"].as_u64().unwrap(),
        stats(&a.recs)["malformed"].as_u64().unwrap() + 1,
        "{}",
        all.stderr
    );
}

#[test]
fn pcapng_from_editcap_and_from_tshark() {
    let Some(lab) = lab(&["tcpdump", "tshark", "editcap"]) else {
        return;
    };
    let dir = Scratch::new("ng");
    let pcap = dir.file("sll2.pcap");
    let converted = dir.file("converted.pcapng");
    let live = dir.file("live.pcapng");
    let node = lab.node_ns();
    let veth = lab.veth_of(Pod::Client);
    let live_s = live.to_string_lossy().into_owned();
    let caps = [
        tcpdump(
            &lab,
            node,
            "any",
            &pcap,
            &["-y", "LINUX_SLL2", "port", "53"],
        ),
        Capture::start(
            &lab,
            node,
            &[
                "tshark",
                "-n",
                "-i",
                veth,
                "-F",
                "pcapng",
                "-w",
                live_s.as_str(),
            ],
            "Capturing on",
        ),
    ];
    queries(&lab);
    for c in caps {
        c.stop();
    }
    let o = Command::new("editcap")
        .args(["-F", "pcapng"])
        .arg(&pcap)
        .arg(&converted)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "editcap: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let a = analyze_ok(&converted);
    assert!(a.stderr.contains("(pcapng)"), "{}", a.stderr);
    for proto in ["udp", "tcp"] {
        let (q, ans) = query_and_answer(&lab, &a.recs, proto);
        assert_eq!(
            (&q["dir"], &ans["dir"]),
            (&Value::from("ingress"), &Value::from("egress"))
        );
    }
    let from_pcap = analyze_ok(&pcap);
    assert_eq!(
        packets(&a.recs).len(),
        packets(&from_pcap.recs).len(),
        "the same packets as pcap and as pcapng"
    );

    // dumpcap names the interface in its interface description block.
    let b = analyze_ok(&live);
    for proto in ["udp", "tcp"] {
        let (q, _) = query_and_answer(&lab, &b.recs, proto);
        assert_eq!(q["ifname"], veth, "{q}");
        assert_eq!(q["netns"], "live", "{q}");
    }
}

#[test]
fn truncated_capture_keeps_the_packets_before_the_cut() {
    let Some(lab) = lab(&["tcpdump"]) else { return };
    let dir = Scratch::new("cut");
    let file = dir.file("full.pcap");
    let cap = tcpdump(
        &lab,
        lab.node_ns(),
        "any",
        &file,
        &["-y", "LINUX_SLL", "port", "53"],
    );
    queries(&lab);
    cap.stop();
    let full = analyze_ok(&file);

    let bytes = std::fs::read(&file).unwrap();
    let records = pcap_records(&bytes);
    let &(last_at, last_len) = records.last().unwrap();
    let cut_file = dir.file("cut.pcap");
    std::fs::write(&cut_file, &bytes[..last_at + last_len / 2]).unwrap();
    let cut = analyze(&cut_file, &[]);
    assert!(
        cut.out.status.success(),
        "damage part-way is a warning, not a failure: {}",
        cut.stderr
    );
    let warning = cut
        .stderr
        .lines()
        .find(|l| l.contains("warning"))
        .unwrap_or_else(|| panic!("no warning: {}", cut.stderr));
    assert!(
        warning.contains(&format!("truncated at byte offset {last_at}")),
        "{warning}"
    );
    assert!(
        warning.contains(&format!("packet record {}", records.len())),
        "{warning}"
    );
    assert_eq!(
        stats(&cut.recs)["packets"].as_u64().unwrap(),
        stats(&full.recs)["packets"].as_u64().unwrap() - 1,
        "every packet before the cut is decoded"
    );
    // The same records, in order (but for the namespace, named after the file).
    let without_netns = |recs: &[Value]| -> Vec<Value> {
        packets(recs)
            .into_iter()
            .map(|r| {
                let mut r = r.clone();
                r["netns"] = Value::Null;
                r
            })
            .collect()
    };
    let (before, all) = (without_netns(&cut.recs), without_netns(&full.recs));
    assert!(before.len() >= all.len() - 1 && !before.is_empty());
    assert_eq!(before[..], all[..before.len()]);
    // Still something to work with: the UDP exchange came first.
    query_and_answer(&lab, &cut.recs, "udp");

    // A cut inside the 16-byte record header is reported the same way.
    std::fs::write(&cut_file, &bytes[..last_at + 7]).unwrap();
    let cut = analyze(&cut_file, &[]);
    assert!(cut.out.status.success());
    assert!(
        cut.stderr
            .contains(&format!("truncated at byte offset {last_at}")),
        "{}",
        cut.stderr
    );
}

#[test]
fn files_that_are_not_captures_are_clear_errors() {
    if !dnspath_bin().exists() {
        eprintln!(
            "skipped: dnspath binary missing at {}; run `cargo xtask test`",
            dnspath_bin().display()
        );
        return;
    }
    let dir = Scratch::new("bad");
    let one_line_error = |file: &Path, want: &str| {
        let a = analyze(file, &[]);
        assert!(!a.out.status.success(), "{} should fail", file.display());
        assert_eq!(
            a.stderr.trim().lines().count(),
            1,
            "one-line error expected: {}",
            a.stderr
        );
        assert!(a.stderr.contains(want), "{}", a.stderr);
        assert!(a.out.stdout.is_empty());
    };
    let garbage = dir.file("garbage.pcap");
    std::fs::write(&garbage, b"GET / HTTP/1.1\r\nHost: example\r\n\r\n").unwrap();
    one_line_error(
        &garbage,
        "not a pcap or pcapng file (it starts with 47 45 54 20",
    );
    let empty = dir.file("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    one_line_error(&empty, "not a pcap or pcapng file (the file is empty)");
    let short = dir.file("short.pcap");
    std::fs::write(&short, 0xa1b2_c3d4u32.to_le_bytes()).unwrap();
    one_line_error(&short, "pcap file header unreadable: 4 of 24 bytes present");
    one_line_error(&dir.file("missing.pcap"), "No such file or directory");

    // A header and no packets is an empty capture, not an error.
    let header = ethernet_pcap(262_144, []);
    let no_packets = dir.file("no-packets.pcap");
    std::fs::write(&no_packets, &header).unwrap();
    let a = analyze(&no_packets, &[]);
    assert!(a.out.status.success(), "{}", a.stderr);
    assert_eq!(stats(&a.recs)["packets"], 0);
}

/// The transactions of `tcpdump -i any` analysed offline are those dnspath traced live from
/// the same traffic: same client, question, outcome, servers and legs; joined across DNAT by
/// the fallback method offline, by conntrack live.
/// What a person compares of transactions: who asked what, what came back, through which
/// servers; sorted.
fn transactions(recs: &[Value]) -> Vec<String> {
    let key = |t: &Value| {
        let legs = t["legs"].as_array().unwrap();
        format!(
            "{} {} {} {} {} | {}",
            t["client"],
            t["question"]["name"],
            t["question"]["type"],
            t["outcome"],
            t["rcode"],
            legs.iter()
                .map(|l| format!(
                    "{}→{}⇒{} parent {}",
                    l["role"], l["server"], l["backend"], l["parent"]
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut v: Vec<String> = recs
        .iter()
        .filter(|r| r["type"] == "transaction")
        .map(key)
        .collect();
    v.sort();
    v
}

/// `trace -w`: the pcapng holds every captured packet with its hop and comment; tshark,
/// capinfos and editcap read it without complaint; `analyze` of it gives the live run's
/// transactions; the file is private (0600).
#[test]
fn trace_w_writes_a_pcapng_that_wireshark_tools_and_analyze_read() {
    let Some(lab) = lab(&["tshark", "capinfos", "editcap"]) else {
        return;
    };
    let scratch = Scratch::new("trace-w");
    let file = scratch.file("trace.pcapng");
    let file_arg = file.to_string_lossy().into_owned();
    let live = lab::tracer::Tracer::transactions(&lab, &["-w", &file_arg]).unwrap();
    for name in ["www.lab.test.", "alias.lab.test.", "nxdomain.lab.test."] {
        let _ = lab.dig(&["+time=2", "+tries=1", name, "A"]);
    }
    let _ = lab.dig(&["+tcp", "+time=2", "+tries=1", "www.lab.test.", "AAAA"]);
    thread::sleep(Duration::from_millis(700));
    let live = live.stop();
    assert!(live.status.success(), "{}", live.stderr);
    assert!(
        live.stderr
            .contains("packets and 0 drops to the pcapng file"),
        "{}",
        live.stderr
    );
    let live_recs = ndjson(&live.stdout);
    let packets = stats(&live_recs)["packets"].as_u64().unwrap();
    assert!(packets >= 12, "{packets}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let t = Command::new("tshark")
        .args([
            "-r",
            &file_arg,
            "-T",
            "fields",
            "-e",
            "frame.comment",
            "-e",
            "frame.interface_name",
        ])
        .output()
        .unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    // Any complaint about the file itself (not tshark's "running as root" notice).
    let complaints: Vec<String> = String::from_utf8_lossy(&t.stderr)
        .lines()
        .filter(|l| !l.contains("Running as user \"root\""))
        .map(str::to_string)
        .collect();
    assert!(complaints.is_empty(), "tshark warned: {complaints:#?}");
    let lines: Vec<String> = String::from_utf8_lossy(&t.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len() as u64, packets, "one frame per captured packet");
    for l in &lines {
        let (comment, iface) = l.split_once('\t').unwrap_or((l, ""));
        assert!(comment.starts_with("dnspath at="), "{l}");
        assert!(
            iface.contains('/') && comment.contains(&format!("at={iface} ")),
            "{l}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("dns=[") && l.contains("www.lab.test.")),
        "{lines:#?}"
    );
    let c = Command::new("capinfos").arg(&file_arg).output().unwrap();
    assert!(c.status.success() && c.stderr.is_empty(), "{c:?}");
    let split = scratch.file("split.pcapng");
    let e = Command::new("editcap")
        .args(["-c", "4", &file_arg, &split.to_string_lossy()])
        .output()
        .unwrap();
    assert!(e.status.success() && e.stderr.is_empty(), "{e:?}");
    let parts = std::fs::read_dir(&scratch.0)
        .unwrap()
        .filter(|f| {
            f.as_ref()
                .is_ok_and(|f| f.file_name().to_string_lossy().starts_with("split"))
        })
        .count();
    assert_eq!(parts as u64, packets.div_ceil(4));

    let offline = analyze(&file, &["--view", "transactions"]);
    assert!(offline.out.status.success(), "{}", offline.stderr);
    let (l, o) = (transactions(&live_recs), transactions(&offline.recs));
    assert_eq!(l.len(), 4, "{l:#?}");
    assert_eq!(l, o, "live and the -w file's transactions differ");
    // Offline, each hop keeps its namespace.
    assert_eq!(stats(&offline.recs)["packets"], packets);
}

#[test]
fn offline_transactions_match_the_live_trace() {
    let Some(lab) = lab(&["tcpdump"]) else { return };
    let scratch = Scratch::new("live-vs-offline");
    let file = scratch.file("any.pcap");
    let cap = tcpdump(&lab, lab.node_ns(), "any", &file, &["udp port 53"]);
    let live = lab::tracer::Tracer::transactions(&lab, &[]).unwrap();
    for name in ["www.lab.test.", "alias.lab.test.", "nxdomain.lab.test."] {
        let _ = lab.dig(&["+time=2", "+tries=1", name, "A"]);
    }
    thread::sleep(Duration::from_millis(700));
    let live = live.stop();
    cap.stop();
    assert!(live.status.success(), "{}", live.stderr);
    let live_recs: Vec<Value> = ndjson(&live.stdout);
    let offline = analyze(&file, &["--view", "transactions"]);
    assert!(offline.out.status.success(), "{}", offline.stderr);
    let (l, o) = (transactions(&live_recs), transactions(&offline.recs));
    eprintln!("live:\n{}\noffline:\n{}", l.join("\n"), o.join("\n"));
    assert_eq!(l.len(), 3, "{l:#?}");
    assert_eq!(l, o);
    let joins = |recs: &[Value]| {
        recs.iter()
            .filter(|r| r["type"] == "transaction")
            .map(|t| t["legs"][0]["join"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert!(
        joins(&live_recs).iter().all(|j| j == "conntrack"),
        "{:?}",
        joins(&live_recs)
    );
    assert!(
        joins(&offline.recs).iter().all(|j| j == "fallback"),
        "{:?}",
        joins(&offline.recs)
    );
}

/// `medium.lab.test. TXT` over Ethernet/IPv4/UDP: a query, and its 708-byte answer of nine
/// 62-byte strings, as frames of a capture.
fn txt_exchange() -> (Vec<u8>, Vec<u8>) {
    let qname = b"\x06medium\x03lab\x04test\x00";
    let mut query = vec![0x04, 0xd2, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    query.extend_from_slice(qname);
    query.extend_from_slice(&[0, 16, 0, 1]);
    let mut answer = vec![0x04, 0xd2, 0x85, 0x80, 0, 1, 0, 9, 0, 0, 0, 0];
    answer.extend_from_slice(qname);
    answer.extend_from_slice(&[0, 16, 0, 1]);
    for i in 0..9u8 {
        answer.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 1, 44, 0, 63, 62]);
        answer.extend_from_slice(format!("{i:02}").as_bytes());
        answer.extend_from_slice(&[b'x'; 60]);
    }
    assert_eq!(answer.len(), 708);
    let frame = |src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, dns: &[u8]| {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let total = (20 + 8 + dns.len()) as u16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0]);
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&(8 + dns.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(dns);
        f
    };
    (
        frame([10, 244, 1, 2], 40000, [10, 250, 0, 53], 53, &query),
        frame([10, 250, 0, 53], 53, [10, 244, 1, 2], 40000, &answer),
    )
}

/// An Ethernet pcap with a snaplen: each frame is kept up to `snaplen` bytes, with its
/// original length in the record, as tcpdump `-s` writes it.
fn pcap_with_snaplen(frames: &[Vec<u8>], snaplen: usize) -> Vec<u8> {
    ethernet_pcap(
        snaplen,
        frames.iter().enumerate().map(|(i, frame)| {
            let ts = Duration::new(1_700_000_000, 1_000_000 * i as u32);
            (ts, frame.len(), &frame[..frame.len().min(snaplen)])
        }),
    )
}

/// A little-endian microsecond Ethernet pcap with `snaplen`, written by pcap-file: each of
/// `records` is (time since the epoch, length on the wire, the bytes kept).
fn ethernet_pcap<'a>(
    snaplen: usize,
    records: impl IntoIterator<Item = (Duration, usize, &'a [u8])>,
) -> Vec<u8> {
    use pcap_file::{
        pcap::{PcapHeader, PcapPacket, PcapWriter},
        DataLink, Endianness,
    };
    let header = PcapHeader {
        snaplen: snaplen as u32,
        datalink: DataLink::ETHERNET,
        endianness: Endianness::Little,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
    for (ts, wire, kept) in records {
        w.write_packet(&PcapPacket::new(ts, wire as u32, kept))
            .unwrap();
    }
    w.into_writer()
}

/// A capture whose snaplen (200 bytes of frame: 158 of DNS) cuts a TXT answer: the answer
/// is decoded as far as it goes, marked `capture_truncated`, not malformed, and answers its
/// transaction, with a note saying where it was cut.
#[test]
fn a_small_capture_snaplen_cuts_the_answer_but_it_still_answers() {
    if !dnspath_bin().exists() {
        eprintln!(
            "skipped: dnspath binary missing at {}; run `cargo xtask test`",
            dnspath_bin().display()
        );
        return;
    }
    let dir = Scratch::new("snaplen");
    let file = dir.file("cut.pcap");
    let (query, answer) = txt_exchange();
    std::fs::write(&file, pcap_with_snaplen(&[query, answer], 200)).unwrap();
    let a = analyze_ok(&file);
    let s = stats(&a.recs);
    assert_eq!(
        (&s["decoded"], &s["malformed"], &s["capture_truncated"]),
        (&Value::from(1), &Value::from(0), &Value::from(1)),
        "{s}"
    );
    let pkts = packets(&a.recs);
    let cut = pkts
        .iter()
        .find(|r| r["dns"]["qr"] == true)
        .unwrap_or_else(|| panic!("answer not decoded: {}", brief(&pkts)));
    assert_eq!(cut["capture_truncated"], true, "{cut}");
    assert!(cut.get("malformed").is_none(), "{cut}");
    assert_eq!(cut["caplen"], 200 - 14);
    assert_eq!(cut["len"], 20 + 8 + 708);
    // 12 + 21 bytes of header and question, then 75 bytes per answer: 1 fits in 158.
    let dns = &cut["dns"];
    assert_eq!(dns["questions"][0]["name"], "medium.lab.test.");
    assert_eq!(dns["answers"].as_array().unwrap().len(), 1, "{dns}");
    assert_eq!(
        dns["answers"][0]["data"],
        format!("\"00{}\"", "x".repeat(60))
    );
    assert_eq!(
        dns["cut"],
        serde_json::json!({"captured_bytes": 158, "message_bytes": 708, "questions": 0,
                           "answers": 8, "authority": 0, "additional": 0})
    );

    let txs: Vec<&Value> = a
        .recs
        .iter()
        .filter(|r| r["type"] == "transaction")
        .collect();
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let t = txs[0];
    assert_eq!(t["outcome"], "answered", "{t}");
    assert_eq!(t["rcode"], "NOERROR", "{t}");
    assert_eq!(t["answers"].as_array().unwrap().len(), 1, "{t}");
    assert_eq!(t["answer_cut"]["answers"], 8, "{t}");
    assert_eq!(t["legs"][0]["outcome"], "answered", "{t}");
    let summary = t["summary"].as_str().unwrap();
    assert!(
        summary.ends_with("answer cut by the capture at 158 of 708 bytes: 1 of 9 answers seen"),
        "{summary}"
    );

    // The text view says the same.
    let out = Command::new(dnspath_bin())
        .arg("analyze")
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("asks medium.lab.test. TXT: NOERROR TXT \"00"),
        "{text}"
    );
    assert!(text.contains("1 of 9 answers seen"), "{text}");
    assert!(
        !text.contains("unanswered") && !text.contains("MALFORMED"),
        "{text}"
    );
    assert!(text.contains("1 cut by the capture's snaplen"), "{text}");

    // The same answer, short though its capture was not cut (its record's original length
    // is what was kept, less than its IP header says): wrong in itself, malformed, and no
    // answer to the transaction.
    let (query, answer) = txt_exchange();
    let second = 24 + 16 + query.len();
    let mut bytes = pcap_with_snaplen(&[query, answer], 200);
    bytes[second + 12..second + 16].copy_from_slice(&200u32.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let a = analyze_ok(&file);
    let s = stats(&a.recs);
    assert_eq!(
        (&s["malformed"], &s["capture_truncated"]),
        (&Value::from(1), &Value::from(0)),
        "{s}"
    );
    let bad = packets(&a.recs)
        .into_iter()
        .find(|r| r["malformed"].is_string())
        .unwrap();
    assert!(
        bad["dns"].is_null() && bad.get("capture_truncated").is_none(),
        "{bad}"
    );
    assert!(
        bad["malformed"]
            .as_str()
            .unwrap()
            .contains("rdata length 63 runs past"),
        "{bad}"
    );
    let t = a.recs.iter().find(|r| r["type"] == "transaction").unwrap();
    assert_ne!(t["outcome"], "answered", "{t}");
}

/// An Ethernet/IPv4/UDP pcap of `queries` (source port, DNS id) from 10.244.1.2 to
/// 10.250.0.53:53, all `A? same.lab.test.`, 20 µs apart, none answered.
fn unanswered_repeats(queries: &[(u16, u16)]) -> Vec<u8> {
    let mut frames = Vec::with_capacity(queries.len());
    let qname = b"\x04same\x03lab\x04test\x00";
    for (i, &(sport, id)) in queries.iter().enumerate() {
        let mut dns = id.to_be_bytes().to_vec();
        dns.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        dns.extend_from_slice(qname);
        dns.extend_from_slice(&[0, 1, 0, 1]);
        let mut frame = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let total = (20 + 8 + dns.len()) as u16;
        frame.extend_from_slice(&[0x45, 0]);
        frame.extend_from_slice(&total.to_be_bytes());
        frame.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 244, 1, 2, 10, 250, 0, 53]);
        frame.extend_from_slice(&sport.to_be_bytes());
        frame.extend_from_slice(&53u16.to_be_bytes());
        frame.extend_from_slice(&(8 + dns.len() as u16).to_be_bytes());
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&dns);
        let ts = Duration::from_secs(1_700_000_000) + Duration::from_micros(20 * i as u64);
        frames.push((ts, frame));
    }
    ethernet_pcap(
        65535,
        frames
            .iter()
            .map(|(ts, frame)| (*ts, frame.len(), &frame[..])),
    )
}

/// 100,000 unanswered queries of one question — 50,000 from as many sockets, then 50,000
/// from one socket with a new id each — go through correlate in linear time (this took
/// minutes when every packet scanned the open queries of its question), each counted where
/// it belongs: no loop, no orphan, a transaction per socket and one per eight attempts of
/// the one socket, every one unanswered or still pending at the end.
#[test]
fn a_hundred_thousand_unanswered_repeats_of_one_question() {
    if !dnspath_bin().exists() {
        eprintln!(
            "skipped: dnspath binary missing at {}; run `cargo xtask test`",
            dnspath_bin().display()
        );
        return;
    }
    const HALF: u32 = 50_000;
    let mut queries: Vec<(u16, u16)> = (0..HALF)
        .map(|i| (1024 + i as u16, (i.wrapping_mul(40503) & 0xffff) as u16))
        .collect();
    queries.extend((0..HALF).map(|i| (60000, i as u16)));
    let dir = Scratch::new("repeats");
    let file = dir.file("repeats.pcap");
    std::fs::write(&file, unanswered_repeats(&queries)).unwrap();
    let started = Instant::now();
    let a = analyze(&file, &["--view", "transactions"]);
    eprintln!(
        "100,000 unanswered repeats analysed in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(a.out.status.success(), "{}", a.stderr);
    let s = stats(&a.recs);
    let c = &s["correlate"];
    assert_eq!(s["decoded"], 100_000, "{s}");
    assert_eq!(c["legs"], 100_000, "{s}");
    assert_eq!(c["orphan_responses"], 0, "{s}");
    assert_eq!(c["loops"]["detected"], 0, "{s}");
    assert_eq!(c["loops"]["amplification"], 0, "{s}");
    // A transaction per socket of the first half; the one socket's queries are retries of
    // each other, eight attempts to a transaction. Those not reported were evicted (at most
    // 65,536 legs are kept open at once) and counted.
    let txs: Vec<&Value> = a
        .recs
        .iter()
        .filter(|r| r["type"] == "transaction")
        .collect();
    assert_eq!(c["transactions"], txs.len(), "{s}");
    let reported = c["transactions"].as_u64().unwrap();
    let evicted = c["evicted_transactions"].as_u64().unwrap();
    assert_eq!(
        reported + evicted,
        u64::from(HALF) + u64::from(HALF).div_ceil(8),
        "{s}"
    );
    assert!(reported > 0 && evicted > 0, "{s}");
    for t in &txs {
        assert!(
            t["outcome"] == "unanswered" || t["outcome"] == "pending",
            "{t}"
        );
        let legs = t["legs"].as_array().unwrap();
        assert!(
            legs.iter()
                .all(|l| l["role"] == "query" || l["role"] == "retry"),
            "{t}"
        );
        let one_socket = t["client"] == "10.244.1.2:60000";
        if one_socket {
            assert!(legs.len() <= 8, "{t}");
        } else {
            assert_eq!(legs.len(), 1, "a socket's own query: {t}");
        }
    }
}

/// `dnspath trace -w DIR/NAME.pcapng` on one node's namespaces, its transactions too; for
/// `analyze` of several nodes.
fn node_writer(dir: &Path, name: &str, netns: &[&str]) -> (lab::tracer::NodeTracer, PathBuf) {
    let file = dir.join(format!("{name}.pcapng"));
    let t =
        lab::tracer::NodeTracer::start(dir, name, netns, &["-w", file.to_str().unwrap()]).unwrap();
    (t, file)
}

/// One A query for `name` from namespace `ns`, from UDP port `port` with DNS id `id`, to
/// `server`:53; whether the answer came (python3's socket: dig cannot choose the id).
fn query_with_id(ns: &str, port: u16, id: u16, name: &str, server: std::net::Ipv4Addr) -> bool {
    const SCRIPT: &str = r#"
import socket, struct, sys
port, qid, name, server = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
q = struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0)
q += b''.join(bytes([len(l)]) + l.encode() for l in name.rstrip('.').split('.')) + b'\0'
q += struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', port))
s.settimeout(2)
s.sendto(q, (server, 53))
d, _ = s.recvfrom(4096)
sys.exit(0 if d[:2] == q[:2] else 1)
"#;
    Command::new("ip")
        .args(["netns", "exec", ns, "/usr/bin/python3", "-c", SCRIPT])
        .arg(port.to_string())
        .arg(id.to_string())
        .arg(name)
        .arg(server.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two nodes joined by VXLAN, one `dnspath trace -w` per node seeing only its own
/// namespaces; `analyze` of both files: each query from node A's client pod to the Service,
/// served by the DNS pod on node B, is one transaction with legs from both nodes (node B's
/// under the node A leg that sent it) and node A's trace id; what must not join does not:
/// the same name asked by another client (node A itself), and two names asked from the
/// same port with the same DNS id.
#[test]
fn captures_of_two_nodes_join_into_one_transaction_per_query() {
    use lab::tunnel::{ANSWER, CLIENT, CLUSTER_IP, DNS};
    if !lab::tracer::root_or_skip("two nodes joined by VXLAN") {
        return;
    }
    let nodes = lab::tunnel::VxlanNodes::start().unwrap();
    nodes.add_cluster_ip().unwrap();
    let (a, file_a) = node_writer(&nodes.dir, "node-a", &[&nodes.node_a, &nodes.client]);
    let (b, file_b) = node_writer(&nodes.dir, "node-b", &[&nodes.node_b, &nodes.dns]);
    for i in 0..3 {
        let (ok, got) = nodes.dig_at(CLUSTER_IP, &format!("x{i}.tunnel.test."), "A");
        assert!(ok && got == ANSWER.to_string(), "{got}");
    }
    // The same name from another client: node A's own namespace.
    let out = Command::new("ip")
        .args(["netns", "exec", &nodes.node_a, "dig", "+short", "+tries=1"])
        .arg(format!("@{DNS}"))
        .arg("x0.tunnel.test.")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        ANSWER.to_string()
    );
    // One client socket, one DNS id, two names.
    for name in ["reuse1.tunnel.test.", "reuse2.tunnel.test."] {
        assert!(
            query_with_id(&nodes.client, 45353, 0x4242, name, CLUSTER_IP),
            "{name}"
        );
    }
    thread::sleep(Duration::from_millis(1500));
    let live_a = a.stop().unwrap();
    b.stop().unwrap();

    let arg_a = format!("node-a={}", file_a.display());
    let arg_b = format!("node-b={}", file_b.display());
    let out = Command::new(dnspath_bin())
        .args([
            "analyze",
            "-o",
            "json",
            "--view",
            "transactions",
            &arg_a,
            &arg_b,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let recs = ndjson(&String::from_utf8_lossy(&out.stdout));
    let txs = |name: &str| -> Vec<&Value> {
        recs.iter()
            .filter(|r| r["type"] == "transaction" && r["question"]["name"] == name)
            .collect()
    };
    let leg_nodes = |t: &Value| -> Vec<String> {
        t["legs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["node"].as_str().unwrap_or("").to_string())
            .collect()
    };
    // Node B's legs whose parent is a node A leg: the query where it was served.
    let served_under_a = |t: &Value| -> usize {
        let legs = t["legs"].as_array().unwrap();
        legs.iter()
            .filter(|l| {
                l["node"] == "node-b"
                    && l["parent"]
                        .as_u64()
                        .and_then(|p| legs.get(p as usize))
                        .is_some_and(|p| p["node"] == "node-a")
            })
            .count()
    };
    let client = CLIENT.to_string();
    let from_pod = |t: &Value| {
        t["client"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("{client}:")))
    };
    for i in 0..3 {
        let name = format!("x{i}.tunnel.test.");
        let all = txs(&name);
        let pod: Vec<&&Value> = all.iter().filter(|t| from_pod(t)).collect();
        assert_eq!(
            pod.len(),
            1,
            "{name}: one transaction of the pod's query: {all:#?}"
        );
        let t = pod[0];
        eprintln!("{name}: legs from {:?}", leg_nodes(t));
        assert_eq!(t["nodes"], serde_json::json!(["node-a", "node-b"]), "{t:#}");
        assert_eq!(t["node"], "node-a", "{t:#}");
        assert_eq!(served_under_a(t), 1, "{t:#}");
        assert_eq!(t["outcome"], "answered", "{t:#}");
        // The trace id is node A's live one (what its OTLP spans carry).
        let live = live_a
            .iter()
            .find(|r| {
                r["type"] == "transaction" && r["question"]["name"] == name.as_str() && from_pod(r)
            })
            .unwrap_or_else(|| panic!("{name} in node A's live output"));
        assert_eq!(t["trace_id"], live["trace_id"], "{name}");
    }
    // The same name from node A's namespace: a transaction of its own, not the pod's.
    let x0 = txs("x0.tunnel.test.");
    assert_eq!(x0.len(), 2, "{x0:#?}");
    assert_ne!(x0[0]["trace_id"], x0[1]["trace_id"]);
    for t in &x0 {
        assert_eq!(served_under_a(t), 1, "each its own served leg: {t:#}");
    }
    // Port and DNS id reused for another name: two transactions, each joined with its own.
    let (r1, r2) = (txs("reuse1.tunnel.test."), txs("reuse2.tunnel.test."));
    assert_eq!((r1.len(), r2.len()), (1, 1), "{r1:#?}\n{r2:#?}");
    for t in [r1[0], r2[0]] {
        assert_eq!(t["client"], format!("{client}:45353"));
        assert_eq!(t["legs"][0]["dns_id"], 0x4242);
        assert_eq!(t["nodes"], serde_json::json!(["node-a", "node-b"]), "{t:#}");
        assert_eq!(served_under_a(t), 1, "{t:#}");
    }
    assert_ne!(r1[0]["trace_id"], r2[0]["trace_id"]);
    // Nothing of node B was left alone: every served query found its client's half.
    let alone_b = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && r["nodes"] == serde_json::json!(["node-b"]))
        .filter(|r| r["question"]["name"] != "ready.tunnel.test.")
        .count();
    assert_eq!(alone_b, 0, "{recs:#?}");
    // The run's summary just before them: every transaction written, a joined query once.
    let summary = &recs[recs.len() - 3];
    assert_eq!(summary["type"], "summary", "{summary}");
    let written = recs.iter().filter(|r| r["type"] == "transaction").count();
    assert_eq!(summary["questions"], written, "{summary}");
    // A stats record per node.
    let stats: Vec<&Value> = recs.iter().filter(|r| r["type"] == "stats").collect();
    assert_eq!(stats.len(), 2);
    assert_eq!(
        (stats[0]["node"].clone(), stats[1]["node"].clone()),
        ("node-a".into(), "node-b".into())
    );
}

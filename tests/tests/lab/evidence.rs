#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Evidence for the postmortem (issue 14), with the real tools that open it: `trace -w`
//! annotated pcapng read by tshark, capinfos, editcap and `dnspath analyze`; rotation by
//! size and time; a read-only and a full directory (a tmpfs mounted in a mount namespace of
//! the tracer's own, gone with it); the flight recorder on a real forwarding loop and a
//! forced conntrack race. Root only; `--test-threads=1`.
use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::Command,
    thread,
    time::Duration,
};

use lab::{
    kubelet::{KubeletPods, Node},
    race,
    tracer::{last_stats as stats, ndjson, Tracer},
    DnsPodConfig, DnsServerKind, Lab, Pod, POD_IFACE,
};
use serde_json::Value;

use crate::shared::lab_with_tools as lab;

/// A directory of this test's files, removed on drop (also when the test panics).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("dnspath-evidence-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
    /// Names of the files in it, sorted.
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// tshark's stderr lines that are about the file (not its "running as root" notice).
fn complaints(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| !l.contains("Running as user \"root\""))
        .map(str::to_string)
        .collect()
}

/// `tshark -r FILE -T fields -e …` (tab-separated, one line per frame), asserting that
/// tshark read it without a word about the file.
fn tshark_fields(file: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec!["-r", file, "-T", "fields", "-E", "occurrence=f"];
    for f in fields {
        args.extend(["-e", f]);
    }
    let t = Command::new("tshark").args(&args).output().unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let c = complaints(&t.stderr);
    assert!(c.is_empty(), "tshark warned about {file}: {c:#?}");
    String::from_utf8_lossy(&t.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// capinfos reads it without a complaint; returns its report.
fn capinfos(file: &str) -> String {
    let c = Command::new("capinfos").arg(file).output().unwrap();
    assert!(c.status.success() && c.stderr.is_empty(), "{file}: {c:?}");
    String::from_utf8_lossy(&c.stdout).into_owned()
}

fn mode(path: &str) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A transaction as both runs must agree on it: question, outcome, rcode, and per leg its
/// role, server, backend and the places of its hops.
fn transaction_keys(recs: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = recs
        .iter()
        .filter(|r| r["type"] == "transaction")
        .map(|t| {
            let legs: Vec<String> = t["legs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    let hops: Vec<String> = l["hops"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| {
                            format!("{}/{} {} qr={}", h["netns"], h["ifname"], h["dir"], h["qr"])
                        })
                        .collect();
                    format!(
                        "{} {}->{} [{}]",
                        l["role"],
                        l["server"],
                        l["backend"],
                        hops.join(", ")
                    )
                })
                .collect();
            format!(
                "{} {} {} {} | {}",
                t["question"]["name"],
                t["question"]["type"],
                t["outcome"],
                t["rcode"],
                legs.join(" | ")
            )
        })
        .collect();
    v.sort();
    v
}

/// `trace -w`: every packet in the file with its hop's interface name and a comment that
/// says which transaction, leg and hop it is; the copies of a packet share an id; tshark,
/// capinfos and editcap read it; its count is the trace's; `analyze` of it gives the live
/// run's transactions.
#[test]
fn trace_w_explains_every_packet_and_reads_back() {
    let Some(lab) = lab(&["tshark", "capinfos", "editcap"]) else {
        return;
    };
    let scratch = Scratch::new("w");
    let file = scratch.path("trace.pcapng");
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "trace",
            "-o",
            "json",
            "--view",
            "both",
            "--timeout",
            "1",
            "-w",
            &file,
        ],
    )
    .unwrap();
    for name in ["www.lab.test.", "alias.lab.test.", "nxdomain.lab.test."] {
        let _ = lab.dig(&["+time=2", "+tries=1", name, "A"]);
    }
    let _ = lab.dig(&["+tcp", "+time=2", "+tries=1", "www.lab.test.", "AAAA"]);
    thread::sleep(Duration::from_millis(700));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let s = stats(&recs);
    let packets = s["packets"].as_u64().unwrap();
    let drops = s["drops"].as_u64().unwrap();
    assert!(packets >= 12, "{packets}");
    assert_eq!(mode(&file), 0o600);
    assert!(
        out.stderr.contains(&format!(
            "wrote {packets} packets and {drops} drops to the pcapng file"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(s["evidence"]["write"]["packets"], packets, "{s:#}");

    let frames = tshark_fields(&file, &["frame.comment", "frame.interface_name"]);
    assert_eq!(
        frames.len() as u64,
        packets + drops,
        "one frame per packet the trace counted"
    );
    let mut legs_seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut places_of_id: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &frames {
        let (comment, iface) = (&f[0], &f[1]);
        assert!(
            comment.starts_with(&format!("dnspath at={iface} ")) && iface.contains('/'),
            "{f:?}"
        );
        let id = comment
            .split(' ')
            .find_map(|w| w.strip_prefix("pkt="))
            .unwrap_or_else(|| panic!("no packet id: {comment}"));
        places_of_id
            .entry(id.to_string())
            .or_default()
            .insert(iface.clone());
        // Every DNS message a hop saw belongs to a transaction the live run reported.
        if comment.contains(" dns=[") && iface != "dnspath/drops" {
            let txn = comment
                .split(' ')
                .find(|w| w.starts_with("txn="))
                .unwrap_or_else(|| panic!("no transaction in {comment}"));
            let leg = comment.split(' ').find(|w| w.starts_with("leg=")).unwrap();
            *legs_seen.entry(format!("{txn} {leg}")).or_default() += 1;
            assert!(
                comment.contains(" hop=") && comment.contains(" role="),
                "{comment}"
            );
        }
    }
    // Each leg of each transaction: as many frames as it has hops.
    let mut legs_reported = BTreeMap::new();
    for t in recs.iter().filter(|r| r["type"] == "transaction") {
        for (i, l) in t["legs"].as_array().unwrap().iter().enumerate() {
            legs_reported.insert(
                format!("txn={} leg={i}", t["id"]),
                l["hops"].as_array().unwrap().len(),
            );
        }
    }
    assert!(legs_reported.len() >= 8, "{legs_reported:#?}");
    assert_eq!(legs_seen, legs_reported);
    // The client's query through the Service names its DNAT.
    assert!(
        frames.iter().any(|f| f[0].contains(&format!(
            "role=query msg=query dnat={}:53->",
            lab.cluster_ip()
        ))),
        "{frames:#?}"
    );
    // A query crosses several hops as one packet: its copies share their id.
    assert!(
        places_of_id.values().any(|p| p.len() >= 2),
        "{places_of_id:#?}"
    );

    let info = capinfos(&file);
    assert!(
        info.contains(&format!("Number of packets:   {}", packets + drops)),
        "{info}"
    );
    let split = scratch.path("split.pcapng");
    let e = Command::new("editcap")
        .args(["-c", "4", &file, &split])
        .output()
        .unwrap();
    assert!(e.status.success() && e.stderr.is_empty(), "{e:?}");
    let parts = scratch
        .files()
        .iter()
        .filter(|f| f.starts_with("split"))
        .count();
    assert_eq!(parts as u64, (packets + drops).div_ceil(4));

    let a = Command::new(lab::tracer::dnspath_bin())
        .args([
            "analyze",
            "-o",
            "json",
            "--view",
            "transactions",
            "--timeout",
            "1",
            &file,
        ])
        .output()
        .unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let offline = ndjson(&String::from_utf8_lossy(&a.stdout));
    assert_eq!(stats(&offline)["packets"], packets);
    let (live, off) = (transaction_keys(&recs), transaction_keys(&offline));
    assert_eq!(live.len(), 4, "{live:#?}");
    assert_eq!(live, off, "live and the -w file's transactions differ");
}

/// `count` queries, each for its own name, in one dig run.
/// With the lab's pods named as a kubelet names them (`--host-root`): each interface block's
/// description names the pod of its namespace, or the pod whose veth's node end it is, while
/// `if_name` stays `netns/ifname`.
#[test]
fn trace_w_names_the_pods_of_its_interfaces() {
    let Some(lab) = lab(&["tshark"]) else {
        return;
    };
    let Some(pods) = KubeletPods::for_test(&lab, Node::Lab) else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();
    let scratch = Scratch::new("pods");
    let file = scratch.path("trace.pcapng");
    let mut args = vec![
        "trace",
        "-o",
        "json",
        "--timeout",
        "1",
        "--host-root",
        &root,
        "-w",
        &file,
    ];
    // Every namespace of this lab (not `--all-netns`: other labs may share the machine).
    for ns in lab.namespaces().into_iter().skip(1) {
        args.extend(["--netns", ns]);
    }
    let t = Tracer::start(&lab, lab.node_ns(), &args).unwrap();
    let o = lab.dig(&["+time=2", "+tries=1", "www.lab.test.", "A"]);
    assert!(o.status.success(), "{o:?}");
    thread::sleep(Duration::from_millis(500));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);

    // The pod each place must name, and whether as the node end of its veth.
    let mut expected = BTreeMap::new();
    let mut all = vec![Pod::Client];
    all.extend((0..lab.dns_pod_count()).map(Pod::Dns));
    for p in all {
        let label = pods.of(p).unwrap().label();
        expected.insert(
            format!("{}/{POD_IFACE}", lab.ns_of(p)),
            format!(", pod {label} (uid "),
        );
        expected.insert(
            format!("{}/{}", lab.node_ns(), lab.veth_of(p)),
            format!(", node-side veth of pod {label} (uid "),
        );
    }
    let frames = tshark_fields(
        &file,
        &["frame.interface_name", "frame.interface_description"],
    );
    let mut named = BTreeSet::new();
    for f in &frames {
        let (iface, description) = (&f[0], &f[1]);
        assert!(
            description.starts_with("network namespace "),
            "{iface}: {description}"
        );
        match expected.get(iface) {
            Some(pod) => {
                assert!(description.contains(pod.as_str()), "{iface}: {description}");
                named.insert(iface.clone());
            }
            None => assert!(!description.contains(" pod "), "{iface}: {description}"),
        }
    }
    let client_veth = format!("{}/{}", lab.node_ns(), lab.veth_of(Pod::Client));
    let client = format!("{}/{POD_IFACE}", lab.ns_of(Pod::Client));
    assert!(
        named.contains(&client_veth) && named.contains(&client),
        "{named:?} of {frames:#?}"
    );
    assert!(
        (0..lab.dns_pod_count())
            .any(|k| named.contains(&format!("{}/{POD_IFACE}", lab.ns_of(Pod::Dns(k))))),
        "a CoreDNS pod's own interface: {named:?}"
    );
}

fn queries(lab: &Lab, tag: &str, count: usize) {
    let names: Vec<String> = (0..count).map(|i| format!("{tag}{i}.lab.test.")).collect();
    let mut args = vec!["+time=1", "+tries=1"];
    args.extend(names.iter().map(String::as_str));
    let _ = lab.dig(&args);
}

/// `-C 2k -W 3`: a new file every 2 KiB, and only the newest 3 are kept; each one opens.
#[test]
fn rotation_by_size_keeps_exactly_n_files() {
    let Some(lab) = lab(&["capinfos", "tshark"]) else {
        return;
    };
    let scratch = Scratch::new("size");
    let file = scratch.path("rot.pcapng");
    let t = Tracer::transactions(&lab, &["-w", &file, "-C", "2k", "-W", "3"]).unwrap();
    queries(&lab, "size", 30);
    thread::sleep(Duration::from_millis(500));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let w = &stats(&recs)["evidence"]["write"];
    let created = w["files"].as_u64().unwrap();
    assert!(created > 3, "{w:#}");
    assert_eq!(w["files_deleted"].as_u64().unwrap(), created - 3, "{w:#}");
    let files = scratch.files();
    assert_eq!(files.len(), 3, "{files:?}");
    // The newest three, by sequence number.
    let expect: Vec<String> = (created - 2..=created)
        .map(|n| format!("rot-{n:05}.pcapng"))
        .collect();
    assert_eq!(files, expect);
    for f in &files {
        let path = scratch.path(f);
        assert_eq!(mode(&path), 0o600);
        capinfos(&path);
        let frames = tshark_fields(&path, &["frame.comment"]);
        assert!(!frames.is_empty() && frames.iter().all(|f| f[0].starts_with("dnspath at=")));
        // Rotated at the first packet past 2 KiB: at most one packet over.
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 2048 + 1024, "{f}: {size} bytes");
    }
}

/// `-G 1 -W 2` with a strftime name: a new file each second of traffic, the newest 2 kept.
#[test]
fn rotation_by_time_keeps_exactly_n_files() {
    let Some(lab) = lab(&["capinfos"]) else {
        return;
    };
    let scratch = Scratch::new("time");
    let file = scratch.path("dns-%H%M%S.pcapng");
    let t = Tracer::transactions(&lab, &["-w", &file, "-G", "1", "-W", "2"]).unwrap();
    for i in 0..9 {
        queries(&lab, &format!("t{i}-"), 1);
        thread::sleep(Duration::from_millis(450));
    }
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let w = &stats(&recs)["evidence"]["write"];
    assert!(w["files"].as_u64().unwrap() >= 3, "{w:#}");
    let files = scratch.files();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        assert!(
            f.len() == "dns-HHMMSS.pcapng".len() && f.starts_with("dns-") && f.ends_with(".pcapng"),
            "{f}"
        );
        capinfos(&scratch.path(f));
    }
}

/// Runs `trace -w DIR/trace.pcapng --duration 6` with a tmpfs mounted (`mount_opts`) on DIR
/// in a mount namespace of its own, with some queries; copies what it wrote to `keep` before
/// the namespace goes. Returns the run's output.
fn trace_on_tmpfs(lab: &Lab, mount_opts: &str, keep: &Scratch) -> lab::tracer::TracerOutput {
    let dir = Scratch::new(&format!("mnt-{}", mount_opts.replace(',', "-")));
    let d = dir.0.to_string_lossy().into_owned();
    let k = keep.0.to_string_lossy().into_owned();
    let script = format!(
        "mount -t tmpfs -o {mount_opts},mode=0700 dnspath-test '{d}' || exit 9; \
         \"$@\"; rc=$?; cp -p '{d}'/* '{k}'/ 2>/dev/null; exit $rc"
    );
    let file = format!("{d}/trace.pcapng");
    let t = Tracer::start_under(
        lab,
        lab.node_ns(),
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ],
        &[
            "trace",
            "-o",
            "json",
            "--view",
            "transactions",
            "--duration",
            "6",
            "-w",
            &file,
        ],
        true,
        Duration::from_secs(30),
    )
    .unwrap();
    for i in 0..6 {
        queries(lab, &format!("fs{i}-"), 8);
    }
    let out = t.wait();
    // The mount went with its namespace: the directory is empty again.
    assert!(dir.files().is_empty());
    out
}

/// The error lines about the -w file.
fn w_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("dnspath: error: -w "))
        .collect()
}

/// A read-only directory: one clear error; the trace goes on and reports its transactions.
#[test]
fn read_only_directory_is_one_error_and_the_trace_goes_on() {
    let Some(lab) = lab(&["unshare", "mount"]) else {
        return;
    };
    let keep = Scratch::new("ro-keep");
    let out = trace_on_tmpfs(&lab, "ro,size=64k", &keep);
    assert!(out.status.success(), "{}", out.stderr);
    let errors = w_errors(&out.stderr);
    assert_eq!(errors.len(), 1, "{}", out.stderr);
    assert!(
        errors[0].contains("Read-only file system")
            && errors[0].contains("the trace goes on without the pcapng file"),
        "{}",
        errors[0]
    );
    let recs = ndjson(&out.stdout);
    let answered = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && r["outcome"] == "answered")
        .count();
    assert!(
        answered >= 40,
        "{answered} transactions answered\n{}",
        out.stderr
    );
    assert!(stats(&recs)["evidence"]["write"]["failed"]
        .as_str()
        .unwrap()
        .contains("Read-only file system"));
    assert!(keep.files().is_empty());
}

/// A directory that fills up: one clear error, the trace goes on, and the file written so
/// far ends with a whole block: tshark reads every frame in it without a warning.
#[test]
fn full_directory_is_one_error_and_what_was_written_stays_readable() {
    let Some(lab) = lab(&["unshare", "mount", "tshark", "capinfos"]) else {
        return;
    };
    let keep = Scratch::new("full-keep");
    let out = trace_on_tmpfs(&lab, "size=16k", &keep);
    assert!(out.status.success(), "{}", out.stderr);
    let errors = w_errors(&out.stderr);
    assert_eq!(errors.len(), 1, "{}", out.stderr);
    assert!(
        errors[0].contains("No space left on device"),
        "{}",
        errors[0]
    );
    let recs = ndjson(&out.stdout);
    let s = stats(&recs);
    let packets = s["packets"].as_u64().unwrap();
    let written = s["evidence"]["write"]["packets"].as_u64().unwrap();
    assert!(written > 0 && written < packets, "{written} of {packets}");
    assert!(
        recs.iter()
            .filter(|r| r["type"] == "transaction" && r["outcome"] == "answered")
            .count()
            >= 40
    );
    let files = keep.files();
    assert_eq!(files, ["trace.pcapng"]);
    let file = keep.path("trace.pcapng");
    capinfos(&file);
    let frames = tshark_fields(&file, &["frame.comment"]);
    assert!(
        !frames.is_empty() && frames.len() as u64 <= written,
        "{} frames",
        frames.len()
    );
    assert!(frames.iter().all(|f| f[0].starts_with("dnspath at=")));
}

/// The recorder's files in `dir`, and the comments of the section header of each.
fn recorder_files(dir: &Scratch) -> Vec<(String, String)> {
    dir.files()
        .into_iter()
        .map(|f| {
            let path = dir.path(&f);
            assert_eq!(mode(&path), 0o600);
            let c = Command::new("capinfos")
                .args(["-k", &path])
                .output()
                .unwrap();
            assert!(c.status.success() && c.stderr.is_empty(), "{c:?}");
            (path, String::from_utf8_lossy(&c.stdout).into_owned())
        })
        .collect()
}

/// A forwarding loop: one recorder file, holding the client's query that started it (before
/// the loop was detected) and the looping packets, each saying which loop; the loop record
/// names the file.
#[test]
fn a_loop_leaves_one_recorder_file_with_its_packets_explained() {
    let Some(mut lab) = lab(&["tshark", "capinfos"]) else {
        return;
    };
    let dir = Scratch::new("loop");
    let d = dir.0.to_string_lossy().into_owned();
    let t = Tracer::transactions(
        &lab,
        &[
            "--timeout",
            "1",
            "--record",
            &d,
            "--record-after",
            "10",
            "--record-buffer",
            "8",
        ],
    )
    .unwrap();
    for i in 0..2 {
        let to_service = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
        lab.reconfigure_dns_pod(i, to_service).unwrap();
    }
    let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
    thread::sleep(Duration::from_secs(2));
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    lab.reconfigure_dns_pod(1, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    thread::sleep(Duration::from_secs(2));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let detected: Vec<&Value> = recs
        .iter()
        .filter(|r| r["type"] == "loop" && r["state"] == "detected")
        .collect();
    assert_eq!(detected.len(), 1, "{detected:#?}");
    let l = detected[0];
    let files = recorder_files(&dir);
    assert_eq!(
        files.len(),
        1,
        "one file for the loop and what came with it: {files:#?}"
    );
    let (file, header) = &files[0];
    assert_eq!(l["evidence"], file.as_str(), "{l:#}");
    assert!(file.ends_with("-loop.pcapng"), "{file}");
    assert!(header.contains("incident loop at "), "{header}");
    let frames = tshark_fields(file, &["frame.comment", "ip.src", "frame.time_epoch"]);
    let loop_note = format!("loop={} cycle=[", l["id"]);
    let looping = frames.iter().filter(|f| f[0].contains(&loop_note)).count();
    assert!(
        looping >= 10,
        "{looping} of {} frames name the loop",
        frames.len()
    );
    // The client's query that started it comes first: before every looping packet.
    let client = lab.ip_of(Pod::Client).to_string();
    let first = frames
        .iter()
        .find(|f| f[1] == client && f[0].contains("storm.lab.test."))
        .unwrap_or_else(|| {
            panic!(
                "no query from the client: {:#?}",
                &frames[..frames.len().min(20)]
            )
        });
    assert!(first[0].contains(&loop_note), "{first:?}");
    let t0: f64 = first[2].parse().unwrap();
    let earliest = frames
        .iter()
        .filter(|f| f[0].contains(&loop_note))
        .map(|f| f[2].parse::<f64>().unwrap())
        .fold(f64::MAX, f64::min);
    assert!(
        t0 <= earliest,
        "{first:?} after the loop's first packet at {earliest}"
    );
}

/// A forced conntrack race drop: one recorder file holding the client's A query before the
/// drop and the drop itself, explained; the race record names the file.
#[test]
fn a_race_drop_leaves_one_recorder_file_with_its_packets_explained() {
    let Some(lab) = lab(&["tshark", "capinfos"]) else {
        return;
    };
    let dir = Scratch::new("race");
    let d = dir.0.to_string_lossy().into_owned();
    let rig = race::RaceRig::install(&lab, 300).unwrap();
    let t = Tracer::transactions(
        &lab,
        &["--timeout", "1", "--record", &d, "--record-after", "3"],
    )
    .unwrap();
    let shot = race::force_race(&lab, "evidence.lab.test").unwrap();
    thread::sleep(Duration::from_secs(4));
    let out = t.stop();
    rig.remove().unwrap();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let races: Vec<&Value> = recs
        .iter()
        .filter(|r| r["type"] == "race" && r["verdict"] == "race-drop")
        .collect();
    assert_eq!(races.len(), 1, "{races:#?}");
    let files = recorder_files(&dir);
    assert_eq!(files.len(), 1, "{files:#?}");
    let (file, header) = &files[0];
    assert_eq!(races[0]["evidence"], file.as_str(), "{:#}", races[0]);
    assert!(header.contains("incident race-drop at "), "{header}");
    let frames = tshark_fields(
        file,
        &[
            "frame.comment",
            "frame.interface_name",
            "udp.srcport",
            "frame.time_epoch",
        ],
    );
    let port = shot.src_port.to_string();
    let a_id = format!("{}", shot.a_id);
    // The client's A query, before its drop, with the race in its comment.
    let query = frames
        .iter()
        .find(|f| f[2] == port && f[0].contains(&format!("dns=[{a_id}")) && f[1] != "dnspath/drops")
        .unwrap_or_else(|| panic!("no client query: {frames:#?}"));
    assert!(
        query[0].contains("race=race-drop sibling=[AAAA"),
        "{query:?}"
    );
    assert!(query[0].contains("evidence.lab.test."), "{query:?}");
    let dropped = frames
        .iter()
        .find(|f| f[1] == "dnspath/drops")
        .unwrap_or_else(|| panic!("no drop: {frames:#?}"));
    assert!(
        dropped[0].contains(" drop=") && dropped[0].contains("A? evidence.lab.test."),
        "{dropped:?}"
    );
    assert!(dropped[0].contains("race=race-drop"), "{dropped:?}");
    let t_query: f64 = query[3].parse().unwrap();
    let t_drop: f64 = dropped[3].parse().unwrap();
    assert!(t_query < t_drop, "{query:?} {dropped:?}");
    // The query's id is shared by its drop: one packet, followed through the node.
    let id = |c: &str| {
        c.split(' ')
            .find(|w| w.starts_with("pkt="))
            .map(str::to_string)
    };
    assert!(
        frames
            .iter()
            .filter(|f| id(&f[0]) == id(&dropped[0]))
            .count()
            >= 2,
        "{frames:#?}"
    );
}

/// What of a live run's records `analyze` of its `-w` file cannot give, and why: those
/// fields are taken out (or made relative) before the two are compared; everything else
/// must be equal.
const NOT_COMPARABLE: &[(&str, &str)] = &[
    (
        "ts_ns",
        "live stamps are CLOCK_BOOTTIME, the file's Unix time: compared as offsets from the \
         record's own first time (a transaction's ts_ns, the first drop's)",
    ),
    (
        "join",
        "live joins a leg's hops across DNAT through conntrack; a file has no conntrack, so \
         analyze joins them by (client port, DNS id, question)",
    ),
];

/// What of a live `race` record `analyze` cannot give, and why (besides [`NOT_COMPARABLE`]).
const RACE_NOT_COMPARABLE: &[(&str, &str)] = &[
    (
        "counters",
        "the per-CPU conntrack statistics around the drop are sampled live over ctnetlink; a \
         file has none",
    ),
    (
        "counter_confirmed",
        "whether those statistics grew (insert_failed, drop): nothing to read offline",
    ),
];

/// `ns` (a record's namespace) is one of this lab's: `--all-netns` also sees the other labs
/// running on the machine, which are not this test's to compare.
fn ours(ns: &Value, prefix: &str) -> bool {
    ns.as_str().is_some_and(|n| n.starts_with(prefix))
}

/// This lab's race records of a run, comparable (but for [`RACE_NOT_COMPARABLE`]), in order.
fn comparable_races(recs: &[Value], prefix: &str) -> Vec<Value> {
    recs.iter()
        .filter(|r| r["type"] == "race" && ours(&r["client_netns"], prefix))
        .map(|r| {
            let mut r = comparable(r, r["ts_ns"].as_u64().unwrap());
            if let Value::Object(m) = &mut r {
                m.retain(|k, _| !RACE_NOT_COMPARABLE.iter().any(|(n, _)| n == k));
            }
            r
        })
        .collect()
}

/// `v` with every `ts_ns` made an offset from `base` and the other [`NOT_COMPARABLE`]
/// fields taken out.
fn comparable(v: &Value, base: u64) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| *k == "ts_ns" || !NOT_COMPARABLE.iter().any(|(n, _)| n == k))
                .map(|(k, x)| {
                    let x = match (k.as_str(), x.as_u64()) {
                        ("ts_ns", Some(ts)) => Value::from(ts as i64 - base as i64),
                        _ => comparable(x, base),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| comparable(x, base)).collect()),
        other => other.clone(),
    }
}

/// This lab's transactions of a run, comparable, sorted by question and client.
fn comparable_transactions(recs: &[Value], prefix: &str) -> Vec<Value> {
    let mut v: Vec<Value> = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && ours(&r["client_netns"], prefix))
        .map(|t| comparable(t, t["ts_ns"].as_u64().unwrap()))
        .collect();
    v.sort_by_key(|t| format!("{} {} {}", t["question"], t["client"], t["id"]));
    v
}

/// This lab's drop records of a run, comparable, in the order they came.
fn comparable_drops(recs: &[Value], prefix: &str) -> Vec<Value> {
    let drops: Vec<&Value> = recs
        .iter()
        .filter(|r| r["type"] == "drop" && ours(&r["netns"], prefix))
        .collect();
    let base = drops.first().map_or(0, |d| d["ts_ns"].as_u64().unwrap());
    drops.iter().map(|d| comparable(d, base)).collect()
}

/// The issue's test: a live `trace --all-netns -o json -w FILE` of a query an iptables rule
/// DROPs (a kernel drop, `NETFILTER_DROP`), a query lost to a forced conntrack race, and
/// answered queries over UDP and TCP, then
/// `analyze FILE -o json`: its transactions are the live run's field by field (outcome,
/// summary, rcode, answers, latencies, every leg's outcome, hops and drop with reason and
/// location), and its drop records too (reason, code, location, cpu, namespace, interface,
/// ids, conntrack entry, DNS message) and its race records — but for [`NOT_COMPARABLE`] (and
/// [`RACE_NOT_COMPARABLE`]).
#[test]
fn analyze_of_a_trace_w_file_reads_kernel_drops_back_as_drops() {
    let Some(lab) = lab(&[]) else {
        return;
    };
    let scratch = Scratch::new("drops");
    let file = scratch.path("drops.pcapng");
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "trace",
            "--all-netns",
            "-o",
            "json",
            "--timeout",
            "1",
            "-w",
            &file,
        ],
    )
    .unwrap();
    // The dropped query first, so that its timeout is over in the file's time before it
    // ends (offline, time moves with the packets).
    let o = lab.pod_dns_drop("-I");
    assert!(o.status.success(), "{o:?}");
    let dropped = lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    let o = lab.pod_dns_drop("-D");
    assert!(o.status.success(), "{o:?}");
    assert!(
        !dropped.status.success(),
        "the query should have been dropped"
    );
    // A conntrack race (races.rs): the A query lost to an unresolvable clash.
    let rig = race::RaceRig::install(&lab, 300).unwrap();
    let shot = race::force_race(&lab, "raced.lab.test").unwrap();
    rig.remove().unwrap();
    assert!(!shot.a_answered, "{shot:?}");
    thread::sleep(Duration::from_millis(1500));
    for name in ["www.lab.test.", "alias.lab.test.", "nxdomain.lab.test."] {
        let _ = lab.dig(&["+time=2", "+tries=1", name, "A"]);
    }
    let _ = lab.dig(&["+tcp", "+time=2", "+tries=1", "www.lab.test.", "AAAA"]);
    thread::sleep(Duration::from_millis(700));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let live = ndjson(&out.stdout);

    let a = Command::new(lab::tracer::dnspath_bin())
        .args(["analyze", "-o", "json", "--timeout", "1", &file])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&a.stderr);
    assert!(a.status.success(), "{stderr}");
    let offline = ndjson(&String::from_utf8_lossy(&a.stdout));

    // What the comparison must contain to mean anything.
    let txs = comparable_transactions(&live, lab.prefix());
    let dropped_tx: Vec<&Value> = txs
        .iter()
        .filter(|t| t["question"]["name"] == "dropped.lab.test.")
        .collect();
    assert_eq!(dropped_tx.len(), 1, "{txs:#?}");
    assert_eq!(dropped_tx[0]["outcome"], "dropped", "{:#}", dropped_tx[0]);
    let leg_drop = dropped_tx[0]["legs"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|l| l["drop"].as_object())
        .unwrap_or_else(|| panic!("no leg drop: {:#}", dropped_tx[0]));
    assert_eq!(leg_drop["reason"], "NETFILTER_DROP");
    assert!(
        leg_drop["location"].as_str().unwrap().contains('+'),
        "{leg_drop:?}"
    );
    let answered = txs.iter().filter(|t| t["outcome"] == "answered").count();
    assert!(answered >= 4, "{txs:#?}");
    assert!(
        txs.iter().any(|t| t["legs"][0]["proto"] == "tcp"),
        "no TCP transaction: {txs:#?}"
    );
    let drops = comparable_drops(&live, lab.prefix());
    let ours = drops
        .iter()
        .find(|d| d["dns"]["questions"][0]["name"] == "dropped.lab.test.")
        .unwrap_or_else(|| panic!("no drop record of the query: {drops:#?}"));
    assert_eq!(
        ours["ct"]["orig"]["dst"],
        format!("{}:53", lab.cluster_ip())
    );
    assert!(
        ours["cpu"].is_u64() && ours["ifindex"].as_u64().unwrap() > 0,
        "{ours}"
    );

    let races = comparable_races(&live, lab.prefix());
    assert!(
        races.iter().any(|r| r["verdict"] == "race-drop"
            && r["dropped"]["question"]["name"] == "raced.lab.test."),
        "{races:#?}"
    );

    // Field by field.
    assert_eq!(
        races,
        comparable_races(&offline, lab.prefix()),
        "live and analyze of the -w file disagree on races"
    );
    assert_eq!(
        txs,
        comparable_transactions(&offline, lab.prefix()),
        "live and analyze of the -w file disagree on transactions"
    );
    assert_eq!(
        drops,
        comparable_drops(&offline, lab.prefix()),
        "live and analyze of the -w file disagree on drop records"
    );
    let live_drops = stats(&live)["drops"].as_u64().unwrap();
    assert_eq!(stats(&offline)["drops"], live_drops);
    assert!(
        stderr.contains(&format!(
            "{live_drops} kernel drops recorded by dnspath trace -w read back as drops"
        )) && !stderr.contains("warning"),
        "{stderr}"
    );
}

//! `cargo xtask bench`: offline decoding speed, dnspath against tshark on the same file;
//! then the live and storm sections (live.rs) in a lab.
//!
//! Writes a pcap of DNS traffic (Ethernet + IPv4 + UDP, queries and responses of several
//! names and types, EDNS, NXDOMAIN, CNAME chains) straight from Rust, so no network is
//! needed, then times `dnspath analyze FILE -o json` and
//! `tshark -r FILE -Y dns -T fields -e dns.qry.name -e dns.id`, both to /dev/null.
use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pcap_file::{
    pcap::{PcapHeader, PcapPacket, PcapWriter},
    DataLink, Endianness,
};

const DEFAULT_PACKETS: u64 = 1_000_000;
/// One run by default, so that the whole bench (offline, live, storm) stays under ~5 minutes.
const DEFAULT_RUNS: u32 = 1;

struct Options {
    packets: u64,
    runs: u32,
    keep: Option<PathBuf>,
    offline: bool,
    live: bool,
    storm: bool,
    lab: crate::live::LiveOptions,
}

const USAGE: &str =
    "usage: cargo xtask bench [--only offline,live,storm] [--packets N] [--runs N] \
[--keep FILE] [--rates QPS,QPS...] [--seconds N] [--storm-seconds N]";

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> crate::Result<T>
where
    T::Err: std::fmt::Display,
{
    v.parse().map_err(|e| format!("{flag} {v}: {e}"))
}

fn parse_args(args: &[String]) -> crate::Result<Options> {
    let mut o = Options {
        packets: DEFAULT_PACKETS,
        runs: DEFAULT_RUNS,
        keep: None,
        offline: true,
        live: true,
        storm: true,
        lab: crate::live::LiveOptions::default(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs {what}"))
        };
        match a.as_str() {
            "--packets" => o.packets = number(a, &value("a number")?)?,
            "--runs" => o.runs = number(a, &value("a number")?)?,
            "--keep" => o.keep = Some(PathBuf::from(value("a file name")?)),
            "--rates" => {
                o.lab.rates = value("rates")?
                    .split(',')
                    .map(|r| number(a, r.trim()))
                    .collect::<crate::Result<_>>()?
            }
            "--seconds" => o.lab.seconds = number(a, &value("a number")?)?,
            "--storm-seconds" => o.lab.storm_seconds = number(a, &value("a number")?)?,
            "--only" => {
                let v = value("sections")?;
                let parts: Vec<&str> = v.split(',').map(str::trim).collect();
                if let Some(bad) = parts
                    .iter()
                    .find(|p| !["offline", "live", "storm"].contains(p))
                {
                    return Err(format!("bench: --only: unknown section {bad}; {USAGE}"));
                }
                o.offline = parts.contains(&"offline");
                o.live = parts.contains(&"live");
                o.storm = parts.contains(&"storm");
            }
            other => return Err(format!("bench: unknown argument {other}; {USAGE}")),
        }
    }
    if o.packets == 0 || o.runs == 0 || o.lab.seconds == 0 || o.lab.storm_seconds == 0 {
        return Err(
            "bench: --packets, --runs, --seconds and --storm-seconds must be at least 1".into(),
        );
    }
    if o.lab.rates.is_empty() || o.lab.rates.contains(&0) {
        return Err("bench: --rates must be positive".into());
    }
    Ok(o)
}

// ---- DNS wire format (RFC 1035 §4), just enough for realistic messages ----

const T_A: u16 = 1;
const T_NS: u16 = 2;
const T_CNAME: u16 = 5;
const T_SOA: u16 = 6;
const T_PTR: u16 = 12;
const T_MX: u16 = 15;
const T_TXT: u16 = 16;
const T_AAAA: u16 = 28;
const T_SRV: u16 = 33;
const T_OPT: u16 = 41;
/// Compression pointer to the question name, which always starts at offset 12.
const QNAME_PTR: [u8; 2] = [0xc0, 0x0c];

fn put_name(m: &mut Vec<u8>, name: &str) {
    for label in name.trim_end_matches('.').split('.') {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
}

fn put_u16(m: &mut Vec<u8>, v: u16) {
    m.extend_from_slice(&v.to_be_bytes());
}

fn put_u32(m: &mut Vec<u8>, v: u32) {
    m.extend_from_slice(&v.to_be_bytes());
}

/// OPT pseudo-record (RFC 6891 §6.1.2), 1232-byte UDP size, with a client cookie on
/// queries.
fn put_opt(m: &mut Vec<u8>, cookie: Option<u64>) {
    m.push(0);
    put_u16(m, T_OPT);
    put_u16(m, 1232);
    put_u32(m, 0);
    match cookie {
        Some(c) => {
            put_u16(m, 12);
            put_u16(m, 10); // COOKIE (RFC 7873)
            put_u16(m, 8);
            m.extend_from_slice(&c.to_be_bytes());
        }
        None => put_u16(m, 0),
    }
}

/// An answer's rdata, written with its length.
enum Rdata<'a> {
    A([u8; 4]),
    Aaaa([u8; 16]),
    Name(&'a str),
    Mx(u16, &'a str),
    Srv(u16, u16, u16, &'a str),
    Txt(&'a str),
    Soa(&'a str, &'a str),
}

struct Rr<'a> {
    /// None: the question name, compressed.
    owner: Option<&'a str>,
    rtype: u16,
    ttl: u32,
    data: Rdata<'a>,
}

fn put_rr(m: &mut Vec<u8>, rr: &Rr) {
    match rr.owner {
        Some(n) => put_name(m, n),
        None => m.extend_from_slice(&QNAME_PTR),
    }
    put_u16(m, rr.rtype);
    put_u16(m, 1);
    put_u32(m, rr.ttl);
    let len_at = m.len();
    put_u16(m, 0);
    match &rr.data {
        Rdata::A(a) => m.extend_from_slice(a),
        Rdata::Aaaa(a) => m.extend_from_slice(a),
        Rdata::Name(n) => put_name(m, n),
        Rdata::Mx(pref, n) => {
            put_u16(m, *pref);
            put_name(m, n);
        }
        Rdata::Srv(prio, weight, port, n) => {
            put_u16(m, *prio);
            put_u16(m, *weight);
            put_u16(m, *port);
            put_name(m, n);
        }
        Rdata::Txt(t) => {
            m.push(t.len() as u8);
            m.extend_from_slice(t.as_bytes());
        }
        Rdata::Soa(mname, rname) => {
            put_name(m, mname);
            put_name(m, rname);
            for v in [2026010101u32, 7200, 1800, 86400, 30] {
                put_u32(m, v);
            }
        }
    }
    let rdlen = (m.len() - len_at - 2) as u16;
    m[len_at..len_at + 2].copy_from_slice(&rdlen.to_be_bytes());
}

struct Scenario {
    qname: &'static str,
    qtype: u16,
    rcode: u8,
    aa: bool,
    answers: Vec<Rr<'static>>,
    authority: Vec<Rr<'static>>,
}

fn scenarios() -> Vec<Scenario> {
    let rr = |owner, rtype, ttl, data| Rr {
        owner,
        rtype,
        ttl,
        data,
    };
    vec![
        Scenario {
            qname: "www.example.com.",
            qtype: T_A,
            rcode: 0,
            aa: false,
            answers: vec![
                rr(None, T_A, 300, Rdata::A([93, 184, 215, 14])),
                rr(None, T_A, 300, Rdata::A([93, 184, 215, 15])),
            ],
            authority: vec![],
        },
        Scenario {
            qname: "www.example.com.",
            qtype: T_AAAA,
            rcode: 0,
            aa: false,
            answers: vec![rr(
                None,
                T_AAAA,
                300,
                Rdata::Aaaa([
                    0x26, 0x06, 0x28, 0, 0x02, 0x20, 0, 1, 0x2, 0x48, 0x18, 0x93, 0x25, 0xc8, 0x19,
                    0x46,
                ]),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "kubernetes.default.svc.cluster.local.",
            qtype: T_A,
            rcode: 0,
            aa: true,
            answers: vec![rr(None, T_A, 30, Rdata::A([10, 96, 0, 1]))],
            authority: vec![],
        },
        Scenario {
            qname: "_http._tcp.api.default.svc.cluster.local.",
            qtype: T_SRV,
            rcode: 0,
            aa: true,
            answers: vec![rr(
                None,
                T_SRV,
                30,
                Rdata::Srv(0, 100, 80, "api.default.svc.cluster.local."),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "example.org.",
            qtype: T_TXT,
            rcode: 0,
            aa: false,
            answers: vec![rr(
                None,
                T_TXT,
                3600,
                Rdata::Txt("v=spf1 include:_spf.example.org -all"),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "10.0.96.10.in-addr.arpa.",
            qtype: T_PTR,
            rcode: 0,
            aa: true,
            answers: vec![rr(
                None,
                T_PTR,
                30,
                Rdata::Name("kube-dns.kube-system.svc.cluster.local."),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "nosuch.example.com.default.svc.cluster.local.",
            qtype: T_A,
            rcode: 3,
            aa: true,
            answers: vec![],
            authority: vec![rr(
                Some("cluster.local."),
                T_SOA,
                30,
                Rdata::Soa("ns.dns.cluster.local.", "hostmaster.cluster.local."),
            )],
        },
        Scenario {
            qname: "api.example.net.",
            qtype: T_A,
            rcode: 0,
            aa: false,
            answers: vec![
                rr(None, T_CNAME, 60, Rdata::Name("edge.cdn.example.net.")),
                rr(
                    Some("edge.cdn.example.net."),
                    T_A,
                    20,
                    Rdata::A([198, 51, 100, 7]),
                ),
            ],
            authority: vec![rr(
                Some("example.net."),
                T_NS,
                86400,
                Rdata::Name("ns1.example.net."),
            )],
        },
        Scenario {
            qname: "example.com.",
            qtype: T_MX,
            rcode: 0,
            aa: false,
            answers: vec![
                rr(None, T_MX, 3600, Rdata::Mx(10, "mx1.example.com.")),
                rr(None, T_MX, 3600, Rdata::Mx(20, "mx2.example.com.")),
            ],
            authority: vec![],
        },
    ]
}

fn dns_message(s: &Scenario, id: u16, response: bool, cookie: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(256);
    put_u16(&mut m, id);
    let flags: u16 = if response {
        0x8000 | 0x0100 | 0x0080 | if s.aa { 0x0400 } else { 0 } | u16::from(s.rcode)
    } else {
        0x0100
    };
    put_u16(&mut m, flags);
    put_u16(&mut m, 1);
    put_u16(&mut m, if response { s.answers.len() as u16 } else { 0 });
    put_u16(
        &mut m,
        if response {
            s.authority.len() as u16
        } else {
            0
        },
    );
    put_u16(&mut m, 1);
    put_name(&mut m, s.qname);
    put_u16(&mut m, s.qtype);
    put_u16(&mut m, 1);
    if response {
        for rr in s.answers.iter().chain(&s.authority) {
            put_rr(&mut m, rr);
        }
    }
    put_opt(&mut m, (!response).then_some(cookie));
    m
}

/// RFC 1071 checksum of the IPv4 header.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Ethernet + IPv4 + UDP frame around `payload`.
fn frame(src: ([u8; 4], u16), dst: ([u8; 4], u16), ip_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // dst MAC
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // src MAC
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_start = f.len();
    f.push(0x45);
    f.push(0);
    f.extend_from_slice(&((20 + 8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&ip_id.to_be_bytes());
    f.extend_from_slice(&0x4000u16.to_be_bytes()); // DF
    f.push(64);
    f.push(17);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&dst.0);
    let csum = ipv4_checksum(&f[ip_start..ip_start + 20]);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&csum.to_be_bytes());
    f.extend_from_slice(&src.1.to_be_bytes());
    f.extend_from_slice(&dst.1.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // UDP checksum optional over IPv4
    f.extend_from_slice(payload);
    f
}

/// A little-endian microsecond Ethernet pcap at `path`, written by pcap-file.
fn pcap_writer(path: &Path) -> crate::Result<PcapWriter<BufWriter<File>>> {
    let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let header = PcapHeader {
        snaplen: 262_144,
        datalink: DataLink::ETHERNET,
        endianness: Endianness::Little,
        ..PcapHeader::default()
    };
    PcapWriter::with_header(BufWriter::with_capacity(1 << 20, file), header)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// One whole frame seen at `ts_us` (µs since the epoch).
fn write_frame(
    w: &mut PcapWriter<BufWriter<File>>,
    ts_us: u64,
    frame: &[u8],
) -> Result<(), pcap_file::PcapError> {
    let ts = Duration::from_micros(ts_us);
    w.write_packet(&PcapPacket::new(ts, frame.len() as u32, frame))
        .map(drop)
}

/// Writes a little-endian microsecond pcap of `packets` DNS packets (queries and their
/// responses) to `path`; returns its size.
pub fn write_capture(path: &Path, packets: u64) -> crate::Result<u64> {
    let mut w = pcap_writer(path)?;
    let io = |e: pcap_file::PcapError| format!("{}: {e}", path.display());

    let scenarios = scenarios();
    let server = ([10, 96, 0, 10], 53u16);
    // 2026-01-01T00:00:00Z; a transaction every 50 µs, answered after 200-1000 µs.
    let mut t_us: u64 = 1_767_225_600_000_000;
    let mut written = 0u64;
    let mut i: u64 = 0;
    // Responses wait so that queries and responses interleave as on a busy resolver; the
    // heap keeps the file in timestamp order.
    let mut pending: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>> = BinaryHeap::new();
    while written < packets {
        let due = pending
            .peek()
            .is_some_and(|Reverse((ts, _, _))| *ts <= t_us);
        if due || packets - written <= pending.len() as u64 {
            if let Some(Reverse((ts, _, f))) = pending.pop() {
                write_frame(&mut w, ts, &f).map_err(io)?;
                written += 1;
                continue;
            }
        }
        let s = &scenarios[(i % scenarios.len() as u64) as usize];
        let client = (
            [10, 244, (1 + (i / 250) % 8) as u8, (2 + i % 250) as u8],
            32768 + (i % 28000) as u16,
        );
        let id = (i.wrapping_mul(40503) & 0xffff) as u16;
        let cookie = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let q = frame(client, server, id, &dns_message(s, id, false, cookie));
        write_frame(&mut w, t_us, &q).map_err(io)?;
        written += 1;
        let r = frame(
            server,
            client,
            id ^ 0x5555,
            &dns_message(s, id, true, cookie),
        );
        pending.push(Reverse((t_us + 200 + (i * 37) % 800, i, r)));
        t_us += 50;
        i += 1;
    }
    w.into_writer()
        .flush()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Unanswered repeats of one question in the bench's repeat capture.
const REPEATS: u64 = 100_000;

/// Writes a pcap of `packets` unanswered `A? same.lab.test.` queries, 20 µs apart: the first
/// half from as many sockets, the second from one socket with a new DNS id each (the shape
/// that once made correlate quadratic). Returns its size.
pub fn write_repeats_capture(path: &Path, packets: u64) -> crate::Result<u64> {
    let mut w = pcap_writer(path)?;
    let io = |e: pcap_file::PcapError| format!("{}: {e}", path.display());
    let s = Scenario {
        qname: "same.lab.test.",
        qtype: T_A,
        rcode: 0,
        aa: false,
        answers: Vec::new(),
        authority: Vec::new(),
    };
    let server = ([10, 250, 0, 53], 53u16);
    let t0_us: u64 = 1_767_225_600_000_000;
    let half = packets / 2;
    for i in 0..packets {
        let (sport, id) = if i < half {
            (
                1024 + (i % 50_000) as u16,
                (i.wrapping_mul(40503) & 0xffff) as u16,
            )
        } else {
            (60_000, (i & 0xffff) as u16)
        };
        let f = frame(
            ([10, 244, 1, 2], sport),
            server,
            i as u16,
            &dns_message(&s, id, false, 0),
        );
        write_frame(&mut w, t0_us + 20 * i, &f).map_err(io)?;
    }
    w.into_writer()
        .flush()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Times `dnspath analyze -o json` on [`REPEATS`] unanswered repeats of one question.
fn measure_repeats(dnspath: &Path, o: &Options) -> crate::Result<()> {
    let path =
        std::env::temp_dir().join(format!("dnspath-bench-repeats-{}.pcap", std::process::id()));
    let result = write_repeats_capture(&path, REPEATS).and_then(|_| {
        let file = path.to_string_lossy().into_owned();
        let mut times = Vec::new();
        for run in 1..=o.runs {
            let (t, stderr) =
                time_it(Command::new(dnspath).args(["analyze", &file, "-o", "json"]))?;
            eprintln!(
                "bench: run {run}: dnspath analyze -o json (unanswered repeats): {:.2} s",
                t.as_secs_f64()
            );
            let want = format!("{REPEATS} packets read, {REPEATS} decoded");
            if !stderr.contains(&want) {
                return Err(format!(
                    "repeats: not every packet decoded (expected \"{want}\"): {stderr}"
                ));
            }
            times.push(t);
        }
        Ok(median(times))
    });
    let _ = std::fs::remove_file(&path);
    let t = result?;
    println!(
        "  {:<40} {:>7.2} s {:>10.0} packets/s  ({REPEATS} unanswered queries of one question)",
        "dnspath analyze -o json (repeats)",
        t.as_secs_f64(),
        REPEATS as f64 / t.as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// Runs `cmd` with stdout to /dev/null; returns the wall time and stderr.
fn time_it(cmd: &mut Command) -> crate::Result<(Duration, String)> {
    let null = File::create("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    cmd.stdin(Stdio::null()).stdout(null).stderr(Stdio::piped());
    let start = Instant::now();
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({}): {stderr}", out.status));
    }
    Ok((took, stderr))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Machine, kernel and date, for the figures.
fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = crate::output_ok(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .unwrap_or_default();
    format!(
        "{} CPU(s): {}, Linux {}, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model(),
        kernel.trim(),
        date.trim()
    )
}

pub fn run(dnspath: &Path, args: &[String]) -> crate::Result<()> {
    let o = parse_args(args)?;
    println!("bench on {}", machine());
    if o.offline {
        run_offline(dnspath, &o)?;
    }
    if o.live || o.storm {
        crate::live::run(dnspath, &o.lab, o.live, o.storm)?;
    }
    Ok(())
}

fn run_offline(dnspath: &Path, o: &Options) -> crate::Result<()> {
    let tshark = crate::output_ok(Command::new("tshark").arg("--version"))
        .and_then(|v| v.lines().next().map(str::to_string))
        .ok_or("tshark does not run")?;
    let path = o.keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("dnspath-bench-{}.pcap", std::process::id()))
    });
    eprintln!(
        "bench: writing {} DNS packets to {}",
        o.packets,
        path.display()
    );
    let size = write_capture(&path, o.packets)?;
    let result = measure(dnspath, &path, o, size, &tshark);
    if o.keep.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    result?;
    measure_repeats(dnspath, o)
}

fn measure(dnspath: &Path, path: &Path, o: &Options, size: u64, tshark: &str) -> crate::Result<()> {
    let file = path.to_string_lossy().into_owned();
    // (label, program, arguments)
    let commands: [(&str, &Path, Vec<&str>); 3] = [
        (
            "dnspath analyze -o json",
            dnspath,
            vec!["analyze", &file, "-o", "json"],
        ),
        (
            "dnspath analyze -o json --view packets",
            dnspath,
            vec!["analyze", &file, "-o", "json", "--view", "packets"],
        ),
        (
            "tshark -Y dns -T fields",
            Path::new("tshark"),
            vec![
                "-r",
                &file,
                "-Y",
                "dns",
                "-T",
                "fields",
                "-e",
                "dns.qry.name",
                "-e",
                "dns.id",
            ],
        ),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); commands.len()];
    for run in 1..=o.runs {
        for (i, (label, program, args)) in commands.iter().enumerate() {
            let (t, stderr) = time_it(Command::new(program).args(args))?;
            eprintln!("bench: run {run}: {label}: {:.2} s", t.as_secs_f64());
            if *program == dnspath {
                let want = format!("{} packets read, {} decoded", o.packets, o.packets);
                if !stderr.contains(&want) {
                    return Err(format!(
                        "{label} did not decode every packet (expected \"{want}\"): {stderr}"
                    ));
                }
            }
            times[i].push(t);
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let rate = |d: Duration| o.packets as f64 / d.as_secs_f64().max(1e-9);
    println!(
        "{} packets ({:.0} MB pcap, Ethernet/IPv4/UDP DNS, {} transactions), median of {} run(s), {} CPU(s): {}",
        o.packets,
        size as f64 / 1e6,
        o.packets / 2,
        o.runs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        cpu_model()
    );
    for ((label, _, _), t) in commands.iter().zip(&medians) {
        println!(
            "  {label:<40} {:>7.2} s {:>10.0} packets/s",
            t.as_secs_f64(),
            rate(*t)
        );
    }
    println!("  ({tshark})");
    let tshark_t = medians[2].as_secs_f64();
    for ((label, _, _), t) in commands.iter().zip(&medians).take(2) {
        println!(
            "  {label}: {:.2}x tshark's speed",
            tshark_t / t.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}

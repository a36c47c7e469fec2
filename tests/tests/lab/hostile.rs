#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Nothing in a capture file, or in its name, can forge or garble `dnspath analyze`'s
//! output: interface names and file names holding terminal escapes and newlines are shown
//! escaped, and an interface name that is not UTF-8 is read lossily rather than ending the
//! file. Needs no root.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use lab::tracer::{dnspath_bin, ndjson};
use serde_json::Value;

/// What a hostile interface name would forge if printed raw: a colour, then a line of its
/// own that looks like a packet.
const EVIL_IFNAME: &[u8] =
    b"\x1b[31mFAKE\n21:00:00.000000 evil/eth0 out udp 1.2.3.4:53 > 5.6.7.8:53 forged.\r\x07";

fn put16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn opt(b: &mut Vec<u8>, code: u16, value: &[u8]) {
    put16(b, code);
    put16(b, value.len() as u16);
    b.extend_from_slice(value);
    b.resize(b.len().next_multiple_of(4), 0);
}
fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
    let len = 12 + body.len().next_multiple_of(4) as u32;
    put32(out, kind);
    put32(out, len);
    out.extend_from_slice(body);
    out.resize(out.len().next_multiple_of(4), 0);
    put32(out, len);
}

/// IPv4/UDP 10.0.0.1:40000 → 10.0.0.2:53, a query `id` for `www.lab.test. A`.
fn query(id: u16) -> Vec<u8> {
    let mut dns = id.to_be_bytes().to_vec();
    dns.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["www", "lab", "test"] {
        dns.push(label.len() as u8);
        dns.extend_from_slice(label.as_bytes());
    }
    dns.extend_from_slice(&[0, 0, 1, 0, 1]);
    let udp_len = 8 + dns.len() as u16;
    let total = 20 + udp_len;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&53u16.to_be_bytes());
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&dns);
    p
}

/// A pcapng (raw IP) with two interfaces, one named [`EVIL_IFNAME`], one `eth\xff0` (not
/// UTF-8), and a query seen on each.
fn hostile_pcapng() -> Vec<u8> {
    let mut out = Vec::new();
    let mut shb = Vec::new();
    put32(&mut shb, 0x1A2B_3C4D);
    put16(&mut shb, 1);
    put16(&mut shb, 0);
    shb.extend_from_slice(&[0xff; 8]);
    block(&mut out, 0x0A0D_0D0A, &shb);
    for name in [EVIL_IFNAME, b"eth\xff0"] {
        let mut idb = Vec::new();
        put16(&mut idb, 101);
        put16(&mut idb, 0);
        put32(&mut idb, 0);
        opt(&mut idb, 2, name);
        opt(&mut idb, 0, &[]);
        block(&mut out, 1, &idb);
    }
    for (iface, id) in [(0u32, 0x1234u16), (1, 0x1235)] {
        let p = query(id);
        let mut epb = Vec::new();
        put32(&mut epb, iface);
        put32(&mut epb, 0);
        put32(&mut epb, 1_000_000 + iface);
        put32(&mut epb, p.len() as u32);
        put32(&mut epb, p.len() as u32);
        epb.extend_from_slice(&p);
        epb.resize(epb.len().next_multiple_of(4), 0);
        opt(&mut epb, 2, &2u32.to_le_bytes());
        opt(&mut epb, 0, &[]);
        block(&mut out, 6, &epb);
    }
    out
}

/// A scratch directory, removed afterwards.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn analyze(file: &Path, extra: &[&str]) -> Output {
    Command::new(dnspath_bin())
        .arg("analyze")
        .arg(file)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Whether `c` may appear raw in output: printable, or a line end.
fn allowed(c: char) -> bool {
    c == '\n'
        || !(c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}'))
}

/// `HH:MM:SS.micros ` at the start of a line.
fn starts_with_time(l: &str) -> bool {
    let b = l.as_bytes();
    b.len() > 16
        && b[..15].iter().enumerate().all(|(i, c)| match i {
            2 | 5 => *c == b':',
            8 => *c == b'.',
            _ => c.is_ascii_digit(),
        })
        && b[15] == b' '
}

#[test]
fn hostile_interface_and_file_names_are_escaped() {
    use std::os::unix::ffi::OsStrExt;
    assert!(
        dnspath_bin().exists(),
        "dnspath binary missing at {}; run `cargo xtask test`",
        dnspath_bin().display()
    );
    let dir = Scratch(std::env::temp_dir().join(format!("dnspath-hostile-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    // The file's stem names the namespace: ESC, a newline and a byte that is not UTF-8.
    let file = dir
        .0
        .join(std::ffi::OsStr::from_bytes(b"node\x1b[7m\nEVIL\xff.pcapng"));
    std::fs::write(&file, hostile_pcapng()).unwrap();

    let o = analyze(&file, &["--view", "packets"]);
    let stdout = String::from_utf8(o.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let raw: Vec<char> = stdout.chars().filter(|&c| !allowed(c)).collect();
    assert!(raw.is_empty(), "raw {raw:?} in stdout:\n{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "two packets and the stats:\n{stdout}");
    for l in &lines[..2] {
        assert!(starts_with_time(l), "not a packet line: {l:?}");
        assert!(l.ends_with(" A? www.lab.test. (58)"), "{l:?}");
        assert!(l.contains("node\\x1b[7m\\x0aEVIL\u{fffd}/"), "{l:?}");
    }
    assert!(
        lines[0].contains("/\\x1b[31mFAKE\\x0a21:00:00.000000 evil/eth0"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("/eth\u{fffd}0 out udp"), "{}", lines[1]);
    assert!(lines[2].starts_with("--- 2 packets"), "{}", lines[2]);
    // Nor on stderr, where the file's name and the repaired block are reported.
    assert!(!stderr.chars().any(|c| !allowed(c)), "{stderr:?}");
    assert!(stderr.contains("read without them"), "{stderr}");
    assert!(stderr.contains("if_name is not UTF-8"), "{stderr}");

    // JSON: valid UTF-8 NDJSON, the hostile name whole (escaped by JSON), the name that
    // was not UTF-8 lossily converted, not dropped.
    let o = analyze(&file, &["-o", "json", "--view", "packets"]);
    assert!(o.status.success());
    assert!(!o.stdout.contains(&0x1b), "raw ESC in JSON");
    let stdout = String::from_utf8(o.stdout).unwrap();
    let recs: Vec<Value> = ndjson(&stdout);
    assert_eq!(recs.len(), 3);
    assert_eq!(
        recs[0]["ifname"].as_str().unwrap().as_bytes(),
        EVIL_IFNAME,
        "{}",
        recs[0]
    );
    assert_eq!(recs[1]["ifname"], "eth\u{fffd}0");
    assert_eq!(recs[0]["netns"], "node\x1b[7m\nEVIL\u{fffd}");
}

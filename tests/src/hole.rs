//! A DNS server that receives and never answers: a bound UDP socket nobody reads, at
//! [`HOLE_ADDR`] in a pod namespace of its own (the lab's servers would answer on any new
//! address), routed from the lab's node like the lab's own pods. For unanswered queries.
//! And its sibling, a server that answers late ([`Hole::slow`], at [`SLOW_ADDR`]): there is
//! no netem here, so "an upstream slower than the client waits" is a small UDP server that
//! holds every answer.
use std::process::{Child, Command};

use crate::{Lab, LabError};

/// The hole's address: `dig @10.250.0.54 â¦` from the client goes unanswered.
pub const HOLE_ADDR: &str = "10.250.0.54";

/// The slow server's address ([`Hole::slow`]).
pub const SLOW_ADDR: &str = "10.250.0.55";

/// The slow server: answers every query (`A 10.250.0.80`, whatever was asked) after a delay,
/// `copies` times 5 ms apart; stops by itself after two minutes.
const SLOW_SERVER: &str = r#"
import socket, sys, threading, time
addr, delay, copies = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 53))
s.settimeout(1.0)
def answer(q, peer):
    time.sleep(delay)
    i = 12
    while i < len(q) and q[i]:
        i += q[i] + 1
    end = i + 5
    if end > len(q):
        return
    h = bytearray(q[:12])
    h[2] |= 0x84
    h[3] = 0x80
    h[6:12] = b"\0\1\0\0\0\0"
    a = bytes(h) + q[12:end] + b"\xc0\x0c\0\1\0\1\0\0\0\x1e\0\x04" + bytes([10, 250, 0, 80])
    for n in range(copies):
        if n:
            time.sleep(0.1)
        s.sendto(a, peer)
deadline = time.time() + 120
while time.time() < deadline:
    try:
        q, peer = s.recvfrom(4096)
    except socket.timeout:
        continue
    if len(q) > 12:
        threading.Thread(target=answer, args=(q, peer), daemon=True).start()
"#;

/// The namespace `<prefix>-hole` and the process holding the socket; both gone on drop.
pub struct Hole {
    ns: String,
    sink: Option<Child>,
}

impl Hole {
    pub fn new(lab: &Lab) -> Result<Self, LabError> {
        let bind = format!(
            "import socket,time; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('{HOLE_ADDR}', 53)); time.sleep(60)"
        );
        Self::start(lab, "hole", HOLE_ADDR, &["python3", "-c", &bind])
    }

    /// A server at [`SLOW_ADDR`] (namespace `<prefix>-slow`) that answers every query after
    /// `delay`, `copies` times, 100 ms apart (a client that took the first has closed its
    /// socket by the next, even on a busy machine).
    pub fn slow(lab: &Lab, delay: std::time::Duration, copies: u32) -> Result<Self, LabError> {
        let delay = format!("{:.3}", delay.as_secs_f64());
        let copies = copies.to_string();
        let args = ["python3", "-c", SLOW_SERVER, SLOW_ADDR, &delay, &copies];
        Self::start(lab, "slow", SLOW_ADDR, &args)
    }

    /// Any server (`server`: its command line) in a pod namespace of its own,
    /// `<prefix>-NAME`, at `addr` (a /32 routed from the node like the lab's pods).
    pub fn serving(lab: &Lab, name: &str, addr: &str, server: &[&str]) -> Result<Self, LabError> {
        Self::start(lab, name, addr, server)
    }

    fn start(lab: &Lab, name: &str, addr: &str, server: &[&str]) -> Result<Self, LabError> {
        let ns = format!("{}-{name}", lab.prefix());
        let run = |args: &[&str]| -> Result<(), LabError> {
            let cmd = format!("ip {}", args.join(" "));
            let o = Command::new("ip")
                .args(args)
                .output()
                .map_err(|source| LabError::Spawn {
                    cmd: cmd.clone(),
                    source,
                })?;
            if o.status.success() {
                Ok(())
            } else {
                Err(LabError::Command {
                    cmd,
                    status: o.status.to_string(),
                    stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
                })
            }
        };
        run(&["netns", "add", &ns])?;
        // From here on, dropping `hole` deletes the namespace (and the veth with it).
        let mut hole = Hole {
            ns: ns.clone(),
            sink: None,
        };
        let node = lab.node_ns();
        let ns = ns.as_str();
        run(&[
            "-n", node, "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])?;
        run(&["-n", ns, "link", "set", "lo", "up"])?;
        run(&["-n", ns, "link", "set", "eth0", "up"])?;
        let cidr = format!("{addr}/32");
        run(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
        run(&[
            "-n",
            ns,
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        run(&["-n", ns, "route", "add", "default", "via", "169.254.1.1"])?;
        run(&["-n", node, "addr", "add", "169.254.1.1/32", "dev", ns])?;
        run(&["-n", node, "link", "set", ns, "up"])?;
        run(&["-n", node, "route", "add", &cidr, "dev", ns])?;
        hole.sink = Some(lab.spawn_in(ns, server)?);
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(hole)
    }

    /// The namespace's name.
    pub fn ns(&self) -> &str {
        &self.ns
    }
}

impl Drop for Hole {
    fn drop(&mut self) {
        if let Some(mut sink) = self.sink.take() {
            let _ = sink.kill();
            let _ = sink.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

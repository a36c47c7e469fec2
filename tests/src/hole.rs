//! A DNS server that receives and never answers: a bound UDP socket nobody reads, at
//! [`HOLE_ADDR`] in a pod namespace of its own (the lab's servers would answer on any new
//! address), routed from the lab's node like the lab's own pods. For unanswered queries.
use std::process::{Child, Command};

use crate::{Lab, LabError};

/// The hole's address: `dig @10.250.0.54 …` from the client goes unanswered.
pub const HOLE_ADDR: &str = "10.250.0.54";

/// The namespace `<prefix>-hole` and the process holding the socket; both gone on drop.
pub struct Hole {
    ns: String,
    sink: Option<Child>,
}

impl Hole {
    pub fn new(lab: &Lab) -> Result<Self, LabError> {
        let ns = format!("{}-hole", lab.prefix());
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
        let cidr = format!("{HOLE_ADDR}/32");
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
        let bind = format!(
            "import socket,time; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('{HOLE_ADDR}', 53)); time.sleep(60)"
        );
        hole.sink = Some(lab.spawn_in(ns, &["python3", "-c", &bind])?);
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

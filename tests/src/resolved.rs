//! A real systemd-resolved as a namespace's loopback stub (127.0.0.53), the node resolver of
//! systemd-resolved nodes. Debian's package is only unpacked (`cargo xtask setup`, into
//! [`RESOLVED_DIR`]): installing it would take over the machine's /etc/resolv.conf. Its binary
//! runs inside a lab namespace with a mount namespace of its own (`unshare -m`, private
//! propagation), where a tmpfs on `/run/systemd` takes its runtime files
//! (`/run/systemd/resolve/resolv.conf`, `stub-resolv.conf`), a directory of this lab is
//! `/etc/systemd` (its `resolved.conf`), and copies of `/etc/passwd` and `/etc/group` carry the
//! `systemd-resolve` user it drops to. It runs without D-Bus (it waits for the bus socket,
//! which never comes, and serves meanwhile) and without systemd's notify socket. Nothing of
//! the machine changes; its files are seen through `/proc/PID/root`.
use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{Lab, LabError};

/// Where `cargo xtask setup` unpacks Debian's systemd-resolved (`dpkg -x`).
pub const RESOLVED_DIR: &str = "/var/cache/dnspath-lab/systemd-resolved";

/// The unpacked binary, if `cargo xtask setup` has unpacked it.
pub fn binary() -> Option<PathBuf> {
    let p = Path::new(RESOLVED_DIR).join("lib/systemd/systemd-resolved");
    p.exists().then_some(p)
}

/// A running systemd-resolved; stopped (SIGKILL) on drop, the rest goes with the lab.
pub struct Resolved {
    server: Option<Child>,
    pid: u32,
    conf: String,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> LabError {
    move |source| LabError::Io { what, source }
}

/// An id from 990 down that neither `/etc/passwd` nor `/etc/group` uses.
fn free_id(passwd: &str, group: &str) -> u32 {
    let used: Vec<u32> = passwd
        .lines()
        .chain(group.lines())
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    (900..=990).rev().find(|i| !used.contains(i)).unwrap_or(990)
}

impl Resolved {
    /// Starts systemd-resolved in namespace `ns` with `DNS=` the `upstreams` (the
    /// `[Resolve]` section of its `/etc/systemd/resolved.conf`, line 2), its stub on
    /// 127.0.0.53 and on `extra_listen` (`DNSStubListenerExtra=`, e.g. the node's address
    /// pods reach it at), no LLMNR or mDNS; returns once the stub answers. `None` when the
    /// package is not unpacked (`cargo xtask setup`).
    pub fn start(
        lab: &Lab,
        ns: &str,
        upstreams: &[IpAddr],
        extra_listen: Option<IpAddr>,
    ) -> Result<Option<Resolved>, LabError> {
        let Some(bin) = binary() else {
            return Ok(None);
        };
        let dir = lab.temp_dir().join("resolved");
        let etc = dir.join("etc-systemd");
        fs::create_dir_all(&etc).map_err(io(format!("creating {}", etc.display())))?;
        let dns: Vec<String> = upstreams.iter().map(IpAddr::to_string).collect();
        let mut conf = format!(
            "[Resolve]\nDNS={}\nLLMNR=no\nMulticastDNS=no\nDNSSEC=no\nCache=no\n",
            dns.join(" ")
        );
        if let Some(a) = extra_listen {
            conf.push_str(&format!("DNSStubListenerExtra={a}\n"));
        }
        let conf_path = etc.join("resolved.conf");
        fs::write(&conf_path, &conf).map_err(io(format!("writing {}", conf_path.display())))?;
        let passwd = fs::read_to_string("/etc/passwd").map_err(io("reading /etc/passwd".into()))?;
        let group = fs::read_to_string("/etc/group").map_err(io("reading /etc/group".into()))?;
        let id = free_id(&passwd, &group);
        let passwd =
            format!("{passwd}systemd-resolve:x:{id}:{id}:systemd Resolver:/:/usr/sbin/nologin\n");
        let group = format!("{group}systemd-resolve:x:{id}:\n");
        fs::write(dir.join("passwd"), passwd).map_err(io("writing passwd".into()))?;
        fs::write(dir.join("group"), group).map_err(io("writing group".into()))?;
        let d = dir.to_string_lossy();
        let script = format!(
            "set -e\n\
             mount -t tmpfs -o mode=0755 tmpfs /run/systemd\n\
             mount --bind {d}/etc-systemd /etc/systemd\n\
             mount --bind {d}/passwd /etc/passwd\n\
             mount --bind {d}/group /etc/group\n\
             ip link set lo up\n\
             exec env -u NOTIFY_SOCKET -u WATCHDOG_USEC SYSTEMD_LOG_TARGET=console SYSTEMD_LOG_LEVEL=info {}\n",
            bin.display()
        );
        let log = fs::File::create(dir.join("resolved.log"))
            .map_err(io("creating resolved.log".into()))?;
        let log2 = log.try_clone().map_err(io("resolved.log".into()))?;
        let mut cmd = lab.command_in(
            ns,
            &[
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ],
        );
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let server = lab.spawn(&mut cmd)?;
        // `ip netns exec`, `unshare` and `sh` each exec the next: one PID throughout.
        let pid = server.id();
        let r = Resolved {
            server: Some(server),
            pid,
            conf,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            // `localhost` is resolved's own answer: the stub is up, no upstream asked.
            let probe = [
                "dig",
                "+time=1",
                "+tries=1",
                "@127.0.0.53",
                "localhost.",
                "A",
            ];
            let o = lab.exec(ns, &probe);
            if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("127.0.0.1") {
                return Ok(Some(r));
            }
            if Instant::now() > deadline {
                let log = fs::read_to_string(dir.join("resolved.log")).unwrap_or_default();
                return Err(LabError::Config(format!(
                    "systemd-resolved did not answer on 127.0.0.53 within 15 s:\n{log}"
                )));
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Its PID: its files are under `/proc/PID/root`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its `/etc/systemd/resolved.conf`.
    pub fn conf(&self) -> &str {
        &self.conf
    }

    /// A file as it sees it (e.g. `/run/systemd/resolve/resolv.conf`).
    pub fn path(&self, p: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{p}", self.pid))
    }
}

impl Drop for Resolved {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

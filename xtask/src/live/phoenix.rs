//! Arize Phoenix as the OTLP receiver of the exporting agent: the live section's export rows
//! and the soak (which kills and restarts it as a fault).
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use lab::Lab;

/// Where `cargo xtask setup` installs it.
const PHOENIX: &str = "/var/cache/dnspath-lab/phoenix/bin/phoenix";

/// Arize Phoenix in the node namespace, as the OTLP receiver.
pub(super) struct Receiver {
    child: Option<Child>,
    http: u16,
    dir: PathBuf,
    ns: String,
}

impl Receiver {
    pub(super) fn start(lab: &Lab) -> Option<Receiver> {
        if !Path::new(PHOENIX).exists() {
            eprintln!("soak: {PHOENIX} missing (`cargo xtask setup`): no OTLP receiver");
            return None;
        }
        let dir = lab.temp_dir().join("phoenix");
        let _ = fs::create_dir_all(&dir);
        let mut r = Receiver {
            child: None,
            http: 20_000 + (std::process::id() % 20_000) as u16,
            dir,
            ns: lab.node_ns().to_owned(),
        };
        r.restart();
        Some(r)
    }
    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }
    /// A receiver that takes what it is sent, for the next bench row: Phoenix ingests a
    /// 10 s export's spans for minutes after the load ends (~170 spans/s on the bench's 2
    /// cores) and takes nothing meanwhile, so it is started again, its backlog dropped, and
    /// given time to listen. One that had exited says why (its log's end).
    pub(super) fn restart_for_row(&mut self) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            let log = fs::read_to_string(self.dir.join("phoenix.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            eprintln!(
                "bench: Phoenix had exited ({status}); its log ended:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        self.restart();
        thread::sleep(Duration::from_secs(10));
    }
    pub(super) fn restart(&mut self) {
        self.kill();
        let log = fs::File::create(self.dir.join("phoenix.log")).ok();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, PHOENIX, "serve"])
            .env("PHOENIX_WORKING_DIR", &self.dir)
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", self.http.to_string())
            .env("PHOENIX_GRPC_PORT", (self.http + 1).to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdin(Stdio::null());
        if let Some(l) = log {
            if let Ok(l2) = l.try_clone() {
                cmd.stdout(l).stderr(l2);
            }
        }
        self.child = cmd.spawn().ok();
    }
    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

//! Helpers more than one module of the lab tests uses, written once.
use std::path::{Path, PathBuf};

use lab::{
    tracer::{dnspath_bin, require_tools, root_or_skip},
    DnsPodConfig, DnsServerKind, Lab, LabConfig,
};
use serde_json::Value;

/// A lab of `cfg` for a test that runs `dnspath`, or `None` when root tests are skipped
/// ([`root_or_skip`]); fails the test if the binary is not built.
pub fn lab_of(cfg: LabConfig) -> Option<Lab> {
    if !root_or_skip("network namespaces, eBPF") {
        return None;
    }
    assert!(
        dnspath_bin().exists(),
        "dnspath binary missing at {}; run `cargo xtask test`",
        dnspath_bin().display()
    );
    match Lab::start(cfg) {
        Ok(lab) => Some(lab),
        Err(e) => panic!("lab: {e}"),
    }
}

/// [`lab_of`] the default lab.
pub fn lab() -> Option<Lab> {
    lab_of(LabConfig::default())
}

/// [`lab`], for a test that also needs `tools` on PATH (it fails without them: a test must
/// not pass without running).
pub fn lab_with_tools(tools: &[&str]) -> Option<Lab> {
    if !root_or_skip("network namespaces, eBPF") {
        return None;
    }
    require_tools(tools);
    lab()
}

/// The records of type `t` (`packet`, `transaction`, …).
pub fn of_type<'a>(recs: &'a [Value], t: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["type"] == t).collect()
}

/// A record's first question's name.
pub fn qname(r: &Value) -> Option<&str> {
    r["dns"]["questions"][0]["name"].as_str()
}

/// `dig ARGS` from the lab's client, which must succeed; its standard output.
pub fn dig_ok(lab: &Lab, args: &[&str]) -> String {
    let out = lab.dig(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "dig {args:?} failed: {stdout}");
    stdout
}

/// A dnsdist pod forwarding to the cluster DNS Service: a forwarding loop as soon as a
/// question it cannot answer comes.
pub fn dnsdist_to_cluster_ip() -> DnsPodConfig {
    DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip()
}

/// The repository's `deploy/` folder.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A cgroup of this test's in one hierarchy (v1 `memory`/`cpu`, or v2), removed on drop after
/// its processes are moved back to this test's own.
pub struct TestCgroup {
    pub dir: PathBuf,
    back: PathBuf,
}

impl TestCgroup {
    /// `/sys/fs/cgroup/CONTROLLER/NAME` (v1) or `/sys/fs/cgroup/NAME` (v2, controller enabled).
    pub fn new(controller: &str, name: &str) -> Option<TestCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let (mount, path) = if std::fs::read_to_string(v2)
            .is_ok_and(|c| c.split_whitespace().any(|w| w == controller))
        {
            let p = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            (PathBuf::from("/sys/fs/cgroup"), p.to_owned())
        } else {
            let mount = PathBuf::from(format!("/sys/fs/cgroup/{controller}"));
            let p = own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, c, p) = (parts.next()?, parts.next()?, parts.next()?);
                c.split(',').any(|c| c == controller).then(|| p.to_owned())
            })?;
            (mount, p)
        };
        let dir = mount.join(name);
        std::fs::create_dir(&dir).ok()?;
        Some(TestCgroup {
            dir,
            back: mount.join(path.trim_start_matches('/')),
        })
    }

    pub fn set(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("{}/{file} = {value}: {e}", self.dir.display()));
    }

    pub fn add(&self, pid: u32) {
        self.set("cgroup.procs", &pid.to_string());
    }

    pub fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            let _ = std::fs::write(self.back.join("cgroup.procs"), pid);
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}

/// Healthy load from the lab's client pod: 8 clients asking one name 25 times each, retries
/// allowed; returns when all are done.
pub fn many_clients_one_name(lab: &Lab) {
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let mut c = lab.command_in(
                lab.client_ns(),
                &[
                    "sh",
                    "-c",
                    "for i in $(seq 25); do dig +time=2 +tries=3 www.lab.test. A >/dev/null; done",
                ],
            );
            lab.spawn(&mut c)
                .unwrap_or_else(|e| panic!("a dig loop: {e}"))
        })
        .collect();
    for mut w in workers {
        if let Err(e) = w.wait() {
            panic!("a dig loop: {e}");
        }
    }
}

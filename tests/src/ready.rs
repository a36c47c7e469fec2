//! Readiness: polling until every server the lab started answers (or listens), and failing
//! early when one of them exits.
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::{addr, process, Lab, LabError, Pod};

impl Lab {
    pub(super) fn wait_ready(&self) -> Result<(), LabError> {
        let deadline = Instant::now() + self.cfg.readiness_timeout;
        self.wait_answer(IpAddr::V4(addr::UPSTREAM), false, deadline)?;
        self.wait_answer(IpAddr::V6(addr::UPSTREAM6), false, deadline)?;
        for i in 0..self.dns_ns.len() {
            self.wait_dns_pod(i, deadline)?;
        }
        // Probing the Service through a pod that forwards back into it would start the
        // very loop a test wants to observe from its beginning.
        let backends: Vec<usize> = match self.cfg.pin_backend {
            Some(p) => vec![p],
            None => (0..self.dns_ns.len()).collect(),
        };
        if backends
            .iter()
            .all(|&i| self.cfg.dns_pods[i].forwards_to_upstream())
        {
            self.wait_answer(IpAddr::V4(addr::CLUSTER_IP), false, deadline)?;
            self.wait_answer(IpAddr::V4(addr::CLUSTER_IP), true, deadline)?;
        }
        Ok(())
    }

    pub(super) fn wait_dns_pod(&self, i: usize, deadline: Instant) -> Result<(), LabError> {
        if self.cfg.dns_pods[i].forwards_to_upstream() {
            self.wait_answer(IpAddr::V4(addr::dns_pod(i)), false, deadline)
        } else {
            self.wait_listening(Pod::Dns(i), deadline)
        }
    }

    /// Fails if a server the lab started has exited.
    fn check_servers(&self) -> Result<(), LabError> {
        let mut procs = self.procs();
        for t in procs.iter_mut() {
            let Some(child) = t.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                let log = t.log.clone().unwrap_or_default();
                return Err(LabError::ServerExited {
                    process: t.label.clone(),
                    status: status.to_string(),
                    log_tail: process::log_tail(&log, 2000),
                    log: log.display().to_string(),
                });
            }
        }
        Ok(())
    }

    /// Polls `dig @server www.lab.test A` from the client until it answers 10.250.0.80.
    fn wait_answer(&self, server: IpAddr, tcp: bool, deadline: Instant) -> Result<(), LabError> {
        let at = format!("@{server}");
        let mut args = vec!["+time=1", "+tries=1", "+short", at.as_str()];
        if tcp {
            args.push("+tcp");
        }
        let name = format!("www.{}", addr::ZONE);
        args.extend([name.as_str(), "A"]);
        let want = addr::WWW_A.to_string();
        let start = Instant::now();
        loop {
            let out = self.dig(&args);
            let stdout = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && stdout.lines().any(|l| l.trim() == want) {
                return Ok(());
            }
            self.check_servers()?;
            if Instant::now() >= deadline {
                return Err(LabError::NotReady {
                    target: server.to_string(),
                    probe: format!("dig {}", args.join(" ")),
                    waited: start.elapsed(),
                    detail: format!(
                        "{}; stdout: {} stderr: {}",
                        out.status,
                        stdout.trim(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls until something listens on UDP port 53 in `pod`.
    fn wait_listening(&self, pod: Pod, deadline: Instant) -> Result<(), LabError> {
        let ss = self.tools.ss.to_string_lossy().into_owned();
        let args = [ss.as_str(), "-Hlun", "sport = :53"];
        let start = Instant::now();
        loop {
            let out = self.exec(self.ns_of(pod), &args);
            if out.status.success() && !out.stdout.is_empty() {
                return Ok(());
            }
            self.check_servers()?;
            if Instant::now() >= deadline {
                return Err(LabError::NotReady {
                    target: self.ns_of(pod).to_owned(),
                    probe: args.join(" "),
                    waited: start.elapsed(),
                    detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

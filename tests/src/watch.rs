//! A child process watched while it runs: its stderr read line by line on a thread of its
//! own (so a caller can wait for the line that says it is ready), its stdout, when piped,
//! consumed by a reader of the caller's on another thread (held whole, or filtered line by
//! line so that hundreds of MB of output cost no memory).
use std::{
    io::{BufRead, BufReader},
    process::{Child, ChildStdout, ExitStatus},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use crate::LabError;

/// A running child; `T` is what its stdout reader returns.
pub struct Watched<T> {
    child: Child,
    /// How errors name it (`dnspath`, a command line).
    name: String,
    stdout: Option<thread::JoinHandle<T>>,
    stderr: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

/// What a watched child left when it ended.
#[derive(Debug)]
pub struct Finished<T> {
    /// `None` if waiting for it failed.
    pub status: Option<ExitStatus>,
    /// What the stdout reader returned (`T::default()` when stdout was not piped).
    pub stdout: T,
    /// Every stderr line, joined by newlines.
    pub stderr: String,
}

impl<T: Default + Send + 'static> Watched<T> {
    /// Watches `child` (spawned with stderr piped; stdout piped to be read by
    /// `read_stdout`, or not piped at all). `name` is how errors name it.
    pub fn new(
        mut child: Child,
        name: impl Into<String>,
        read_stdout: impl FnOnce(ChildStdout) -> T + Send + 'static,
    ) -> Self {
        let stdout = child
            .stdout
            .take()
            .map(|out| thread::spawn(move || read_stdout(out)));
        let (tx, rx) = mpsc::channel();
        if let Some(err) = child.stderr.take() {
            thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Watched {
            child,
            name: name.into(),
            stdout,
            stderr: rx,
            stderr_seen: Vec::new(),
        }
    }

    /// Waits up to `timeout` for a stderr line containing `needle`.
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.stderr_seen.push(line);
                    if hit {
                        return Ok(());
                    }
                }
                Err(_) => {
                    return Err(LabError::NotPrinted {
                        process: self.name.clone(),
                        needle: needle.to_owned(),
                        stderr: self.stderr_seen.join("\n"),
                    })
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it `sig` (it has not been reaped yet, so the PID is still its own).
    pub fn signal(&self, sig: i32) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, which we have not reaped yet.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// Polls until it has exited, for at most `timeout`: whether it has.
    pub fn exited_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
                _ => return false,
            }
        }
    }

    /// Waits for it to exit, then collects what it printed.
    pub fn finish(self) -> Finished<T> {
        self.finish_draining(Duration::from_millis(200))
    }

    /// As [`Watched::finish`], reading stderr until it closes or stays quiet for `quiet`
    /// (a child of the child may hold it open).
    pub fn finish_draining(mut self, quiet: Duration) -> Finished<T> {
        let status = self.child.wait().ok();
        let stdout = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        while let Ok(line) = self.stderr.recv_timeout(quiet) {
            self.stderr_seen.push(line);
        }
        Finished {
            status,
            stdout,
            stderr: self.stderr_seen.join("\n"),
        }
    }
}

/// A stdout reader that keeps everything.
pub fn read_all(mut out: ChildStdout) -> String {
    let mut s = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut s);
    s
}

/// A stdout reader that keeps the lines `keep` accepts, without their line ends.
pub fn keep_lines(keep: fn(&str) -> bool) -> impl FnOnce(ChildStdout) -> Vec<String> {
    move |out| {
        let mut kept = Vec::new();
        let mut r = BufReader::with_capacity(1 << 20, out);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            if keep(&line) {
                kept.push(line.trim_end().to_owned());
            }
            line.clear();
        }
        kept
    }
}

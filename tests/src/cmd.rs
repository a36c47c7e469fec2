//! Running the lab's helper commands.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::LabError;

/// `prog arg arg ...` for error messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` with `input` on stdin (if any); fails unless it exits 0.
pub(crate) fn run(cmd: &mut Command, input: Option<&str>) -> Result<Output, LabError> {
    let what = describe(cmd);
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| LabError::Spawn {
        cmd: what.clone(),
        source,
    })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| LabError::io(format!("writing stdin of `{what}`"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| LabError::io(format!("waiting for `{what}`"), e))?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: if input.is_some() {
                format!("{what} <<< {}", input.unwrap_or_default().trim_end())
            } else {
                what
            },
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out)
}

/// Where the lab looks for tools besides `$PATH`: a test harness may run without the
/// sbin directories that hold `ip`, `named` and `dnsmasq`.
const FALLBACK_DIRS: [&str; 4] = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// Absolute path of `tool`, or the package to install.
pub(crate) fn find_tool(tool: &'static str, package: &'static str) -> Result<PathBuf, LabError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| is_executable(p))
        .ok_or(LabError::MissingTool { tool, package })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Tools the lab runs, resolved once at start.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub(crate) ip: PathBuf,
    pub(crate) sysctl: PathBuf,
    pub(crate) iptables_restore: PathBuf,
    pub(crate) conntrack: PathBuf,
    pub(crate) named: PathBuf,
    pub(crate) dig: PathBuf,
    pub(crate) ss: PathBuf,
    pub(crate) dnsdist: Option<PathBuf>,
    pub(crate) dnsmasq: Option<PathBuf>,
}

use std::time::Duration;

/// Why a lab could not be built (or a lab command could not run).
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("the lab needs root (network namespaces, veths, iptables); running as uid {0}")]
    NotRoot(u32),
    #[error("`{tool}` not found in PATH: install the Debian package `{package}`")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error("invalid lab config: {0}")]
    Config(String),
    #[error(
        "no free lab prefix after {0} attempts (names in /run/netns, /tmp or /etc/netns taken)"
    )]
    NoFreePrefix(u32),
    #[error("could not start `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{process} exited during start-up ({status}); log {log}:\n{log_tail}")]
    ServerExited {
        process: String,
        status: String,
        log: String,
        log_tail: String,
    },
    #[error("{process} did not print {needle:?}; stderr so far:\n{stderr}")]
    NotPrinted {
        process: String,
        needle: String,
        stderr: String,
    },
    #[error("{target} did not answer `{probe}` within {waited:?}: {detail}")]
    NotReady {
        target: String,
        probe: String,
        waited: Duration,
        detail: String,
    },
}

impl LabError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

//! What `stats.evidence` says (docs/output.md): the counts of the evidence sinks
//! (`crate::evidence`: the annotation's wait, `-w`, `--record`). Here, with the other
//! records, so that output/ does not depend on evidence/.
use serde::Serialize;

/// What went into pcapng files (the `stats` record's `evidence`; docs/output.md).
#[derive(Clone, Debug, Default, Serialize)]
pub struct EvidenceStats {
    /// How packets left the wait for their annotation.
    #[serde(flatten)]
    pub annotate: AnnotateStats,
    /// `-w`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write: Option<WriteStats>,
    /// `--record`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordStats>,
}

/// How packets left the wait (in the `stats` record's `evidence`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct AnnotateStats {
    /// Packets and drops released with a transaction's annotation.
    pub annotated: u64,
    /// Released when `max_delay` passed with no transaction claiming them (TCP control
    /// segments, answers whose query was not seen, …).
    pub unclaimed: u64,
    /// Released early because the held packets exceeded the buffer: written without the
    /// annotation that might still have come.
    pub early: u64,
}

/// What `-w` wrote (in the `stats` record's `evidence`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct WriteStats {
    pub packets: u64,
    pub drops: u64,
    /// Files created.
    pub files: u64,
    /// Files deleted to keep `-W` of them.
    pub files_deleted: u64,
    /// Why the files stopped (read-only or full directory, …); the trace went on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// What the recorder did (in the `stats` record's `evidence`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecordStats {
    pub incidents: u64,
    /// Files written.
    pub files: u64,
    /// Incidents recorded in no file: over the rate limit, or after a write error.
    pub not_written: u64,
    /// Files deleted to keep DIR under its size.
    pub files_deleted: u64,
    /// Packets left out of a file because it would exceed the ring's size.
    pub packets_cut: u64,
    /// The last write error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

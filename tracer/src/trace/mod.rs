//! `dnspath trace`: the live engine ([`crate::engine`]) with trace's sinks: the text/NDJSON
//! writer, `--otlp`'s exporter, and its stop policy (`--count`, `--until loop`).
mod writer;

pub use crate::engine::{run_live, LiveError, LiveSummary, RunOptions};
pub use crate::evidence::EvidenceOptions;
pub use crate::output::otlp::OtlpSink;
pub use crate::runner::stop::StopPolicy;
pub use writer::TraceWriter;

use crate::output::{
    filter::Filter,
    otlp::{Exporter, Identity, OtlpConfig},
    sink::Sinks,
    summarize::SummarySink,
    Format, View,
};

/// What `trace` writes, and when it stops on its own.
#[derive(Clone, Debug)]
pub struct OutputOptions {
    pub format: Format,
    pub view: View,
    /// Stop after this many packet records.
    pub count: Option<u64>,
    /// Stop as soon as a forwarding loop is reported.
    pub until_loop: bool,
    /// What is written (`--pod`, `--name`, …); every stage still sees everything.
    pub filter: Filter,
    /// What NDJSON lines carry besides the record: `trace_id`, `--node-name`.
    pub identity: Identity,
}

/// `trace`'s sinks from its options: `--otlp`'s exporter if asked, the run's summary (with
/// transactions: text on stderr, JSON to the writer), then the text/NDJSON writer to `out`
/// (last: it takes the records); and its stop policy (`--count`,
/// `--until loop`). The evidence (`-w`, `--record`) is added by [`run_live`], which has
/// the run's clock and names.
pub fn output_sinks(
    opts: &OutputOptions,
    out: Box<dyn std::io::Write + Send>,
    otlp: Option<OtlpConfig>,
) -> Result<(Sinks<'static>, StopPolicy), LiveError> {
    let mut sinks = Sinks::new();
    if let Some(cfg) = otlp {
        let exporter = Exporter::start(cfg)?;
        sinks.push(Box::new(OtlpSink::new(exporter)));
    }
    if opts.view.transactions() {
        sinks.push(Box::new(SummarySink::new(
            opts.format,
            opts.filter.clone(),
            Box::new(std::io::stderr()),
        )));
    }
    sinks.push(Box::new(TraceWriter::new(opts, out)?));
    Ok((sinks, StopPolicy::new(opts.count, opts.until_loop)))
}

//! `dnspath analyze`'s command line: a capture file through the same stages as `trace`.
use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use dnspath::{
    analyze::{self, AnalyzeError, AnalyzeOptions, NodeCapture},
    output::{Format, View},
};

use crate::{
    args::FilterArgs,
    units::{parse_secs, Secs},
};

#[derive(Args)]
pub struct AnalyzeArgs {
    /// pcap or pcapng file; `-` reads standard input. Several files: one capture per node,
    /// each `NAME=FILE` or `FILE` (the node is the file's name without extension); a query
    /// that crossed nodes is one transaction with every node's legs.
    #[arg(value_name = "FILE", required = true, num_args = 1..)]
    files: Vec<std::ffi::OsString>,
    /// Decode UDP/TCP packets from or to this port (repeatable); the others are skipped
    /// and counted on stderr.
    #[arg(short, long = "port", default_values_t = [53u16])]
    ports: Vec<u16>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// What to show [default: transactions for text, both for json].
    #[arg(long, value_enum)]
    view: Option<View>,
    /// Seconds (of capture time) after which an unanswered query counts as timed out, e.g.
    /// `5`, `1.5`, `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = parse_secs)]
    timeout: Secs,
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(a: AnalyzeArgs) -> anyhow::Result<ExitCode> {
    let captures: Vec<NodeCapture> = a.files.iter().map(NodeCapture::parse).collect();
    if captures.len() > 1 {
        for (i, c) in captures.iter().enumerate() {
            if c.path.as_os_str() == "-" {
                anyhow::bail!(
                    "`-` (standard input) is one capture alone, not one of several nodes'"
                );
            }
            if captures[..i].iter().any(|o| o.node == c.node) {
                anyhow::bail!(
                    "two captures of node {:?}: name each as NAME=FILE",
                    dnspath::output::escape(&c.node)
                );
            }
        }
    }
    let opts = AnalyzeOptions {
        path: a
            .files
            .first()
            .map_or_else(|| PathBuf::from("-"), PathBuf::from),
        view: a.view.unwrap_or(View::default_for(a.output)),
        format: a.output,
        timeout: a.timeout.positive("--timeout")?,
        ports: a.ports,
        filter: a.filter.filter()?,
    };
    let out = Box::new(std::io::stdout());
    let result = if captures.len() > 1 {
        analyze::run_nodes(opts, &captures, out).map(|_| ())
    } else {
        analyze::run(opts, out).map(|_| ())
    };
    match result {
        // `dnspath analyze big.pcap | head`: the reader has what it wanted.
        Err(AnalyzeError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => {
            r?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

//! `dnspath analyze`'s command line: a capture file through the same stages as `trace`.
use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use dnspath::{
    analyze::{self, AnalyzeError, AnalyzeOptions},
    output::{Format, View},
};

use crate::{
    args::FilterArgs,
    units::{parse_secs, Secs},
};

#[derive(Args)]
pub struct AnalyzeArgs {
    /// pcap or pcapng file; `-` reads standard input.
    #[arg(value_name = "FILE")]
    file: PathBuf,
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
    let opts = AnalyzeOptions {
        path: a.file,
        view: a.view.unwrap_or(View::default_for(a.output)),
        format: a.output,
        timeout: a.timeout.positive("--timeout")?,
        ports: a.ports,
        filter: a.filter.filter()?,
    };
    let out = Box::new(std::io::stdout());
    match analyze::run(opts, out) {
        // `dnspath analyze big.pcap | head`: the reader has what it wanted.
        Err(AnalyzeError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => {
            r?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

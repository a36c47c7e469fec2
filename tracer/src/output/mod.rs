//! Sinks: terminal text and NDJSON.
pub mod record;
pub mod text;

use std::io::{self, Write};

pub use record::Record;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One readable line per event.
    Text,
    /// NDJSON: one object per event, with a `type` field.
    Json,
}

/// What to show: every packet, the transactions they make up, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// One record per DNS message at each point it was seen.
    Packets,
    /// One record per finished transaction: the client's question, every leg it caused
    /// (DNAT, forwarders), every hop, latencies and the outcome.
    Transactions,
    /// Both.
    Both,
}

impl View {
    pub fn packets(self) -> bool {
        self != View::Transactions
    }
    pub fn transactions(self) -> bool {
        self != View::Packets
    }
}

/// Where records go.
pub trait Sink {
    fn write(&mut self, record: &Record) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

pub struct JsonSink<W: Write> {
    out: W,
}

impl<W: Write> JsonSink<W> {
    pub fn new(out: W) -> Self {
        Self { out }
    }
}

impl<W: Write> Sink for JsonSink<W> {
    fn write(&mut self, record: &Record) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

pub fn sink(format: Format, out: Box<dyn Write + Send>) -> Box<dyn Sink + Send> {
    match format {
        Format::Text => Box::new(text::TextSink::new(out)),
        Format::Json => Box::new(JsonSink::new(out)),
    }
}

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

//! Records and their sinks: the [`sink::Sink`] trait and list every mode writes through,
//! terminal text and NDJSON.
pub mod evidence;
pub mod filter;
pub mod otlp;
pub mod pods;
pub mod queue;
pub mod record;
pub mod report;
pub mod sink;
pub mod summarize;
pub mod summary;
pub mod tally;
pub mod text;
pub mod writer;

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
    /// Without `--view`: transactions on a terminal's text, both in NDJSON.
    pub fn default_for(format: Format) -> View {
        match format {
            Format::Text => View::Transactions,
            Format::Json => View::Both,
        }
    }
    pub fn packets(self) -> bool {
        self != View::Transactions
    }
    pub fn transactions(self) -> bool {
        self != View::Packets
    }
}

pub use crate::show::escape;

/// Where records are written one at a time: a text or NDJSON formatter, or a queue in front
/// of one. (What a run's turns go to is a [`sink::Sink`].)
pub trait RecordWriter {
    fn write(&mut self, record: &Record) -> io::Result<()>;
    /// [`RecordWriter::write`] of a record the caller is done with: a writer that keeps records (a
    /// [`queue::QueuedSink`]) takes it without a copy.
    fn write_owned(&mut self, record: Record) -> io::Result<()> {
        self.write(&record)
    }
    fn flush(&mut self) -> io::Result<()>;
}

pub struct JsonSink<W: Write> {
    out: W,
    /// One record's line, reused: serde_json writes its many small pieces into memory and
    /// the sink hands the line over in one write.
    line: Vec<u8>,
    /// `analyze` of several nodes' captures: the `node` of the records written next.
    node: Option<String>,
    /// What every line carries besides the record: `trace_id`, the run's `node`.
    identity: otlp::Identity,
}

impl<W: Write> JsonSink<W> {
    pub fn new(out: W, identity: otlp::Identity) -> Self {
        Self {
            out,
            line: Vec::with_capacity(4096),
            node: None,
            identity,
        }
    }

    /// The node the next records come from, written as their `node` (in place of
    /// `--node-name`'s); `None`: the run's own, if any.
    pub fn set_node(&mut self, node: Option<&str>) {
        self.node = node.map(str::to_string);
    }
}

impl<W: Write> RecordWriter for JsonSink<W> {
    fn write(&mut self, record: &Record) -> io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record)?;
        self.identity
            .extend_json_as(record, &mut self.line, self.node.as_deref());
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// The text or NDJSON writer of `format` (NDJSON lines carrying `identity`'s fields).
pub fn sink(
    format: Format,
    out: Box<dyn Write + Send>,
    identity: &otlp::Identity,
) -> Box<dyn RecordWriter + Send> {
    match format {
        Format::Text => Box::new(text::TextSink::new(out)),
        Format::Json => Box::new(JsonSink::new(out, identity.clone())),
    }
}

#[cfg(test)]
mod fields;

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escape_shows_controls_and_invisibles_and_keeps_the_rest() {
        assert!(matches!(escape("eth0"), std::borrow::Cow::Borrowed("eth0")));
        assert_eq!(escape("\x1b[7mEVIL\x1b[0m"), "\\x1b[7mEVIL\\x1b[0m");
        assert_eq!(escape("a\nb\r\tc\0"), "a\\x0ab\\x0d\\x09c\\x00");
        assert_eq!(escape("\u{7f}\u{9b}"), "\\x7f\\x9b");
        assert_eq!(
            escape("x\u{202e}y\u{200b}z\u{2028}"),
            "x\\u{202e}y\\u{200b}z\\u{2028}"
        );
        // Printable text, lossy replacements and DNS presentation escapes stay as they are.
        for s in [
            "pid42:coredns",
            "µs café 名前",
            "eth\u{fffd}0",
            "a\\032b\\.c.",
            "",
        ] {
            assert_eq!(escape(s), s);
        }
        // Escaping twice changes nothing more.
        let once = escape("\x1b\n\u{202e}").into_owned();
        assert_eq!(escape(&once), once);
    }
}

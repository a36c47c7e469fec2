//! A whole capture file through `dnspath analyze`'s stages (pcap/pcapng reader, link and
//! IP headers, IP fragment and DNS-over-TCP reassembly, DNS decode, correlate, JSON): no
//! panic, and every packet read is accounted for in the final `stats` record (decoded,
//! cut, malformed, TCP, other, summarised or in fragments) — the invariant of
//! tests/src/tracer.rs's `assert_accounted`.
#![no_main]
use std::{
    io::{Cursor, Read, Write},
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use dnspath::{
    analyze::{analyze_source, AnalyzeOptions},
    names::Names,
    output::{Format, View},
    source::file::FileSource,
};
use libfuzzer_sys::fuzz_target;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let names = Arc::new(RwLock::new(Names::default()));
    let reader: Box<dyn Read + Send> = Box::new(Cursor::new(data.to_vec()));
    let Ok(source) = FileSource::from_reader(reader, "fuzz".into(), "fuzz".into(), names.clone())
    else {
        return;
    };
    let opts = AnalyzeOptions {
        path: "fuzz".into(),
        format: Format::Json,
        view: View::Both,
        timeout: Duration::from_secs(5),
        ports: Vec::new(),
        filter: Default::default(),
    };
    let out = Captured::default();
    if analyze_source(source, names, &opts, Box::new(out.clone())).is_err() {
        return;
    }
    let Ok(bytes) = out.0.lock().map(|v| v.clone()) else {
        return;
    };
    let text = String::from_utf8(bytes).expect("the JSON output is UTF-8");
    let last = text.lines().last().expect("a stats record at the end");
    let stats: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(stats["type"], "stats", "{last}");
    let n = |k: &str| stats[k].as_u64().unwrap_or_else(|| panic!("stats.{k}: {last}"));
    let per_packet = n("decoded") + n("capture_truncated") + n("malformed") - n("tcp_messages")
        + n("tcp_control")
        + n("tcp_data")
        + n("other")
        + n("summarised")
        + n("fragments_merged")
        + n("fragments_incomplete")
        + n("fragments_pending");
    assert_eq!(n("packets"), per_packet, "packets not accounted for: {last}");
});

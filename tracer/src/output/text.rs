//! One readable line per event, tcpdump/dig-like:
//! `21:17:27.123456 client/eth0 out udp 10.244.1.2:41234 > 10.96.0.10:53 4660+ A? www.lab.test. (41)`
use std::io::{self, Write};

use super::{
    record::{DropRecord, PacketRecord, StatsRecord},
    Record, Sink,
};

pub struct TextSink<W: Write> {
    out: W,
}

impl<W: Write> TextSink<W> {
    pub fn new(out: W) -> Self {
        Self { out }
    }
}

/// `HH:MM:SS.micros` from an RFC 3339 time.
fn clock(time: &str) -> &str {
    time.get(11..26).unwrap_or(time)
}

fn short_dir(dir: &str) -> &'static str {
    match dir {
        "ingress" => "in ",
        "egress" => "out",
        _ => "   ",
    }
}

pub fn packet_line(p: &PacketRecord) -> String {
    let what = match (&p.dns, &p.malformed) {
        (Some(m), _) => m.summary_line(),
        (None, Some(why)) => format!("MALFORMED: {why}"),
        (None, None) => String::new(),
    };
    let vlan = p.vlan.map(|v| format!(" vlan {v}")).unwrap_or_default();
    format!(
        "{} {}/{}{} {} {} {} > {} {} ({})",
        clock(&p.time),
        p.netns,
        p.ifname,
        vlan,
        short_dir(p.dir),
        p.proto,
        p.src,
        p.dst,
        what,
        p.len
    )
}

pub fn drop_line(d: &DropRecord) -> String {
    let ct = d
        .ct
        .as_ref()
        .map(|ct| {
            format!(
                " ct[{:#x} {}{} orig {} > {} reply {} > {}]",
                ct.status,
                ct.status_flags.join(","),
                if ct.confirmed { "" } else { ",UNCONFIRMED" },
                ct.orig.src,
                ct.orig.dst,
                ct.reply.src,
                ct.reply.dst
            )
        })
        .unwrap_or_default();
    let what = match (&d.dns, &d.malformed) {
        (Some(m), _) => m.summary_line(),
        (None, Some(why)) => format!("(undecoded: {why})"),
        (None, None) => String::new(),
    };
    let at = if d.ifname.is_empty() {
        d.netns.clone()
    } else {
        format!("{}/{}", d.netns, d.ifname)
    };
    format!(
        "{} DROP {} {} {} > {} reason {} at {} cpu {}{} {}",
        clock(&d.time),
        at,
        d.proto,
        d.src,
        d.dst,
        d.reason,
        d.location,
        d.cpu,
        ct,
        what
    )
}

pub fn stats_line(s: &StatsRecord) -> String {
    let mut line = format!(
        "--- {} packets, {} DNS messages decoded, {} malformed, {} TCP control segments, {} lost, {} drops",
        s.packets, s.decoded, s.malformed, s.tcp_control, s.lost, s.drops
    );
    if s.drops_benign > 0 {
        line.push_str(&format!(" ({} of them normal socket life, not shown)", s.drops_benign));
    }
    if s.drops_lost > 0 {
        line.push_str(&format!(" ({} drops lost)", s.drops_lost));
    }
    if let Some(k) = &s.kernel {
        line.push_str(&format!(
            "; kernel: {} matched, {} ring-buffer full, {} header parse failures",
            k.packets_matched, k.packets_lost_ringbuf, k.parse_failed
        ));
    }
    line
}

impl<W: Write> Sink for TextSink<W> {
    fn write(&mut self, record: &Record) -> io::Result<()> {
        let line = match record {
            Record::Packet(p) => packet_line(p),
            // Normal socket life; counted in the totals, listed in JSON.
            Record::Drop(d) if d.benign.is_some() => return Ok(()),
            Record::Drop(d) => drop_line(d),
            Record::Stats(s) => stats_line(s),
        };
        writeln!(self.out, "{line}")
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

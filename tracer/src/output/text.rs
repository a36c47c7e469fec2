//! One readable line per event, tcpdump/dig-like:
//! `21:17:27.123456 client/eth0 out udp 10.244.1.2:41234 > 10.96.0.10:53 4660+ A? www.lab.test. (41)`
use std::io::{self, Write};

use super::{
    record::{
        DropRecord, FragmentLossRecord, LegRecord, PacketRecord, StatsRecord, TransactionRecord,
    },
    report, Record, RecordWriter,
};
use crate::{
    event::Direction,
    show::{at, escape as esc, record_clock, wall_clock},
};

pub struct TextSink<W: Write> {
    out: W,
    /// `analyze` of several nodes' captures: the node of the records written next, before
    /// each (`[node-a] `).
    node: Option<String>,
}

impl<W: Write> TextSink<W> {
    pub fn new(out: W) -> Self {
        Self { out, node: None }
    }

    /// The node the next records come from (`None`: no prefix).
    pub fn set_node(&mut self, node: Option<&str>) {
        self.node = node.map(|n| format!("[{}] ", esc(n)));
    }
}

fn short_dir(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => "in ",
        Direction::Egress => "out",
        Direction::Unknown => "   ",
    }
}

/// ` vxlan vni=1 10.200.0.1 > 10.200.0.2` after a place seen inside a tunnel (numbers and
/// addresses only: nothing to escape).
fn tunnel(t: Option<&crate::decode::tunnel::Tunnel>) -> String {
    t.map(|t| format!(" {t}")).unwrap_or_default()
}

pub fn packet_line(p: &PacketRecord) -> String {
    let what = match (&p.dns, &p.malformed) {
        (Some(m), _) => esc(&m.summary_line()).into_owned(),
        (None, Some(why)) => format!("MALFORMED: {}", esc(why)),
        (None, None) if p.capture_truncated => {
            "[|domain: the capture cut the DNS header]".to_string()
        }
        (None, None) => String::new(),
    };
    let vlan = p.vlan.map(|v| format!(" vlan {v}")).unwrap_or_default();
    format!(
        "{} {}{}{} {} {} {} > {} {} ({})",
        record_clock(p.time),
        at(&p.netns, &p.ifname, p.pod_ref()),
        vlan,
        tunnel(p.tunnel.as_deref()),
        short_dir(p.dir),
        p.proto,
        p.src,
        p.dst,
        what,
        p.len
    )
}

/// `21:17:29.000001 FRAGMENT LOSS node/vp-dnsa in udp 10.250.0.53:53 > 10.244.1.2:41234 ip id 0x1a2b (timeout): answer 4660 TXT? big.lab.test. of 3 fragments: …`
pub fn fragment_loss_line(f: &FragmentLossRecord) -> String {
    format!(
        "{} FRAGMENT LOSS {}/{} {} {} {} > {} ip id {:#x} ({}): {}",
        record_clock(f.time),
        esc(&f.netns),
        esc(&f.ifname),
        short_dir(f.dir),
        f.proto,
        esc(&f.src),
        esc(&f.dst),
        f.ip_id,
        f.cause,
        esc(&f.summary)
    )
}

pub fn drop_line(d: &DropRecord) -> String {
    let ct =
        d.ct.as_ref()
            .map(|ct| {
                format!(
                    " ct[{:#x} {}{} orig {} > {} reply {} > {}]",
                    ct.status,
                    esc(&ct.status_flags.join(",")),
                    if ct.confirmed { "" } else { ",UNCONFIRMED" },
                    esc(&ct.orig.src),
                    esc(&ct.orig.dst),
                    esc(&ct.reply.src),
                    esc(&ct.reply.dst)
                )
            })
            .unwrap_or_default();
    let what = match (&d.dns, &d.malformed) {
        (Some(m), _) => esc(&m.summary_line()).into_owned(),
        (None, Some(why)) => format!("(undecoded: {})", esc(why)),
        (None, None) => String::new(),
    };
    let at = at(&d.netns, &d.ifname, d.pod_ref());
    let fragment = d
        .fragment
        .as_ref()
        .map(|f| match (f.number, f.fragments, f.total_len) {
            (Some(n), Some(m), Some(total)) => format!(
                " ip id {:#x} fragment {n} of {m} (bytes {}-{} of {total})",
                f.ip_id,
                f.offset,
                f.offset + f.len
            ),
            _ => format!(" ip id {:#x} fragment at {}", f.ip_id, f.offset),
        })
        .unwrap_or_default();
    format!(
        "{} DROP {} {} {} > {}{} reason {} at {} cpu {}{} {}",
        record_clock(d.time),
        at,
        d.proto,
        esc(&d.src),
        esc(&d.dst),
        fragment,
        esc(&d.reason),
        esc(&d.location),
        d.cpu,
        ct,
        what
    )
}

use crate::time::format_duration as dur;

fn leg_line(l: &LegRecord) -> String {
    use crate::correlate::record::LegOutcome;
    let nat = if l.pod_proxy.is_some() {
        format!(" ⇒REDIRECT {}", l.backend)
    } else if l.backend != l.server {
        format!(" ⇒DNAT {}", l.backend)
    } else {
        String::new()
    };
    let result = match (l.outcome, &l.rcode) {
        (LegOutcome::Answered, Some(rc)) => match &l.answer_cut {
            Some(c) => format!(
                "{} (cut by the capture at {} of {} bytes)",
                esc(rc),
                c.captured_bytes,
                c.message_bytes
            ),
            None => esc(rc).into_owned(),
        },
        (LegOutcome::Truncated, Some(rc)) => format!("{} truncated", esc(rc)),
        (LegOutcome::Late, rc) => match &l.drop {
            Some(d) => format!(
                "LATE {} after the client gave up ({} at {}, {})",
                esc(rc.as_deref().unwrap_or("")),
                esc(&d.reason),
                esc(&d.location),
                at(&d.netns, &d.ifname, d.pod_ref())
            ),
            None => "LATE".to_string(),
        },
        (LegOutcome::Dropped, _) => match &l.drop {
            Some(d) => format!(
                "DROPPED {} at {} ({}){}",
                esc(&d.reason),
                esc(&d.location),
                at(&d.netns, &d.ifname, d.pod_ref()),
                d.fragments
                    .as_ref()
                    .map(|p| format!(": {}", p.describe()))
                    .unwrap_or_default()
            ),
            None => "DROPPED".to_string(),
        },
        _ => "no answer".to_string(),
    };
    let lat = l
        .latency_ns
        .map(|n| format!(" {}", dur(n)))
        .unwrap_or_default();
    let retx = if l.retransmits > 0 {
        format!(", {} retransmit(s)", l.retransmits)
    } else {
        String::new()
    };
    let cache = match l.node_cache {
        Some(c) => format!(", node cache {}", c.as_str()),
        None => String::new(),
    };
    let proxy = match l.pod_proxy {
        Some(p) => format!(", pod proxy {}", p.as_str()),
        None => String::new(),
    };
    let node = match &l.node {
        Some(n) => format!(", node {}", esc(n)),
        None => String::new(),
    };
    let role = match l.role {
        crate::correlate::LegRole::Retry => "retry: ",
        crate::correlate::LegRole::TcpFallback => "tcp retry: ",
        _ => "",
    };
    format!(
        "{role}{} {} → {}{nat} id {}: {result}{lat} [{} join, {} hop{}{retx}{cache}{proxy}{node}]",
        l.proto,
        l.client,
        l.server,
        l.dns_id,
        l.join.as_str(),
        l.hops.len(),
        if l.hops.len() == 1 { "" } else { "s" }
    )
}

fn hops_line(l: &LegRecord) -> String {
    let start = l.hops.first().map(|h| h.ts_ns).unwrap_or(0);
    let mut parts = Vec::new();
    for (i, h) in l.hops.iter().enumerate() {
        // Responses are marked, the way back is the second half of the line.
        let arrow = if h.qr && l.hops.get(i.wrapping_sub(1)).is_some_and(|p| !p.qr) {
            "⇐ "
        } else {
            ""
        };
        let dir = match h.dir {
            crate::event::Direction::Ingress => "in",
            crate::event::Direction::Egress => "out",
            crate::event::Direction::Unknown => "",
        };
        parts.push(format!(
            "{arrow}{}{} {dir} +{}",
            at(&h.netns, &h.ifname, h.pod_ref()),
            tunnel(h.tunnel.as_deref()),
            dur(h.ts_ns.saturating_sub(start))
        ));
    }
    parts.join(" · ")
}

pub fn transaction_block(t: &TransactionRecord) -> String {
    let mut out = format!(
        "{} {} {} asks {} {}: {}",
        wall_clock(t.wall_ns),
        at(&t.client_netns, "", &t.pod),
        t.client,
        esc(&t.question.name),
        t.question.qtype,
        esc(&report::transaction_summary(t))
    );
    if t.lookup.step > 0 {
        out.push_str(&format!(
            "  (lookup {} step {})",
            t.lookup.id,
            t.lookup.step + 1
        ));
    }
    out.push('\n');
    // Depth-first over the leg tree, roots in time order.
    fn walk(t: &TransactionRecord, parent: Option<usize>, depth: usize, out: &mut String) {
        for (i, l) in t
            .legs
            .iter()
            .enumerate()
            .filter(|(_, l)| l.parent == parent)
        {
            let pad = "    ".repeat(depth);
            out.push_str(&format!("  {pad}└ {}\n", leg_line(l)));
            out.push_str(&format!("  {pad}    {}\n", hops_line(l)));
            walk(t, Some(i), depth + 1, out);
        }
    }
    walk(t, None, 0, &mut out);
    out.pop();
    out
}

pub fn stats_line(s: &StatsRecord) -> String {
    let d = &s.decode;
    let mut line = format!(
        "--- {} packets, {} DNS messages decoded, {} malformed, {} TCP control segments, {} lost, {} drops",
        d.packets, d.decoded, d.malformed, d.tcp_control, d.lost, d.drops
    );
    if d.capture_truncated > 0 {
        line.push_str(&format!(
            ", {} cut by the capture's snaplen (decoded as far as they go)",
            d.capture_truncated
        ));
    }
    if d.drops_benign > 0 {
        line.push_str(&format!(
            " ({} of them normal socket life, not shown)",
            d.drops_benign
        ));
    }
    if d.drops_lost > 0 {
        line.push_str(&format!(" ({} drops lost)", d.drops_lost));
    }
    if d.summarised > 0 {
        line.push_str(&format!(", {} loop packets only counted", d.summarised));
    }
    if d.shed > 0 {
        line.push_str(&format!(
            ", {} loop packets only counted in the kernel (never copied)",
            d.shed
        ));
    }
    if s.not_written > 0 {
        line.push_str(&format!(
            ", {} decoded after the --count stop (not shown)",
            s.not_written
        ));
    }
    for q in s.sinks.iter().filter(|q| q.dropped > 0) {
        line.push_str(&format!(
            ", {} records dropped at {} (its reader did not keep up)",
            q.dropped, q.name
        ));
    }
    if s.unread > 0 {
        line.push_str(&format!(
            ", {} matched by the kernel but still queued at the stop (not read)",
            s.unread
        ));
    }
    if d.fragments_merged + d.fragments_incomplete + d.fragments_pending > 0 {
        line.push_str(&format!(
            ", {} IP datagrams reassembled ({} fragments merged), {} incomplete ({} fragments; {} reported lost, {} evicted)",
            d.datagrams_reassembled,
            d.fragments_merged,
            d.datagrams_lost + d.datagrams_evicted,
            d.fragments_incomplete + d.fragments_pending,
            d.datagrams_lost,
            d.datagrams_evicted
        ));
    }
    if let Some(k) = &d.kernel {
        line.push_str(&format!(
            "; kernel: {} matched, {} ring-buffer full, {} header parse failures",
            k.counters.packets_matched, k.counters.packets_lost_ringbuf, k.counters.parse_failed
        ));
        if let Some(setup) = &k.setup {
            if setup.attach_failures > 0 {
                line.push_str(&format!(
                    ", {} interfaces not attached",
                    setup.attach_failures
                ));
            }
            for d in &setup.degraded {
                line.push_str(&format!("; degraded: {}", esc(d)));
            }
        }
    }
    line
}

impl<W: Write> RecordWriter for TextSink<W> {
    fn write(&mut self, record: &Record) -> io::Result<()> {
        let line = match record {
            Record::Packet(p) => packet_line(p),
            // Normal socket life; counted in the totals, listed in JSON.
            Record::Drop(d) if d.benign.is_some() => return Ok(()),
            Record::Drop(d) => drop_line(d),
            Record::Transaction(t) => transaction_block(t),
            Record::Detected(d) => d.get().text(),
            Record::FragmentLoss(f) => fragment_loss_line(f),
            Record::Stats(s) => stats_line(s),
            Record::Summary(s) => super::summary::summary_text(s),
        };
        match &self.node {
            Some(n) => writeln!(self.out, "{n}{line}"),
            None => writeln!(self.out, "{line}"),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests;

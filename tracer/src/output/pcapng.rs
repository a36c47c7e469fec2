//! `trace -w FILE`: every captured packet, as captured (from the IP header on, up to the
//! snaplen, original length kept), into a pcapng file Wireshark and tshark open — one
//! interface block per (network namespace, interface), named `netns/ifname`, nanosecond
//! timestamps, direction in `epb_flags`, and a comment per packet saying where dnspath saw it
//! and what it decoded. Kernel drops go in too, as the dropped packet on an interface block of
//! their own (`dnspath/drops`) with the drop's reason and location in the comment.
//!
//! Written with pcap-file's pcapng writer. A write error (disk full, file gone) stops the
//! file — what was written stays readable — and is reported once; the trace goes on.
use std::{borrow::Cow, collections::HashMap, io::Write, time::Duration};

use pcap_file::{
    pcapng::{
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
            section_header::{SectionHeaderBlock, SectionHeaderOption},
        },
        PcapNgWriter,
    },
    DataLink, Endianness,
};

use crate::{
    event::{CapturedPacket, Direction, KernelDrop},
    names::{place, SharedNames},
    output::{
        escape,
        record::{DropRecord, PacketRecord},
    },
    time::Clock,
};

pub use crate::source::file::DROPS_IFNAME;

#[derive(Debug, thiserror::Error)]
pub enum PcapngError {
    #[error("writing the pcapng file: {}", describe(.0))]
    Write(#[from] pcap_file::PcapError),
}

pub struct PcapngSink<W: Write> {
    w: Option<PcapNgWriter<W>>,
    clock: Clock,
    names: SharedNames,
    snaplen: u32,
    /// (netns cookie, ifindex) → interface id in the file and its `if_name`, named once when
    /// first seen; `u64::MAX` keys the drops block.
    ifaces: HashMap<(u64, u32), (u32, String)>,
    packets: u64,
    drops: u64,
    /// The error that stopped the file, reported once.
    failed: Option<String>,
}

impl<W: Write> PcapngSink<W> {
    /// Writes the section header. `snaplen`: the capture's `--snaplen` plus headers.
    pub fn new(
        out: W,
        clock: Clock,
        snaplen: u32,
        names: SharedNames,
    ) -> Result<Self, PcapngError> {
        let section = SectionHeaderBlock {
            endianness: Endianness::native(),
            major_version: 1,
            minor_version: 0,
            section_length: -1,
            options: vec![
                SectionHeaderOption::UserApplication(Cow::Owned(format!(
                    "dnspath {}",
                    env!("CARGO_PKG_VERSION")
                ))),
                SectionHeaderOption::Comment(Cow::Borrowed(
                    "dnspath trace: every DNS packet at every hop; interfaces are netns/ifname",
                )),
            ],
        };
        Ok(Self {
            w: Some(PcapNgWriter::with_section_header(out, section)?),
            clock,
            names,
            snaplen,
            ifaces: HashMap::new(),
            packets: 0,
            drops: 0,
            failed: None,
        })
    }

    /// Packets and drops written so far.
    pub fn written(&self) -> (u64, u64) {
        (self.packets, self.drops)
    }

    /// Why the file stopped, if it did.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn fail(&mut self, e: impl std::fmt::Display) {
        if self.failed.is_none() {
            let msg = e.to_string();
            log::warn!("pcapng file stopped: {msg}; the trace goes on without it");
            self.failed = Some(msg);
        }
        self.w = None;
    }

    /// The interface id and name for `key`, writing its description block the first time
    /// (`describe` gives its name and description then).
    fn iface(
        &mut self,
        key: (u64, u32),
        describe_new: impl FnOnce(&SharedNames) -> (String, String),
    ) -> Option<(u32, String)> {
        if let Some((id, name)) = self.ifaces.get(&key) {
            return Some((*id, name.clone()));
        }
        let id = u32::try_from(self.ifaces.len()).ok()?;
        let (name, description) = describe_new(&self.names);
        let block = InterfaceDescriptionBlock {
            linktype: DataLink::RAW,
            snaplen: self.snaplen,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(name.clone())),
                InterfaceDescriptionOption::IfDescription(Cow::Owned(description)),
                // Timestamps in nanoseconds.
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        };
        let w = self.w.as_mut()?;
        if let Err(e) = w.write_pcapng_block(block) {
            self.fail(describe(&e));
            return None;
        }
        self.ifaces.insert(key, (id, name.clone()));
        Some((id, name))
    }

    fn epb(
        &mut self,
        id: u32,
        ts_ns: u64,
        orig_len: u32,
        data: &[u8],
        flags: u32,
        comment: String,
    ) {
        let Some(w) = self.w.as_mut() else { return };
        let mut options = vec![EnhancedPacketOption::Comment(Cow::Owned(comment))];
        if flags != 0 {
            options.push(EnhancedPacketOption::Flags(flags));
        }
        let block = EnhancedPacketBlock {
            interface_id: id,
            timestamp: Duration::from_nanos(self.clock.epoch_ns(ts_ns)),
            original_len: orig_len.max(u32::try_from(data.len()).unwrap_or(u32::MAX)),
            data: Cow::Borrowed(data),
            options,
        };
        if let Err(e) = w.write_pcapng_block(block) {
            self.fail(describe(&e));
        }
    }

    /// One captured packet; `records`: what the decoder made of it (its packet records), for
    /// the comment.
    pub fn packet(&mut self, p: &CapturedPacket, records: &[&PacketRecord]) {
        if self.w.is_none() {
            return;
        }
        let at = p.at;
        let Some((id, name)) = self.iface((at.netns, at.ifindex), |names| {
            let (netns, ifname) = place(names, at.netns, at.ifindex);
            let description = format!(
                "network namespace {} (id {:#x}), interface {} (ifindex {})",
                escape(&netns),
                at.netns,
                escape(&ifname),
                at.ifindex
            );
            (format!("{}/{}", clean(&netns), clean(&ifname)), description)
        }) else {
            return;
        };
        // epb_flags bits 0-1: 01 inbound, 10 outbound (pcapng §4.3.1).
        let flags = match p.at.dir {
            Direction::Ingress => 1,
            Direction::Egress => 2,
            Direction::Unknown => 0,
        };
        let mut comment = format!("dnspath hop={name} dir={}", p.at.dir.as_str());
        for r in records {
            if let Some(m) = &r.dns {
                comment.push_str(&format!(" dns=[{}]", escape(&m.summary_line())));
            }
            if let Some(why) = &r.malformed {
                comment.push_str(&format!(" malformed=[{}]", escape(why)));
            }
            if r.capture_truncated {
                comment.push_str(" capture_truncated");
            }
        }
        self.epb(id, p.ts_ns, p.orig_len, &p.data, flags, comment);
        self.packets += 1;
    }

    /// One kernel drop of a watched packet, with its record (reason, location, namespace).
    pub fn drop(&mut self, d: &KernelDrop, r: &DropRecord) {
        if self.w.is_none() {
            return;
        }
        let Some((id, _)) = self.iface((u64::MAX, 0), |_| {
            (
                DROPS_IFNAME.to_string(),
                "packets the kernel dropped (skb:kfree_skb), with reason and location in each comment"
                    .to_string(),
            )
        }) else {
            return;
        };
        let mut comment = format!(
            "dnspath drop={}@{} netns={} ifname={}",
            escape(&r.reason),
            escape(&r.location),
            escape(&r.netns),
            escape(&r.ifname)
        );
        if let Some(b) = r.benign {
            comment.push_str(&format!(" benign=[{b}]"));
        }
        if let Some(m) = &r.dns {
            comment.push_str(&format!(" dns=[{}]", escape(&m.summary_line())));
        }
        self.epb(id, d.ts_ns, d.orig_len, &d.data, 0, comment);
        self.drops += 1;
    }

    /// Flushes what was written.
    pub fn flush(&mut self) {
        if let Some(w) = self.w.as_mut() {
            if let Err(e) = w.get_mut().flush() {
                self.fail(e);
            }
        }
    }
}

/// pcap-file calls every I/O error "Error reading bytes": say what it was.
fn describe(e: &pcap_file::PcapError) -> String {
    match e {
        pcap_file::PcapError::IoError(io) => io.to_string(),
        e => e.to_string(),
    }
}

/// An interface-block name part: no `/` (it separates namespace and interface), escaped.
fn clean(s: &str) -> String {
    escape(s).replace('/', "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ObservationPoint;

    fn packet(ifindex: u32, dir: Direction) -> CapturedPacket {
        CapturedPacket {
            ts_ns: 1_700_000_000_123_456_789,
            cpu: Some(0),
            at: ObservationPoint {
                netns: 7,
                ifindex,
                dir,
            },
            vlan: None,
            orig_len: 60,
            data: vec![
                0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ],
        }
    }

    /// The file reads back with pcap-file: one interface block per hop, names, nanosecond
    /// times, directions, comments.
    #[test]
    fn packets_read_back_with_their_hops_and_comments() {
        let mut buf = Vec::new();
        {
            let mut s =
                PcapngSink::new(&mut buf, Clock::Epoch, 2048, SharedNames::default()).unwrap();
            s.packet(&packet(3, Direction::Egress), &[]);
            s.packet(&packet(3, Direction::Ingress), &[]);
            s.packet(&packet(4, Direction::Ingress), &[]);
            assert_eq!(s.written(), (3, 0));
            s.flush();
        }
        let mut r = pcap_file::pcapng::PcapNgReader::new(&buf[..]).unwrap();
        let mut ifaces = Vec::new();
        let mut epbs = Vec::new();
        while let Some(b) = r.next_block() {
            match b.unwrap() {
                pcap_file::pcapng::Block::InterfaceDescription(i) => ifaces.push(i.into_owned()),
                pcap_file::pcapng::Block::EnhancedPacket(e) => epbs.push(e.into_owned()),
                _ => {}
            }
        }
        assert_eq!(ifaces.len(), 2);
        assert!(ifaces[0]
            .options
            .contains(&InterfaceDescriptionOption::IfName("netns:0x7/if3".into())));
        assert_eq!(epbs.len(), 3);
        assert_eq!(
            epbs.iter().map(|e| e.interface_id).collect::<Vec<_>>(),
            [0, 0, 1]
        );
        assert_eq!(epbs[0].timestamp.as_nanos(), 1_700_000_000_123_456_789);
        assert!(epbs[0].options.contains(&EnhancedPacketOption::Flags(2)));
        assert!(epbs[1].options.contains(&EnhancedPacketOption::Flags(1)));
        assert!(epbs[2].options.iter().any(|o| matches!(
            o,
            EnhancedPacketOption::Comment(c) if c.contains("hop=netns:0x7/if4 dir=ingress")
        )));
    }

    /// Accepts `room` bytes, then fails as a full disk does.
    struct Disk {
        room: usize,
        used: usize,
    }
    impl Write for Disk {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.used + b.len() > self.room {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.used += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A full disk stops the file once, with the reason; nothing panics, the caller goes on.
    #[test]
    fn a_full_disk_stops_the_file_not_the_trace() {
        let mut s = PcapngSink::new(
            Disk { room: 400, used: 0 },
            Clock::Epoch,
            2048,
            SharedNames::default(),
        )
        .unwrap();
        for _ in 0..20 {
            s.packet(&packet(3, Direction::Egress), &[]);
        }
        let (written, _) = s.written();
        assert!(written > 0 && written < 20, "{written}");
        assert!(
            s.failed().unwrap().contains("os error 28"),
            "{:?}",
            s.failed()
        );
        // Nothing more is attempted.
        s.packet(&packet(3, Direction::Egress), &[]);
        assert_eq!(s.written().0, written);
    }
}

//! One pcapng file (`trace -w`, each rotated file, each flight-recorder file): packets as
//! captured (from the IP header on, up to the snaplen, original length kept) that Wireshark
//! and tshark open — one interface block per (network namespace, interface), named
//! `netns/ifname`, nanosecond timestamps, direction in `epb_flags`, and a comment per packet
//! (`dnspath at=IFACE …`, made in [`super::annotate`]). Kernel drops go in too, as the dropped
//! packet on an interface block of their own (`dnspath/drops`).
//!
//! Written with pcap-file's pcapng writer. A write error (disk full, file gone) stops the
//! file — what was written stays readable — and is kept for the owner to report once.
use std::{
    borrow::Cow,
    collections::{HashMap, VecDeque},
    io::Write,
    time::Duration,
};

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
    event::Direction,
    evidence::annotate::{EvidencePacket, Place},
    kube::Pod,
    names::{place, SharedNames},
    output::escape,
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
    /// Bytes handed to the writer, blocks whole (the section header included).
    bytes: u64,
    /// Where the last blocks end (the last MiB of them): after a failed write, the file is
    /// cut at one of these so that it ends with a whole block.
    ends: VecDeque<u64>,
    /// The error that stopped the file, reported once.
    failed: Option<String>,
}

impl<W: Write> PcapngSink<W> {
    /// Writes the section header, with `comments` (each its own option). `snaplen`: the
    /// capture's `--snaplen` plus headers.
    pub fn new(
        out: W,
        clock: Clock,
        snaplen: u32,
        names: SharedNames,
        comments: &[String],
    ) -> Result<Self, PcapngError> {
        let mut options = vec![SectionHeaderOption::UserApplication(Cow::Owned(format!(
            "dnspath {}",
            env!("CARGO_PKG_VERSION")
        )))];
        options.extend(
            comments
                .iter()
                .map(|c| SectionHeaderOption::Comment(Cow::Owned(c.clone()))),
        );
        let section = SectionHeaderBlock {
            endianness: Endianness::native(),
            major_version: 1,
            minor_version: 0,
            section_length: -1,
            options,
        };
        // The section header's size: blocks are counted from its end.
        let header = PcapNgWriter::with_section_header(Vec::new(), section.clone())?
            .into_inner()
            .len() as u64;
        Ok(Self {
            w: Some(PcapNgWriter::with_section_header(out, section)?),
            clock,
            names,
            snaplen,
            ifaces: HashMap::new(),
            packets: 0,
            drops: 0,
            bytes: header,
            ends: VecDeque::from([header]),
            failed: None,
        })
    }

    /// Packets and drops written so far.
    pub fn written(&self) -> (u64, u64) {
        (self.packets, self.drops)
    }

    /// The end of the last whole block within the first `len` bytes written (0: none).
    pub fn whole_blocks_up_to(&self, len: u64) -> u64 {
        self.ends
            .iter()
            .rev()
            .find(|&&e| e <= len)
            .copied()
            .unwrap_or(0)
    }

    fn wrote(&mut self, n: usize) {
        self.bytes += n as u64;
        self.ends.push_back(self.bytes);
        while self.ends.len() > 1
            && self
                .ends
                .front()
                .is_some_and(|&e| e + (1 << 20) < self.bytes)
        {
            self.ends.pop_front();
        }
    }

    /// Why the file stopped, if it did.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn fail(&mut self, e: impl std::fmt::Display) {
        // Reported once by the owner of the file (`-w`, the recorder).
        if self.failed.is_none() {
            self.failed = Some(e.to_string());
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
        match w.write_pcapng_block(block) {
            Ok(n) => self.wrote(n),
            Err(e) => {
                self.fail(describe(&e));
                return None;
            }
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
        match w.write_pcapng_block(block) {
            Ok(n) => self.wrote(n),
            Err(e) => self.fail(describe(&e)),
        }
    }

    /// One packet, in its interface block (created the first time), with its comment.
    pub fn write(&mut self, p: &EvidencePacket) {
        if self.w.is_none() {
            return;
        }
        let (key, flags) = match p.place {
            // epb_flags bits 0-1: 01 inbound, 10 outbound (pcapng §4.3.1).
            Place::Hop(at) => (
                (at.netns, at.ifindex),
                match at.dir {
                    Direction::Ingress => 1,
                    Direction::Egress => 2,
                    Direction::Unknown => 0,
                },
            ),
            Place::Drops => ((u64::MAX, 0), 0),
        };
        let Some((id, name)) = self.iface(key, |names| match p.place {
            Place::Drops => (
                DROPS_IFNAME.to_string(),
                "packets the kernel dropped (skb:kfree_skb), with reason and location in each comment"
                    .to_string(),
            ),
            Place::Hop(at) => {
                let (netns, ifname) = place(names, at.netns, at.ifindex);
                let mut description = format!(
                    "network namespace {} (id {:#x}), interface {} (ifindex {})",
                    escape(&netns),
                    at.netns,
                    escape(&ifname),
                    at.ifindex
                );
                if let Ok(names) = names.read() {
                    if let Some((pod, veth)) = names.pod_at(&netns, &ifname) {
                        description.push_str(&pod_description(pod, veth));
                    }
                }
                (format!("{}/{}", clean(&netns), clean(&ifname)), description)
            }
        }) else {
            return;
        };
        let comment = format!("dnspath at={name} {}", p.comment);
        self.epb(id, p.ts_ns, p.orig_len, &p.data, flags, comment);
        match p.place {
            Place::Hop(_) => self.packets += 1,
            Place::Drops => self.drops += 1,
        }
    }

    /// Bytes written so far (for `-C`).
    pub fn bytes(&self) -> u64 {
        self.bytes
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

/// What an interface description says of its pod: `, pod NAMESPACE/NAME (uid …)`, or
/// `, node-side veth of pod …` for the node's end of the pod's veth; the UID alone when
/// kubelet's name for it is unknown.
fn pod_description(pod: &Pod, veth: bool) -> String {
    let mut s = String::from(if veth {
        ", node-side veth of pod "
    } else {
        ", pod "
    });
    match &pod.label {
        Some(label) => {
            s.push_str(&escape(label));
            s.push_str(" (uid ");
            s.push_str(&escape(&pod.uid));
            s.push(')');
        }
        None => {
            s.push_str("uid ");
            s.push_str(&escape(&pod.uid));
        }
    }
    if let Some(c) = &pod.container {
        s.push_str(", container ");
        s.push_str(&escape(c));
    }
    s
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

    fn packet(ifindex: u32, dir: Direction) -> EvidencePacket {
        EvidencePacket {
            ts_ns: 1_700_000_000_123_456_789,
            place: Place::Hop(ObservationPoint {
                netns: 7,
                ifindex,
                dir,
            }),
            orig_len: 60,
            data: bytes::Bytes::from_static(&[
                0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ]),
            comment: format!("dir={}", dir.as_str()),
        }
    }

    /// The file reads back with pcap-file: one interface block per hop, names, nanosecond
    /// times, directions, comments.
    #[test]
    fn packets_read_back_with_their_hops_and_comments() {
        let mut buf = Vec::new();
        {
            let mut s =
                PcapngSink::new(&mut buf, Clock::Epoch, 2048, SharedNames::default(), &[]).unwrap();
            s.write(&packet(3, Direction::Egress));
            s.write(&packet(3, Direction::Ingress));
            s.write(&packet(4, Direction::Ingress));
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
            EnhancedPacketOption::Comment(c) if c == "dnspath at=netns:0x7/if4 dir=ingress"
        )));
    }

    fn descriptions(buf: &[u8]) -> Vec<(String, String)> {
        let mut r = pcap_file::pcapng::PcapNgReader::new(buf).unwrap();
        let mut out = Vec::new();
        while let Some(b) = r.next_block() {
            if let pcap_file::pcapng::Block::InterfaceDescription(i) = b.unwrap() {
                let mut name = String::new();
                let mut description = String::new();
                for o in i.options {
                    match o {
                        InterfaceDescriptionOption::IfName(n) => name = n.into_owned(),
                        InterfaceDescriptionOption::IfDescription(d) => {
                            description = d.into_owned()
                        }
                        _ => {}
                    }
                }
                out.push((name, description));
            }
        }
        out
    }

    /// Once pods are known, an interface block's description names the pod of its namespace,
    /// or the pod whose veth's node end it is (the UID when kubelet's name is unknown);
    /// `if_name` stays `netns/ifname`, and host strings are escaped.
    #[test]
    fn interface_descriptions_name_the_pod() {
        use std::{collections::HashMap, sync::Arc};
        let names = SharedNames::default();
        {
            let mut n = names.write().unwrap();
            n.learn(7, "pid42:pause", 3, "eth0");
            n.learn(1, "host", 4, "veth-a");
            n.learn(1, "host", 5, "veth-b");
            n.learn(1, "host", 6, "eth0");
            let a = Arc::new(Pod {
                uid: "u-a".into(),
                label: Some("kube-system/coredns-a\x1b".into()),
                container: Some("coredns".into()),
                container_id: None,
            });
            let b = Arc::new(Pod {
                uid: "u-b".into(),
                label: None,
                container: None,
                container_id: None,
            });
            n.set_pods(
                HashMap::from([(7, Arc::clone(&a))]),
                HashMap::from([
                    ((1, "veth-a".to_string()), Arc::clone(&a)),
                    ((1, "veth-b".to_string()), b),
                ]),
            );
        }
        let mut buf = Vec::new();
        {
            let mut s = PcapngSink::new(&mut buf, Clock::Epoch, 2048, names, &[]).unwrap();
            s.write(&packet(3, Direction::Egress));
            for ifindex in [4, 5, 6] {
                let mut p = packet(ifindex, Direction::Ingress);
                if let Place::Hop(at) = &mut p.place {
                    at.netns = 1;
                }
                s.write(&p);
            }
            s.flush();
        }
        let d = descriptions(&buf);
        assert_eq!(d.len(), 4, "{d:?}");
        assert_eq!(d[0].0, "pid42:pause/eth0");
        assert_eq!(
            d[0].1,
            "network namespace pid42:pause (id 0x7), interface eth0 (ifindex 3), \
             pod kube-system/coredns-a\\x1b (uid u-a), container coredns"
        );
        assert_eq!(d[1].0, "host/veth-a");
        assert!(
            d[1].1.ends_with(
                ", node-side veth of pod kube-system/coredns-a\\x1b (uid u-a), container coredns"
            ),
            "{}",
            d[1].1
        );
        assert_eq!(d[2].0, "host/veth-b");
        assert!(
            d[2].1
                .ends_with("(ifindex 5), node-side veth of pod uid u-b"),
            "{}",
            d[2].1
        );
        assert_eq!(d[3].0, "host/eth0");
        assert!(
            d[3].1.ends_with("(ifindex 6)") && !d[3].1.contains("pod"),
            "{}",
            d[3].1
        );
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
            &[],
        )
        .unwrap();
        for _ in 0..20 {
            s.write(&packet(3, Direction::Egress));
        }
        let (written, _) = s.written();
        assert!(written > 0 && written < 20, "{written}");
        assert!(
            s.failed().unwrap().contains("os error 28"),
            "{:?}",
            s.failed()
        );
        // Nothing more is attempted.
        s.write(&packet(3, Direction::Egress));
        assert_eq!(s.written().0, written);
    }
}

use super::*;
use crate::{event::ObservationPoint, output::annotate::Place};

fn packet(ts_ns: u64) -> EvidencePacket {
    EvidencePacket {
        ts_ns,
        place: Place::Hop(ObservationPoint {
            netns: 1,
            ifindex: 2,
            dir: crate::event::Direction::Egress,
        }),
        orig_len: 20,
        data: vec![
            0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ],
        comment: format!("n={ts_ns}"),
    }
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn recorder(name: &str, files_per_minute: u32) -> (Recorder, TempDir) {
    let dir = std::env::temp_dir().join(format!("dnspath-rec-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = RecorderConfig {
        dir: dir.clone(),
        before_ns: 10,
        after_ns: 5,
        ring_bytes: 1 << 20,
        dir_max_bytes: 1 << 30,
        files_per_minute,
        delay_ns: 0,
    };
    (
        Recorder::new(cfg, Clock::Epoch, 2048, SharedNames::default()),
        TempDir(dir),
    )
}

/// (SHB comments, EPB comments) of a file.
fn read(path: &str) -> (Vec<String>, Vec<String>) {
    let bytes = std::fs::read(path).unwrap();
    let mut r = pcap_file::pcapng::PcapNgReader::new(&bytes[..]).unwrap();
    let shb = r
        .section()
        .options
        .iter()
        .filter_map(|o| match o {
            pcap_file::pcapng::blocks::section_header::SectionHeaderOption::Comment(c) => {
                Some(c.to_string())
            }
            _ => None,
        })
        .collect();
    let mut epbs = Vec::new();
    while let Some(b) = r.next_block() {
        if let pcap_file::pcapng::Block::EnhancedPacket(e) = b.unwrap() {
            for o in e.options {
                if let pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Comment(
                    c,
                ) = o
                {
                    epbs.push(c.to_string());
                }
            }
        }
    }
    (shb, epbs)
}

/// One file holds the window around an incident, with the incidents that overlap it in its
/// section header; a later one inside the window is named by the same file.
#[test]
fn overlapping_incidents_share_one_file() {
    let (mut rec, _dir) = recorder("share", 10);
    for ts in [80, 95, 100] {
        rec.packet(packet(ts));
    }
    let a = rec.incident("race-drop", "A dropped", 100, 0).unwrap();
    rec.packet(packet(103));
    let b = rec.incident("unanswered", "A unanswered", 104, 0).unwrap();
    assert_eq!(a, b);
    rec.packet(packet(108));
    rec.packet(packet(130));
    rec.tick(108);
    assert!(
        !std::path::Path::new(&a).exists(),
        "written before its window ended"
    );
    rec.tick(200);
    let c = rec
        .incident("drop", "inside the window written", 102, 0)
        .unwrap();
    assert_eq!(a, c);
    assert!(a.contains("-race-drop.pcapng"), "{a}");
    let (shb, epbs) = read(&a);
    assert_eq!(shb.len(), 3, "{shb:?}");
    assert!(shb[1].starts_with("incident race-drop at ") && shb[2].contains("A unanswered"));
    assert_eq!(
        epbs,
        ["n=95", "n=100", "n=103", "n=108"].map(|c| format!("dnspath at=netns:0x1/if2 {c}"))
    );
    assert_eq!(rec.stats().files, 1);
}

/// A storm of incidents writes `files_per_minute` files and counts the rest.
#[test]
fn a_storm_is_rate_limited() {
    let (mut rec, dir) = recorder("storm", 2);
    for i in 0..5u64 {
        let ts = 1000 * (i + 1);
        rec.packet(packet(ts));
        assert_eq!(rec.incident("drop", "d", ts, ts).is_some(), i < 2);
    }
    rec.finish();
    let s = rec.stats();
    assert_eq!((s.incidents, s.files, s.not_written), (5, 2, 3));
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 2);
}

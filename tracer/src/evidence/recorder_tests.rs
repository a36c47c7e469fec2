use super::*;
use crate::{event::ObservationPoint, evidence::annotate::Place};

fn packet(ts_ns: u64) -> EvidencePacket {
    EvidencePacket {
        ts_ns,
        place: Place::Hop(ObservationPoint {
            netns: 1,
            ifindex: 2,
            dir: crate::event::Direction::Egress,
        }),
        orig_len: 20,
        data: bytes::Bytes::from_static(&[
            0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]),
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
    recorder_capped(name, files_per_minute, 1 << 30)
}

fn recorder_capped(name: &str, files_per_minute: u32, dir_max_bytes: u64) -> (Recorder, TempDir) {
    let dir = std::env::temp_dir().join(format!("dnspath-rec-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = RecorderConfig {
        dir: dir.clone(),
        before_ns: 10,
        after_ns: 5,
        ring_bytes: 1 << 20,
        dir_max_bytes,
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

/// Writes one file for an incident at `secs` seconds (a packet at the incident), and
/// returns its path.
fn one_file(rec: &mut Recorder, secs: u64) -> PathBuf {
    let ts = secs * 1_000_000_000;
    rec.packet(packet(ts));
    let path = rec.incident("drop", "d", ts, ts).unwrap();
    rec.tick(ts + 6);
    let path = PathBuf::from(path);
    assert!(path.exists(), "{}", path.display());
    path
}

/// DIR keeps at most `dir_max_bytes` of our files: the oldest (by name, which is by time)
/// are deleted first, an older run's included, each counted in `files_deleted`; the file
/// just written stays, and files that are not ours are neither counted nor touched.
#[test]
fn the_directory_cap_deletes_the_oldest_files_first() {
    // The size of one file, as the capped recorder will write them.
    let size = {
        let (mut probe, _dir) = recorder("cap-probe", 100);
        std::fs::metadata(one_file(&mut probe, 1)).unwrap().len()
    };
    let (mut rec, dir) = recorder_capped("cap", 100, 2 * size + size / 2);
    let older_run = dir.0.join("dnspath-19691231T235959.000Z-loop.pcapng");
    std::fs::write(&older_run, [0u8; 10]).unwrap();
    let not_ours = ["other.pcapng", "dnspath-notes.txt"];
    for f in not_ours {
        std::fs::write(dir.0.join(f), vec![0u8; 4 * size as usize]).unwrap();
    }
    let first = one_file(&mut rec, 1);
    let second = one_file(&mut rec, 2);
    assert_eq!(std::fs::metadata(&second).unwrap().len(), size);
    assert_eq!(rec.stats().files_deleted, 0, "10 + 2 × {size} bytes fit");
    assert!(older_run.exists() && first.exists());
    // Three files are over the cap: the older run's goes, and still over, the first.
    let third = one_file(&mut rec, 3);
    assert_eq!(rec.stats().files_deleted, 2);
    assert!(!older_run.exists() && !first.exists());
    let fourth = one_file(&mut rec, 4);
    assert_eq!(rec.stats().files_deleted, 3);
    assert!(!second.exists());
    let mut left: Vec<PathBuf> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    left.sort();
    let mut expected: Vec<PathBuf> = not_ours.iter().map(|f| dir.0.join(f)).collect();
    expected.extend([third, fourth]);
    expected.sort();
    assert_eq!(left, expected);
    assert_eq!(rec.stats().files, 4);
}

/// A cap smaller than one file keeps the file just written (and deletes every older one).
#[test]
fn the_directory_cap_keeps_the_newest_file() {
    let (mut rec, dir) = recorder_capped("cap-tiny", 100, 1);
    let first = one_file(&mut rec, 1);
    assert_eq!(rec.stats().files_deleted, 0);
    let second = one_file(&mut rec, 2);
    assert!(!first.exists() && second.exists());
    assert_eq!(rec.stats().files_deleted, 1);
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
}

use super::*;

fn ct() -> CtSnapshot {
    CtSnapshot {
        status: 0x188,
        orig: CtFlow {
            src: "10.244.1.2:51083".parse().unwrap(),
            dst: "10.96.0.10:53".parse().unwrap(),
            proto: 17,
        },
        reply: CtFlow {
            src: "10.244.1.3:53".parse().unwrap(),
            dst: "10.244.1.2:51083".parse().unwrap(),
            proto: 17,
        },
    }
}

/// A comment as the annotator writes it, with its transaction's and a race's notes before.
fn written(details: &DropDetails, tail: &str) -> String {
    let mut c = String::from(
        "dnspath at=dnspath/drops txn=2 leg=0 role=query race=race-drop sibling=[AAAA id=0xcbb2 ->10.244.1.4:53] \
         drop=NETFILTER_DROP@nf_hook_slow+0x9e netns=node ifname=vdnsa pkt=8d6c16f06c7153d0",
    );
    details.write(&mut c);
    c.push_str(tail);
    c
}

fn details() -> DropDetails {
    DropDetails {
        cpu: 1,
        netns_cookie: 0x1234,
        ifindex: 7,
        reason_code: Some(6),
        confirm_failed: Some(false),
        ct: Some(ct()),
    }
}

#[test]
fn reads_back_what_the_writer_wrote() {
    let c = written(&details(), " dns=[33018+ A? www.lab.test.]");
    assert!(
        c.contains(" cpu=1 netns_cookie=0x1234 ifindex=7 reason_code=6 confirm_failed=false ct_status=0x188 ct_orig=udp/10.244.1.2:51083>10.96.0.10:53 ct_reply=udp/10.244.1.3:53>10.244.1.2:51083 dns=["),
        "{c}"
    );
    let d = parse_drop_comment(&c).unwrap();
    assert_eq!(
        d,
        DropComment {
            named: NamedDrop {
                reason: "NETFILTER_DROP".into(),
                reason_code: Some(6),
                location: "nf_hook_slow+0x9e".into(),
                function: "nf_hook_slow".into(),
                confirm_failed: Some(false),
                netns_cookie: Some(0x1234),
                ifindex: Some(7),
            },
            cpu: 1,
            netns: "node".into(),
            ifname: "vdnsa".into(),
            ct: Some(ct()),
        }
    );
}

#[test]
fn optional_fields_absent_and_ipv6_conntrack() {
    let mut d = details();
    d.reason_code = None;
    d.confirm_failed = None;
    let mut c6 = ct();
    c6.orig.src = "[fd00::2]:40000".parse().unwrap();
    c6.orig.dst = "[fd00:96::a]:53".parse().unwrap();
    c6.reply.src = "[fd00::3]:53".parse().unwrap();
    c6.reply.dst = "[fd00::2]:40000".parse().unwrap();
    d.ct = Some(c6);
    let got = parse_drop_comment(&written(
        &d,
        " benign=[socket closed with data still queued]",
    ))
    .unwrap();
    assert_eq!(got.ct, Some(c6));
    assert_eq!(got.named.reason_code, None);
    assert_eq!(got.named.confirm_failed, None);

    // A bare address has no symbol; no conntrack entry.
    d.ct = None;
    let c = written(&d, "").replace("nf_hook_slow+0x9e", "0xffffffff81000142");
    let got = parse_drop_comment(&c).unwrap();
    assert_eq!(got.named.location, "0xffffffff81000142");
    assert_eq!(got.named.function, "");
    assert_eq!(got.ct, None);

    // A file of an older dnspath: no cpu, ids or conntrack fields.
    let old = "dnspath at=dnspath/drops drop=UNKNOWN@kfree_skb+0x1 netns=n ifname=lo pkt=1 dns=[1+ A? a.]";
    let got = parse_drop_comment(old).unwrap();
    assert_eq!((got.cpu, got.named.netns_cookie, got.ct), (0, None, None));
    assert_eq!(got.named.reason, "UNKNOWN");
}

#[test]
fn truncated_comments_are_errors() {
    let full = written(&details(), " dns=[33018+ A? www.lab.test.]");
    // Every cut of the comment either reads (the cut fell after the fields it needs, or
    // inside a number that still reads) or is an error: never a panic.
    let mut errors = 0;
    for cut in 0..full.len() {
        if let Some(prefix) = full.get(..cut) {
            if parse_drop_comment(prefix).is_err() {
                errors += 1;
            }
        }
    }
    assert!(errors > 100, "{errors}");
    let cut_at = |marker: &str| {
        let i = full.find(marker).unwrap() + marker.len();
        parse_drop_comment(&full[..i])
    };
    assert_eq!(
        cut_at(" drop=NETFILTER_DROP"),
        Err(DropCommentError::Bad {
            key: "drop",
            value: "NETFILTER_DROP".into()
        })
    );
    assert_eq!(
        cut_at(" netns=node"),
        Err(DropCommentError::Missing("ifname"))
    );
    assert_eq!(
        cut_at(" ct_orig=udp/10.244.1.2:51083>10.96.0.10:53"),
        Err(DropCommentError::Missing("ct_reply"))
    );
    assert_eq!(
        cut_at(" ct_reply=udp/10.244.1.3:53>10.244.1.2:51"),
        Ok(DropComment {
            ct: Some(CtSnapshot {
                reply: CtFlow {
                    dst: "10.244.1.2:51".parse().unwrap(),
                    ..ct().reply
                },
                ..ct()
            }),
            ..parse_drop_comment(&full).unwrap()
        }),
        "a cut inside a number that still reads is that number"
    );
    assert!(matches!(
        cut_at(" ct_reply=udp/10.244.1.3:53>10.2"),
        Err(DropCommentError::Bad {
            key: "ct_reply",
            ..
        })
    ));
    assert_eq!(cut_at(" sibling=[AAAA"), Err(DropCommentError::Unclosed));
    assert_eq!(
        parse_drop_comment(""),
        Err(DropCommentError::Missing("drop"))
    );
    assert_eq!(
        parse_drop_comment("dnspath at=dnspath/drops"),
        Err(DropCommentError::Missing("drop"))
    );
}

#[test]
fn hostile_strings_cannot_forge_or_break_fields() {
    // A query name that imitates fields: everything from `dns=[` on is never read.
    let forged = written(
        &details(),
        " dns=[1+ A? x.] cpu=99 ifname=evil drop=FAKE@x+0x1 ct_status=0x0 [ ] ]] \u{202e}.]",
    );
    let d = parse_drop_comment(&forged).unwrap();
    assert_eq!((d.cpu, d.ifname.as_str()), (1, "vdnsa"));
    assert_eq!(d.named.reason, "NETFILTER_DROP");

    // A field given twice before the free text is refused, not resolved either way.
    let twice = written(&details(), "").replace(" cpu=1 ", " cpu=1 cpu=2 ");
    assert_eq!(
        parse_drop_comment(&twice),
        Err(DropCommentError::Duplicate { key: "cpu".into() })
    );
    for (from, to, key) in [
        (" cpu=1 ", " cpu=-1 ", "cpu"),
        (" cpu=1 ", " cpu=4294967296 ", "cpu"),
        (" ifindex=7 ", " ifindex=0xzz ", "ifindex"),
        ("ct_orig=udp/", "ct_orig=300/", "ct_orig"),
        ("ct_orig=udp/", "ct_orig=", "ct_orig"),
        (
            " confirm_failed=false ",
            " confirm_failed=maybe ",
            "confirm_failed",
        ),
        (" netns=node ", " netns= ", "netns"),
        (
            "ct_reply=udp/10.244.1.3:53>",
            "ct_reply=udp/10.244.1.3:53>>",
            "ct_reply",
        ),
    ] {
        let c = written(&details(), "").replace(from, to);
        assert!(
            matches!(parse_drop_comment(&c), Err(DropCommentError::Bad { key: k, .. }) if k == key),
            "{c}: {:?}",
            parse_drop_comment(&c)
        );
    }
    // Unknown fields (a newer writer) are ignored; odd bytes, long input, words without `=`.
    let newer = written(&details(), "").replace(" cpu=1 ", " cpu=1 future=x plain-word ");
    assert_eq!(parse_drop_comment(&newer).unwrap().cpu, 1);
    let long = format!("{} {}", written(&details(), ""), "a=".repeat(100_000));
    assert_eq!(parse_drop_comment(&long).unwrap().cpu, 1);
    for junk in [
        "=",
        "==",
        "drop=@",
        "drop=a@",
        "drop=@b",
        "drop=[",
        "x=[ ]",
        "\u{fffd}=\u{fffd}",
        "drop=a@b netns=\0 ifname=]",
    ] {
        let _ = parse_drop_comment(junk);
    }
    assert_eq!(
        parse_drop_comment("drop=a@b netns=n ifname=i")
            .unwrap()
            .named
            .function,
        ""
    );
    // No device: an empty ifname is read as such.
    assert_eq!(
        parse_drop_comment("drop=a@b netns=n ifname= pkt=1")
            .unwrap()
            .ifname,
        ""
    );
}

/// A writer the test keeps a handle on.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A file as `trace -w` writes it (dnspath's own pcapng writer): a hop's packet, a drop at
/// that hop, a drop at a place no packet was written at, a drop with no device, and a drop
/// whose comment cannot be read. The file source hands out the packet and the three drops
/// (each placed where its comment says, with the live run's fields), and counts and names
/// the fourth.
#[test]
fn drops_of_a_file_dnspath_wrote_come_back_as_drops() {
    use crate::{
        event::{Direction, KernelDrop, ObservationPoint, SourceEvent},
        evidence::{
            annotate::{EvidencePacket, Place},
            pcapng::PcapngSink,
        },
        names::Names,
        source::file::FileSource,
        time::Clock,
    };
    let shared = |n: Names| std::sync::Arc::new(std::sync::RwLock::new(n));
    let mut live = Names::default();
    live.learn(0x8, "node", 5, "vdnsa");
    let out = Shared::default();
    let mut sink = PcapngSink::new(out.clone(), Clock::Epoch, 2048, shared(live), &[]).unwrap();
    let ip = vec![
        0x45, 0, 0, 32, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x9c, 0x40, 0, 53, 0,
        12, 0, 0, 1, 2, 3, 4,
    ];
    let packet = |ts_ns, place, comment: String| EvidencePacket {
        ts_ns,
        place,
        orig_len: 32,
        data: bytes::Bytes::from(ip.clone()),
        comment,
    };
    let drop_comment = |netns: &str, ifname: &str, d: &DropDetails| {
        let mut c = format!(
            "txn=1 leg=0 role=query drop=NETFILTER_DROP@nft_do_chain+0x46f netns={netns} ifname={ifname} pkt=1"
        );
        d.write(&mut c);
        c.push_str(" dns=[1+ A? a.test.]");
        c
    };
    let at = ObservationPoint {
        netns: 0x8,
        ifindex: 5,
        dir: Direction::Egress,
    };
    sink.write(&packet(1_000, Place::Hop(at), "dir=egress pkt=1".into()));
    sink.write(&packet(
        2_000,
        Place::Drops,
        drop_comment("node", "vdnsa", &details()),
    ));
    let mut elsewhere = details();
    elsewhere.ct = None;
    elsewhere.cpu = 0;
    sink.write(&packet(
        3_000,
        Place::Drops,
        drop_comment("pod", "eth0", &elsewhere),
    ));
    sink.write(&packet(
        4_000,
        Place::Drops,
        drop_comment("pod", "", &elsewhere),
    ));
    sink.write(&packet(5_000, Place::Drops, "drop=X netns=node".into()));
    sink.flush();
    let bytes = out.0.lock().unwrap().clone();

    let names = shared(Names::default());
    let mut src = FileSource::from_reader(
        std::io::Cursor::new(bytes),
        "t.pcapng".into(),
        "t".into(),
        names.clone(),
    )
    .unwrap();
    let mut events = Vec::new();
    while let Some(e) = src.next_event(|_| true).unwrap() {
        events.push(e);
    }
    assert_eq!(events.len(), 4, "{events:#?}");
    let SourceEvent::Packet(p) = &events[0] else {
        panic!("{events:#?}")
    };
    let drops: Vec<&KernelDrop> = events[1..]
        .iter()
        .map(|e| match e {
            SourceEvent::Drop(d) => d,
            other => panic!("{other:?}"),
        })
        .collect();
    // At the hop: the same namespace and interface as the packet there.
    let d = drops[0];
    assert_eq!((d.netns, d.ifindex), (p.at.netns, p.at.ifindex));
    assert_eq!((d.ts_ns, d.cpu, d.orig_len), (2_000, 1, 32));
    assert_eq!(d.ct, Some(ct()));
    assert_eq!(&d.data[..], &ip[..]);
    let n = d.named.as_deref().unwrap();
    assert_eq!(
        (n.reason.as_str(), n.location.as_str(), n.function.as_str()),
        ("NETFILTER_DROP", "nft_do_chain+0x46f", "nft_do_chain")
    );
    assert_eq!(
        (n.reason_code, n.confirm_failed, n.netns_cookie, n.ifindex),
        (Some(6), Some(false), Some(0x1234), Some(7))
    );
    // Elsewhere, and with no device: places of their own, named as the comments say.
    let place = |d: &KernelDrop| {
        let (ns, ifname) = names.read().unwrap().place(d.netns, d.ifindex);
        (ns.to_string(), ifname.to_string())
    };
    assert_eq!(place(d), ("node".into(), "vdnsa".into()));
    assert_eq!(place(drops[1]), ("pod".into(), "eth0".into()));
    assert_eq!(place(drops[2]), ("pod".into(), String::new()));
    assert_eq!(drops[1].netns, drops[2].netns);
    assert_ne!(drops[1].netns, d.netns);
    assert_eq!(drops[1].ct, None);
    // The unreadable one: counted, the first named with why.
    assert_eq!((src.drops(), src.skips().unreadable_drops), (3, 1));
    let why = src.first_unreadable_drop().unwrap();
    assert!(why.contains("`drop=` has an unreadable value"), "{why}");
}

//! The words of the correlate and detect stages' reports: wall-clock time, and the one-line summaries and paths people read (for terminal text and the
//! agent's events). The summaries and paths are written beside the records they describe,
//! which write them into their JSON too; they are named here for the sinks.
use std::fmt;

pub use crate::{
    correlate::record::transaction_summary,
    detect::{
        loops::{loop_at, loop_clients, loop_path, loop_server, peer, zone},
        race::{race_netns, race_summary},
    },
};

/// Unix-epoch nanoseconds as RFC 3339 wall-clock time, microseconds, UTC (as
/// [`Clock::wall`](crate::time::Clock::wall) writes it).
pub fn wall(wall_ns: u64) -> impl fmt::Display {
    crate::time::WallTime(wall_ns)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use crate::decode::ip::Addr;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for a in [
            "0.0.0.0:0",
            "10.244.1.2:53",
            "255.255.255.255:65535",
            "1.22.133.4:1000",
            "[::1]:53",
            "[fd00::a:1]:5353",
        ] {
            let addr: SocketAddr = a.parse().unwrap();
            let json = serde_json::to_string(&Addr(addr)).unwrap();
            assert_eq!(json, format!("\"{addr}\""));
        }
    }

    /// The records write themselves (no JSON mirror structs): a pod flattened in, a late
    /// answer's times, a bare namespace cookie, no client, hops without a visible server or
    /// place, clients in text order — byte for byte as the mirrors wrote them (the golden
    /// captures have no race and no pod).
    #[test]
    fn records_write_their_json_as_before() {
        use crate::{
            correlate::record::{Outcome, Summary},
            detect::{
                loops::{LoopHop, LoopKind, LoopState, Peer},
                race::{RaceNetns, RaceVerdict},
            },
            output::{record::PodRef, Record},
            test_support::fixtures::{addr, question, race, service_transaction},
        };
        let pod = PodRef {
            pod: Some("ns/p".into()),
            pod_uid: Some("u-1".into()),
            container: Some("c".into()),
            container_id: Some("cid".into()),
            pod_veth: true,
        };
        let json = |r: Record| serde_json::to_string(&r).unwrap();

        let Record::Transaction(mut t) = service_transaction("www.lab.test.", "A", 5000, "NOERROR")
        else {
            panic!("not a transaction")
        };
        t.legs.clear();
        t.outcome = Outcome::Late;
        t.summary = Summary::Late {
            answer_ns: 7_000_000_000,
            gave_up_ns: Some(5_000_000_000),
            reason: "NO_SOCKET".into(),
            location: "x".into(),
            retried: true,
        };
        t.pod = PodRef {
            pod: Some("ns/q".into()),
            ..Default::default()
        };
        t.evidence = Some("t.pcapng".into());
        assert_eq!(
            json(Record::Transaction(t)),
            r#"{"type":"transaction","id":1,"lookup":{"id":1,"step":0},"ts_ns":1000,"time":"2026-11-30T21:00:00.000000Z","client":"10.244.1.2:5000","client_netns":"client","pod":"ns/q","question":{"name":"www.lab.test.","type":"A","class":"IN"},"outcome":"late","rcode":"NOERROR","answers":[],"latency_ns":630000,"late_answer_ns":7000000000,"client_timeout_ns":5000000000,"summary":"answer NOERROR came at +7.00 s after the client had given up (socket closed: NO_SOCKET at x), 2.00 s after its own 5.00 s timeout, unanswered for the client, retried","evidence":"t.pcapng","legs":[]}"#
        );

        let mut r = race(RaceVerdict::ResolvedClash, "10.244.1.2:5000", 7, "A");
        r.pod = pod.clone();
        r.evidence = Some("e".into());
        r.client = None;
        r.netns = RaceNetns::Cookie(0x1234);
        r.dropped = None;
        assert_eq!(
            json(Record::detected(r)),
            r#"{"type":"race","verdict":"resolved-clash","ts_ns":2000,"time":"2026-11-30T21:00:00.000000Z","netns":"netns:0x1234","client":"","client_netns":"client","pod":"ns/p","pod_uid":"u-1","container":"c","container_id":"cid","pod_veth":true,"dropped":null,"sibling":null,"cpu":1,"counters":{"insert_failed":1,"drop":1,"clash_resolve":0},"counter_confirmed":true,"kernel_confirm_failed":null,"drop_reason":"NETFILTER_DROP","drop_location":"nf_hook_slow+0x9e","retry_ns":5000000000,"total_delay_ns":5001000000,"summary":"0 conntrack clash(es) resolved by the kernel on CPU 1: the race happened, nothing was lost","evidence":"e"}"#
        );

        let mut l = crate::test_support::fixtures::loop_record(3, LoopState::Detected, 10);
        l.kind = LoopKind::Amplification;
        l.question = question("com.", "A");
        l.cycle[0].pod = pod;
        l.cycle.push(LoopHop {
            from: Peer::Host("10.0.0.9".parse().unwrap()),
            server: None,
            backend: Peer::Host("10.0.0.8".parse().unwrap()),
            at: None,
            pod: PodRef::default(),
        });
        l.clients = vec![addr("10.0.0.2:9"), addr("10.0.0.1:10"), addr("[::1]:5")];
        l.evidence = Some("l.pcapng".into());
        assert_eq!(
            json(Record::detected(l)),
            r#"{"type":"loop","id":3,"state":"detected","kind":"amplification","ts_ns":10,"time":"2026-11-30T21:00:00.000000Z","question":{"name":"com.","type":"A","class":"IN"},"zone":".","loop_plugin_probe":false,"cycle":[{"from":"10.244.1.3:40000","server":"10.96.0.10:53","backend":"10.244.1.4:53","at":"node/vdnsb","pod":"ns/p","pod_uid":"u-1","container":"c","container_id":"cid","pod_veth":true},{"from":"10.0.0.9","server":"(not visible)","backend":"10.0.0.8","at":""}],"path":"10.244.1.3:40000 → 10.96.0.10:53 ⇒DNAT 10.244.1.4:53 (node/vdnsb) → (not visible) ⇒DNAT 10.0.0.8 ()","hop_count":2,"rate_pps":200000,"packets":10,"summarised":5,"clients":["10.0.0.1:10","10.0.0.2:9","[::1]:5"],"first_seen_ns":10,"detected_ns":10,"evidence":"l.pcapng","last_seen_ns":10}"#
        );
    }
}

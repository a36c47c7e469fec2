use super::*;
use crate::{
    correlate::record::Outcome,
    event::{CapturedPacket, Direction, ObservationPoint},
    kallsyms::Kallsyms,
};
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

const SECOND: u64 = 1_000_000_000;

/// `lab.test. A` from 10.244.1.2:40000 to 10.96.0.10:53 (or its answer back), id 7.
fn dns_udp(response: bool) -> Vec<u8> {
    use hickory_proto::{
        op::{Message, MessageType, OpCode, Query},
        rr::{rdata::A, Name, RData, Record as HRecord, RecordType},
    };
    let name = Name::from_ascii("lab.test.").unwrap();
    let kind = if response {
        MessageType::Response
    } else {
        MessageType::Query
    };
    let mut m = Message::new(7, kind, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::A));
    if response {
        m.add_answer(HRecord::from_rdata(name, 30, RData::A(A::new(10, 0, 0, 1))));
    }
    let payload = m.to_vec().unwrap();
    let (client, server) = ([10, 244, 1, 2], [10, 96, 0, 10]);
    let (src, dst, sport, dport) = if response {
        (server, client, 53u16, 40000u16)
    } else {
        (client, server, 40000, 53)
    };
    let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0];
    p[2..4].copy_from_slice(&(28 + payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&payload);
    p
}

/// Seen on the client pod's interface: the query leaving, the answer arriving.
pub(crate) fn packet(ts_ns: u64, response: bool) -> SourceEvent {
    let data = dns_udp(response);
    SourceEvent::Packet(CapturedPacket {
        ts_ns,
        cpu: None,
        at: ObservationPoint {
            netns: 1,
            ifindex: 2,
            dir: if response {
                Direction::Ingress
            } else {
                Direction::Egress
            },
        },
        vlan: None,
        orig_len: data.len() as u32,
        data: data.into(),
    })
}

fn pipeline() -> Pipeline {
    pipeline_naming(Arc::new(RwLock::new(
        crate::kernel::attach::Names::default(),
    )))
}

/// [`pipeline`] with the names of `names`.
pub(crate) fn pipeline_naming(names: crate::names::SharedNames) -> Pipeline {
    let decoder = Decoder::new(Clock::Epoch, names, Kallsyms::default(), HashMap::new());
    Pipeline::new(
        decoder,
        PipelineConfig {
            transactions: true,
            timeout_ns: 5 * SECOND,
            shed_loops: true,
            node_netns: None,
        },
        Clock::Epoch,
    )
}

fn outcomes(out: &[Record]) -> Vec<Outcome> {
    out.iter()
        .filter_map(|r| match r {
            Record::Transaction(t) => Some(t.outcome),
            _ => None,
        })
        .collect()
}

/// A reader stopped for 8 s reads the query, and its answer only in the next batch: while
/// the source is behind, the query is judged at the time read, not the clock's, and comes
/// out answered once its answer is read. Judged at the clock's time in between, it would
/// have been unanswered (the CI's lab run that found it: 1 of 4,200, 8 orphan answers).
#[test]
fn a_query_whose_answer_is_still_unread_is_not_timed_out() {
    let clock = 10 * SECOND;
    for behind in [true, false] {
        let mut p = pipeline();
        let mut out = Vec::new();
        p.push(packet(SECOND, false), &mut out);
        p.tick_live(clock, behind, &mut out);
        p.push(packet(SECOND + 1_000_000, true), &mut out);
        p.tick_live(clock, false, &mut out);
        let want = if behind {
            vec![Outcome::Answered]
        } else {
            vec![Outcome::Unanswered]
        };
        assert_eq!(outcomes(&out), want, "behind: {behind}");
        let orphans = p.stats().correlate.map(|c| c.orphan_responses);
        assert_eq!(orphans, Some(u64::from(!behind)), "behind: {behind}");
    }
}

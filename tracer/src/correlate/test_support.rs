//! What the correlator's tests share: DNS messages, observation points, and a [`Feed`] that
//! hands observations to the correlator with every detector and collects its records.
use super::*;
use crate::{
    decode::dns::{Flags, Question, Record as Rr},
    detect::Detectors,
    event::Direction,
    output::{
        record::{Record, TransactionRecord},
        report,
    },
};

/// The correlator with every detector, as the pipeline runs it.
pub(crate) type Correlator = super::Correlator<Detectors>;

/// A transaction's summary, as written.
pub(crate) fn summary(t: &TransactionRecord) -> String {
    report::transaction_summary(t)
}

pub(crate) const MS: u64 = 1_000_000;
pub(crate) const UDP: Proto = Proto::Udp;
pub(crate) const TCP: Proto = Proto::Tcp;

pub(crate) fn msg(
    id: u16,
    qr: bool,
    name: &str,
    qtype: &str,
    rcode: &str,
    answers: &[&str],
    tc: bool,
) -> DnsMessage {
    DnsMessage {
        id,
        qr,
        opcode: "QUERY".into(),
        rcode: rcode.to_owned().into(),
        flags: Flags {
            aa: false,
            tc,
            rd: true,
            ra: qr,
            ad: false,
            cd: false,
        },
        questions: vec![Question {
            name: name.into(),
            qtype: qtype.into(),
            class: "IN".into(),
        }],
        answers: answers
            .iter()
            .map(|a| Rr {
                name: name.into(),
                rtype: qtype.to_owned().into(),
                class: "IN".into(),
                ttl: 30,
                data: (*a).into(),
            })
            .collect(),
        authority: vec![],
        additional: vec![],
        edns: None,
        cut: None,
    }
}

pub(crate) fn at(netns: u64, ifindex: u32, dir: Direction) -> ObservationPoint {
    ObservationPoint {
        netns,
        ifindex,
        dir,
    }
}

pub(crate) struct Feed {
    pub(crate) c: Correlator,
    pub(crate) out: Vec<Record>,
}

impl Feed {
    pub(crate) fn new() -> Self {
        Self {
            c: Correlator::new(CorrelateConfig::default(), Clock::Epoch),
            out: vec![],
        }
    }
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn see(
        &mut self,
        ts: u64,
        point: ObservationPoint,
        ns: &str,
        ifn: &str,
        proto: Proto,
        src: &str,
        dst: &str,
        m: impl Into<Arc<DnsMessage>>,
    ) {
        self.c.on_observed(Observed::Message(Observation {
            ts_ns: ts,
            at: point,
            netns: ns.into(),
            ifname: ifn.into(),
            proto,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            msg: m.into(),
            tunnel: None,
        }));
    }
    pub(crate) fn txs(&mut self, now: u64) -> Vec<TransactionRecord> {
        self.c.tick(now, &mut self.out);
        self.out
            .drain(..)
            .filter_map(|r| match r {
                Record::Transaction(t) => Some(*t),
                _ => None,
            })
            .collect()
    }
}

//! The detect stage's hooks: what the correlator shows a detector as it happens (messages,
//! legs, conntrack samples, decided transactions, time) and what a detector asks of the
//! pipeline in return ([`Control`]). The detectors themselves live in `crate::detect`; the
//! correlator calls them through this trait, so that it never names one of them and a new
//! detection needs no change here unless it needs a fact the hooks do not carry yet.
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

pub(crate) use super::model::DropEvidence;
use super::{
    record::{LegDrop, TransactionRecord},
    DropObservation, QKey,
};
use crate::{decode::decoder::WireQuestion, event::CtStatsSample};

/// What a detector asks of the stages before it, keyed by the question's wire form (how the
/// decoder and the kernel recognise its packets before decoding them). The pipeline applies
/// it after [`Correlator::tick`](super::Correlator::tick).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// Only count this question's UDP packets from now on (a forwarding loop runs at
    /// hundreds of thousands of packets a second).
    Shed(WireQuestion, QKey),
    /// Decode them again.
    Unshed(WireQuestion),
}

/// A new leg of a transaction, or what its chain shows.
#[derive(Debug)]
pub(crate) enum LegEvent<'a> {
    /// A client's own query for `q` (a first query, a retry, a TCP fallback).
    Asked { q: &'a QKey, ts: u64 },
    /// `server` sent `q` onwards (a forward; also one not stored because its transaction
    /// was full).
    Forwarded {
        server: IpAddr,
        q: &'a QKey,
        ts: u64,
    },
    /// A forward came back to a server already on its chain.
    Cycle(Cycle<'a>),
}

/// A forwarding chain that came back to one of its servers.
#[derive(Debug)]
pub(crate) struct Cycle<'a> {
    pub q: &'a QKey,
    /// First server to last (the last forwards back to the first).
    pub hops: Vec<CycleHop>,
    /// Legs in the chain (1 = a server forwarding to itself).
    pub hop_count: u64,
    /// The client whose query entered the chain.
    pub client: Option<SocketAddr>,
    /// When that query was seen.
    pub entered_ts: u64,
    pub ts: u64,
}

/// One leg of a [`Cycle`].
#[derive(Debug)]
pub(crate) struct CycleHop {
    /// The query's client (a forwarder) as seen at the leg's first hop.
    pub from: SocketAddr,
    /// Where it was sent (may be a ClusterIP).
    pub server: SocketAddr,
    /// Where it arrived after DNAT.
    pub backend: SocketAddr,
    /// Namespace and interface (display names) where it was seen arriving.
    pub at: Option<(String, String)>,
}

/// One of the client's own attempts (a leg without a parent) of a decided transaction.
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub client: SocketAddr,
    pub client_netns: Arc<str>,
    pub dns_id: u16,
    pub question: QKey,
    pub first_ts: u64,
    pub backend: SocketAddr,
    pub drop: Option<LegDrop>,
    pub answered: bool,
    pub retransmits: u32,
    pub evidence: Option<DropEvidence>,
    /// The other query of the client socket's A/AAAA pair: (first ts, DNS id, question,
    /// backend).
    pub sibling: Option<(u64, u16, QKey, SocketAddr)>,
}

/// A transaction the correlator decided, before its record goes out.
#[derive(Debug)]
pub(crate) struct Decided<'a> {
    pub record: Option<&'a TransactionRecord>,
    /// The client's attempts, when one of them holds drop evidence or went unanswered
    /// without a drop seen (empty otherwise: most transactions, not worth the copies).
    pub attempts: &'a [Attempt],
    /// The client's first retry, since the first query.
    pub retry_ns: Option<u64>,
}

/// A detection. Every hook has a default that ignores it; a detector implements those it
/// needs. Hooks that run per packet ([`Detector::message`], [`Detector::leg`]) must be O(1).
pub(crate) trait Detector {
    /// The records it reports.
    type Report;
    /// Its counters, in the `stats` record's `correlate` object.
    type Stats: Default + Clone;

    /// A message of question `q` seen at `ts`, before it is joined. `true`: the detector
    /// takes it (counted towards what it follows, not correlated).
    fn message(&mut self, _q: &QKey, _ts: u64) -> bool {
        false
    }

    /// `n` packets of `q` (the last at `ts`) were only counted, by the decoder or the
    /// kernel, after a [`Control::Shed`].
    fn summarised(&mut self, _q: &QKey, _n: u64, _ts: u64) {}

    fn leg(&mut self, _ev: &LegEvent<'_>) {}

    /// A conntrack statistics sample.
    fn ct_stats(&mut self, _s: &CtStatsSample) {}

    /// A drop of one of a leg's packets: `true` keeps its [`DropEvidence`] on the leg (see
    /// [`Detector::holds`] and [`Attempt::evidence`]).
    fn keeps(&self, _d: &DropObservation) -> bool {
        false
    }

    /// A drop this detector keeps ([`Detector::keeps`]) of a packet of question `q` that no
    /// open leg claims: its query was not read (lost before the tracer saw it, during a
    /// flood) or its leg is gone.
    fn unmatched_drop(&mut self, _d: &DropObservation, _q: &QKey) {}

    /// A transaction with this evidence must not be decided before the returned time
    /// (`None`: it may be decided now, as far as this detector is concerned).
    fn holds(&self, _e: &DropEvidence, _now: u64) -> Option<u64> {
        None
    }

    fn decided(&mut self, _t: &Decided<'_>) {}

    /// Time passed (`all`: the input ended): reports that come out before this turn's
    /// transactions, and what the pipeline should do.
    fn tick(
        &mut self,
        _now: u64,
        _all: bool,
        _out: &mut Vec<Self::Report>,
        _control: &mut Vec<Control>,
    ) {
    }

    /// After this turn's transactions: reports that come out after them.
    fn settle(&mut self, _out: &mut Vec<Self::Report>) {}

    /// Its counters, into the stage's.
    fn stats(&self, _into: &mut Self::Stats) {}

    /// Its tables within their bounds (the fuzz harness's check after each event,
    /// `crate::fuzzing`): what is wrong, if anything.
    fn check_bounds(&self) -> Result<(), String> {
        Ok(())
    }
}

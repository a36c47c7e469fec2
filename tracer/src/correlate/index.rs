//! The correlator's legs and every index over them, as one type: inserting, closing or
//! removing a leg updates each index, so no caller can leave one behind.
//!
//! - `by_key`: the leg a hop joins, by (transport, client port, DNS id, question); a key
//!   reused after its leg was answered names the newer leg.
//! - `open_by_q`: unanswered legs by question, to find a forwarder's parent.
//! - `roots_by_q`: client (root) legs by client address and question, for retries and TCP
//!   fallback.
//! - `roots_by_socket`: client (root) legs by client socket, for the sibling of an A/AAAA
//!   pair.
//!
//! Each of the last three keeps the newest [`MAX_CANDIDATES`] per key: a forwarder's query
//! follows its parent's closely, a retry or sibling is the client's latest query, so older
//! ones are never the answer, and every lookup and removal stays O(1) however often one
//! question or socket repeats. A candidate carries its leg's first time, so that searches
//! for the latest, or the ones in a time window, look up only the legs that can match
//! (a busy client's list is full: 64 hash lookups per new query otherwise).
use std::{
    collections::{hash_map::Entry, HashMap},
    hash::{BuildHasher, Hash},
    net::{IpAddr, SocketAddr},
};

use super::{
    model::{Leg, LegKey, QKey, Response},
    record::QMap,
    sip::Sip,
};

/// Candidates kept per key of an index (the newest).
pub(super) const MAX_CANDIDATES: usize = 64;

/// A leg in a candidate list: its id and its (immutable) first time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Candidate {
    pub(super) first_ts: u64,
    pub(super) id: u64,
}

/// A key's candidates, oldest first. Most keys (a client's socket, its question) hold one
/// leg at a time: that one is kept without a vector (an allocation and its free a leg).
#[derive(Debug)]
pub(super) enum Candidates {
    One(Candidate),
    Many(Vec<Candidate>),
}

impl std::ops::Deref for Candidates {
    type Target = [Candidate];
    fn deref(&self) -> &[Candidate] {
        match self {
            Candidates::One(c) => std::slice::from_ref(c),
            Candidates::Many(v) => v,
        }
    }
}

impl Candidates {
    /// Adds the newest, dropping the oldest beyond [`MAX_CANDIDATES`].
    fn push_capped(&mut self, c: Candidate) {
        match self {
            Candidates::One(first) => *self = Candidates::Many(vec![*first, c]),
            Candidates::Many(v) => {
                if v.len() >= MAX_CANDIDATES {
                    v.remove(0);
                }
                v.push(c);
            }
        }
    }

    /// Takes `id` off; true when none is left.
    fn remove(&mut self, id: u64) -> bool {
        match self {
            Candidates::One(c) => c.id == id,
            Candidates::Many(v) => {
                v.retain(|c| c.id != id);
                v.is_empty()
            }
        }
    }
}

#[derive(Default)]
pub(super) struct LegIndex {
    /// By the correlator's own leg ids (a counter, not the wire's): a fast hasher is safe.
    /// Boxed: a leg is a few hundred bytes, moved whole into and out of the table, into its
    /// transaction's list and its record otherwise (a tenth of the agent's instructions
    /// were such copies).
    legs: HashMap<u64, Box<Leg>, foldhash::fast::RandomState>,
    /// By wire data: SipHash (fed at once, see [`Sip`]).
    by_key: HashMap<LegKey, u64, Sip>,
    /// By question alone: its digest is the hash.
    open_by_q: QMap<Candidates>,
    roots_by_q: HashMap<(IpAddr, QKey), Candidates, Sip>,
    roots_by_socket: HashMap<SocketAddr, Candidates, Sip>,
    /// Changes whenever a leg comes or goes: what `by_key` answers can change only then.
    generation: u64,
    /// Hops the legs hold (see [`LegIndex::bytes`]).
    hops: usize,
}

/// What a leg takes, about, beyond its hops: the leg in its table's slot (a table is at
/// most 8/7 full, and up to twice as large as that after it grew), its key and candidates
/// in the indexes (with their tables' slack), its hops' vector and response.
const LEG_BYTES: usize = 2 * std::mem::size_of::<Leg>()
    + 2 * (std::mem::size_of::<LegKey>() + 8)
    + 3 * (2 * std::mem::size_of::<Candidate>() + 64)
    + 128
    // Its transaction, lookup, timers and the detectors' entries for its question, about
    // (measured: 5.5 KB a leg of ten hops in all, `the_leg_tables_bytes_cover_what_they_take`).
    + 1024;
/// A stored hop, in a vector that may be up to twice as long as its hops.
const HOP_BYTES: usize = 2 * std::mem::size_of::<super::model::Hop>();

impl LegIndex {
    /// Adds a new, unanswered leg to every index (its key, question and, for a root leg,
    /// client address and socket are what it is found by).
    pub(super) fn insert(&mut self, leg: Leg) {
        let id = leg.id;
        self.generation += 1;
        let c = Candidate {
            first_ts: leg.first_ts,
            id,
        };
        // A key reused after its leg was answered replaces it in the index.
        self.by_key.insert(leg.key.clone(), id);
        if leg.response.is_none() && !leg.timed_out {
            push_capped(&mut self.open_by_q, leg.key.q.clone(), c);
        }
        if leg.parent.is_none() {
            push_capped(
                &mut self.roots_by_q,
                (leg.client.ip(), leg.key.q.clone()),
                c,
            );
            push_capped(&mut self.roots_by_socket, leg.client, c);
        }
        self.hops += leg.hops.len();
        self.legs.insert(id, Box::new(leg));
    }

    /// Removes a leg from every index and hands it back.
    pub(super) fn remove(&mut self, id: u64) -> Option<Box<Leg>> {
        let leg = self.legs.remove(&id)?;
        self.generation += 1;
        self.hops = self.hops.saturating_sub(leg.hops.len());
        // The key's question is shared: the index keys built here copy no name.
        if !leg.timed_out && leg.response.is_none() {
            remove_from(&mut self.open_by_q, leg.key.q.clone(), id);
        }
        if leg.parent.is_none() {
            remove_from(
                &mut self.roots_by_q,
                (leg.client.ip(), leg.key.q.clone()),
                id,
            );
            remove_from(&mut self.roots_by_socket, leg.client, id);
        }
        // A key reused by a newer leg stays that leg's: one lookup in the usual case.
        if let Some((key, other)) = self.by_key.remove_entry(&leg.key) {
            if other != id {
                self.by_key.insert(key, other);
            }
        }
        Some(leg)
    }

    /// The leg's query was answered: it is no longer a forwarder's parent candidate.
    pub(super) fn respond(&mut self, id: u64, response: Response) {
        let Some(leg) = self.legs.get_mut(&id) else {
            return;
        };
        let was_open = leg.response.is_none() && !leg.timed_out;
        leg.response = Some(response);
        leg.timed_out = false;
        if was_open {
            remove_from(&mut self.open_by_q, leg.key.q.clone(), id);
        }
    }

    /// The leg's query went unanswered for the timeout (once; `false` if it was answered,
    /// already timed out, or is gone).
    pub(super) fn time_out(&mut self, id: u64) -> bool {
        let Some(leg) = self.legs.get_mut(&id) else {
            return false;
        };
        if leg.response.is_some() || leg.timed_out {
            return false;
        }
        leg.timed_out = true;
        remove_from(&mut self.open_by_q, leg.key.q.clone(), id);
        true
    }

    pub(super) fn get(&self, id: &u64) -> Option<&Leg> {
        self.legs.get(id).map(|l| &**l)
    }

    /// The leg to change in place. Its key, question, client, parent, response and
    /// `timed_out` are what the indexes hold it by: those change only through
    /// [`LegIndex::respond`] and [`LegIndex::time_out`].
    pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut Leg> {
        self.legs.get_mut(id).map(|l| &mut **l)
    }

    /// The leg a hop with this key joins.
    pub(super) fn by_key(&self, key: &LegKey) -> Option<u64> {
        self.by_key.get(key).copied()
    }

    /// Unanswered, not timed-out legs of a question, oldest first.
    #[cfg(test)]
    pub(super) fn open(&self, q: &QKey) -> impl DoubleEndedIterator<Item = &Leg> {
        self.legs_of(self.open_candidates(q))
    }

    /// Root legs of a client address and question, oldest first.
    #[cfg(test)]
    pub(super) fn roots(&self, client: IpAddr, q: &QKey) -> impl DoubleEndedIterator<Item = &Leg> {
        self.legs_of(self.root_candidates(client, q))
    }

    /// Root legs from a client socket, oldest first.
    #[cfg(test)]
    pub(super) fn roots_from(&self, socket: &SocketAddr) -> impl DoubleEndedIterator<Item = &Leg> {
        self.legs_of(self.socket_candidates(socket))
    }

    #[cfg(test)]
    fn legs_of<'a>(&'a self, c: &'a [Candidate]) -> impl DoubleEndedIterator<Item = &'a Leg> {
        c.iter().filter_map(|c| self.get(&c.id))
    }

    /// [`LegIndex::open`]'s candidates, oldest first.
    pub(super) fn open_candidates(&self, q: &QKey) -> &[Candidate] {
        self.open_by_q.get(q).map_or(&[], |c| c)
    }

    /// [`LegIndex::roots`]'s candidates, oldest first.
    pub(super) fn root_candidates(&self, client: IpAddr, q: &QKey) -> &[Candidate] {
        self.roots_by_q.get(&(client, q.clone())).map_or(&[], |c| c)
    }

    /// [`LegIndex::roots_from`]'s candidates, oldest first.
    pub(super) fn socket_candidates(&self, socket: &SocketAddr) -> &[Candidate] {
        self.roots_by_socket.get(socket).map_or(&[], |c| c)
    }

    /// Every leg, to change what no index holds it by (see [`LegIndex::get_mut`]).
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Leg> {
        self.legs.values_mut().map(|l| &mut **l)
    }

    pub(super) fn len(&self) -> usize {
        self.legs.len()
    }

    /// A hop was pushed onto a leg (through [`LegIndex::get_mut`]).
    pub(super) fn hop_added(&mut self) {
        self.hops += 1;
    }

    /// What the legs and their indexes take from the allocator, about: what
    /// [`CorrelateConfig::max_leg_bytes`](super::CorrelateConfig::max_leg_bytes) bounds.
    pub(super) fn bytes(&self) -> usize {
        self.legs.len() * LEG_BYTES + self.hops * HOP_BYTES
    }

    /// Hands back the tables' room beyond four times what they hold (after a storm): a
    /// hash table keeps its largest size otherwise.
    pub(super) fn shrink(&mut self) {
        let n = self.legs.len().max(1024);
        if self.legs.capacity() > 4 * n {
            self.legs.shrink_to(2 * n);
            self.by_key.shrink_to(2 * n);
            self.open_by_q.shrink_to(2 * n);
            self.roots_by_q.shrink_to(2 * n);
            self.roots_by_socket.shrink_to(2 * n);
        }
    }

    /// Bumped by every insert and removal (see [`LegIndex::by_key`]).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}

fn push_capped<K: Hash + Eq, S: BuildHasher>(
    index: &mut HashMap<K, Candidates, S>,
    key: K,
    c: Candidate,
) {
    match index.entry(key) {
        Entry::Occupied(e) => e.into_mut().push_capped(c),
        Entry::Vacant(e) => {
            e.insert(Candidates::One(c));
        }
    }
}

/// Takes `id` off `key`'s list, and the list out when it is left empty: one lookup (one
/// hash of the key) either way.
fn remove_from<K: Hash + Eq, S: BuildHasher>(
    index: &mut HashMap<K, Candidates, S>,
    key: K,
    id: u64,
) {
    if let Entry::Occupied(mut e) = index.entry(key) {
        if e.get_mut().remove(id) {
            e.remove();
        }
    }
}

#[cfg(test)]
mod tests;

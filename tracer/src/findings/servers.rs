//! Queries a server failed, tallied per server in a bounded table: what doctor's
//! `unanswered_queries` and `servfail` findings ([`super::traffic`]), the Service findings'
//! queries per server ([`super::traffic_more`]) and the agent's `unanswered` and `servfail`
//! event lines count. The findings count each server's own queries (legs, forwards
//! included); the event lines count client questions, by the server the client asked.
use std::collections::BTreeMap;

use crate::correlate::record::{LegOutcome, LegRecord, Outcome, TransactionRecord};

/// How a server failed a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failure {
    /// No answer came back.
    Unanswered,
    /// The answer was SERVFAIL.
    Servfail,
}

impl Failure {
    /// How a leg failed: its server's query went unanswered, or was answered SERVFAIL.
    pub fn of_leg(leg: &LegRecord) -> Option<Failure> {
        match leg.outcome {
            LegOutcome::Unanswered => Some(Failure::Unanswered),
            _ if leg.rcode.as_deref() == Some("SERVFAIL") => Some(Failure::Servfail),
            _ => None,
        }
    }

    /// How a client's question failed: answered SERVFAIL, or no answer reached the client
    /// (unanswered, dropped, or late).
    pub fn of_question(t: &TransactionRecord) -> Option<Failure> {
        if t.rcode.as_deref() == Some("SERVFAIL") {
            Some(Failure::Servfail)
        } else if matches!(
            t.outcome,
            Outcome::Unanswered | Outcome::Dropped | Outcome::Late
        ) {
            Some(Failure::Unanswered)
        } else {
            None
        }
    }
}

/// A tally per key (a server, or a server and how it failed) of at most a given number of
/// keys: a memory bound whatever the traffic. What a full table turns away is counted.
#[derive(Debug)]
pub struct PerServer<K, V> {
    tally: BTreeMap<K, V>,
    /// Tallies asked for a key the full table did not keep, over the table's life.
    refused: u64,
}

impl<K, V> Default for PerServer<K, V> {
    fn default() -> Self {
        Self {
            tally: BTreeMap::new(),
            refused: 0,
        }
    }
}

impl<K: Ord, V: Default> PerServer<K, V> {
    /// `key`'s tally, or `None` (counted in [`PerServer::refused`]) when the table already
    /// holds `max` keys and not this one.
    pub fn tally(&mut self, key: K, max: usize) -> Option<&mut V> {
        if self.tally.len() >= max && !self.tally.contains_key(&key) {
            self.refused += 1;
            return None;
        }
        Some(self.tally.entry(key).or_default())
    }

    /// `key`'s tally whatever the bound: the one key that refused ones are folded into.
    pub fn overflow(&mut self, key: K) -> &mut V {
        self.tally.entry(key).or_default()
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.tally.get(key)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.tally.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tally.is_empty()
    }

    /// Tallies asked for and not kept because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The tallies in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.tally.iter()
    }

    /// The tallies in key order, leaving the table empty (its [`PerServer::refused`] count
    /// stays).
    pub fn take(&mut self) -> BTreeMap<K, V> {
        std::mem::take(&mut self.tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_refuses_new_keys_and_counts_them() {
        let mut t: PerServer<u32, u64> = PerServer::default();
        for k in [1, 2, 1, 3, 2] {
            if let Some(n) = t.tally(k, 2) {
                *n += 1;
            }
        }
        assert_eq!(t.iter().collect::<Vec<_>>(), [(&1, &2), (&2, &2)]);
        assert_eq!(t.refused(), 1);
        *t.overflow(9) += 1;
        assert_eq!(t.len(), 3);
        assert_eq!(t.take().len(), 3);
        assert!(t.is_empty());
        assert_eq!(t.refused(), 1);
    }
}

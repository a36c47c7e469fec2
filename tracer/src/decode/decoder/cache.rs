//! Messages decoded lately, by their bytes. A node's capture sees one DNS message at every
//! hop of its path (the client pod's veth, the node's side of it, the DNS pod's veth — ten
//! packets per query through a ClusterIP) with the same bytes: DNAT rewrites addresses, not
//! the message. Decoding it once and sharing the result (`Arc`) with every hop's record and
//! observation saves the decode, and its allocations, at every hop after the first.
//!
//! Direct-mapped: a message's slot is its hash's low bits, a lookup is one hash of the bytes
//! and one comparison of them with the slot's (a hash collision is a miss, never a wrong
//! message), and a miss replaces the slot. Per-packet work is O(1) however traffic is
//! shaped; a flood of distinct messages only misses.
use std::{hash::BuildHasher, sync::Arc};

use crate::decode::dns::{self, DnsMessage};

/// Slots: the messages in flight on a node's hops within a few milliseconds fit many times
/// over (10k queries/s are 20 distinct messages per millisecond).
const SLOTS: usize = 512;

/// Messages longer than this are decoded every time (a slot keeps its message's bytes:
/// this bounds the cache's memory to SLOTS × MAX_BYTES plus the messages).
const MAX_BYTES: usize = 1_500;

#[derive(Default)]
struct Slot {
    hash: u64,
    bytes: Vec<u8>,
    msg: Option<Arc<DnsMessage>>,
}

pub(super) struct MessageCache {
    slots: Box<[Slot]>,
    /// Seeded per process: slots chosen by a sender cost it misses only, but keep them
    /// unpredictable anyway.
    state: foldhash::fast::RandomState,
}

impl Default for MessageCache {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            state: foldhash::fast::RandomState::default(),
        }
    }
}

impl MessageCache {
    /// `bytes` decoded as a whole message ([`dns::decode`]): the shared result of the last
    /// decode of the same bytes when its slot still holds it. Errors are not kept.
    pub(super) fn decode(&mut self, bytes: &[u8]) -> Result<Arc<DnsMessage>, dns::DnsError> {
        if bytes.len() > MAX_BYTES {
            return dns::decode(bytes).map(Arc::new);
        }
        let hash = self.state.hash_one(bytes);
        let n = self.slots.len();
        let Some(slot) = self.slots.get_mut(hash as usize % n) else {
            return dns::decode(bytes).map(Arc::new);
        };
        if let Some(msg) = &slot.msg {
            if slot.hash == hash && slot.bytes == bytes {
                return Ok(Arc::clone(msg));
            }
        }
        let msg = Arc::new(dns::decode(bytes)?);
        slot.hash = hash;
        slot.bytes.clear();
        slot.bytes.extend_from_slice(bytes);
        slot.msg = Some(Arc::clone(&msg));
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::{
        op::{Message, MessageType, OpCode, Query},
        rr::{rdata::A, Name, RData, Record, RecordType},
    };

    fn message(id: u16, name: &str, answer: Option<[u8; 4]>) -> Vec<u8> {
        let kind = match answer {
            None => MessageType::Query,
            Some(_) => MessageType::Response,
        };
        let mut m = Message::new(id, kind, OpCode::Query);
        let n = Name::from_ascii(name).unwrap();
        m.add_query(Query::query(n.clone(), RecordType::A));
        if let Some([a, b, c, d]) = answer {
            m.add_answer(Record::from_rdata(n, 30, RData::A(A::new(a, b, c, d))));
        }
        m.to_vec().unwrap()
    }

    fn dns_query(id: u16, name: &str, _: RecordType) -> Vec<u8> {
        message(id, name, None)
    }

    fn dns_response(id: u16, name: &str, a: [u8; 4]) -> Vec<u8> {
        message(id, name, Some(a))
    }

    #[test]
    fn same_bytes_share_one_decode_and_equal_a_fresh_one() {
        let mut c = MessageCache::default();
        let q = dns_query(0x1234, "example.com.", RecordType::A);
        let a = c.decode(&q).unwrap();
        let b = c.decode(&q).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second decode of the same bytes is shared"
        );
        assert_eq!(*a, dns::decode(&q).unwrap());
    }

    #[test]
    fn different_bytes_are_never_confused() {
        let mut c = MessageCache::default();
        // Many messages, more than the slots: every result equals a fresh decode, whether
        // its slot was taken by another message or not.
        let msgs: Vec<Vec<u8>> = (0..3 * SLOTS as u16)
            .map(|i| {
                if i % 2 == 0 {
                    dns_query(i, &format!("n{i}.example."), RecordType::A)
                } else {
                    dns_response(
                        i,
                        &format!("n{i}.example."),
                        [10, 0, (i >> 8) as u8, i as u8],
                    )
                }
            })
            .collect();
        for round in 0..2 {
            for m in &msgs {
                assert_eq!(
                    *c.decode(m).unwrap(),
                    dns::decode(m).unwrap(),
                    "round {round}"
                );
            }
        }
        // Same slot, different bytes: a slot whose hash matches but bytes differ is a miss.
        let one = &msgs[0];
        let slot = (c.state.hash_one(&one[..]) as usize) % SLOTS;
        c.slots[slot].hash = c.state.hash_one(&msgs[1][..]);
        c.slots[slot].bytes = msgs[1].clone();
        c.slots[slot].msg = Some(Arc::new(dns::decode(&msgs[1]).unwrap()));
        assert_eq!(*c.decode(one).unwrap(), dns::decode(one).unwrap());
    }

    #[test]
    fn errors_and_long_messages_are_not_kept() {
        let mut c = MessageCache::default();
        assert!(c.decode(&[0u8; 5]).is_err());
        assert!(c.slots.iter().all(|s| s.msg.is_none()));
        let mut long = dns_query(7, "example.com.", RecordType::A);
        // Trailing bytes after the message: still one message (as dns::decode says), too
        // long to keep.
        long.resize(MAX_BYTES + 1, 0);
        let fresh = dns::decode(&long);
        let cached = c.decode(&long);
        assert_eq!(fresh.is_ok(), cached.is_ok());
        assert!(c.slots.iter().all(|s| s.msg.is_none()));
    }
}

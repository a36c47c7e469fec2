//! SipHash for the correlator's maps keyed by wire data, fed in one piece.
//!
//! A derived `Hash` of a small key (a socket address, a leg key) makes several small
//! writes, and SipHash pays for each one's partial-block handling. [`Sip`] gathers a key's
//! writes in a buffer and hands SipHash the bytes at once when the hash is taken: the hash
//! is still `std`'s SipHash under this map's random key, of the same bytes (SipHash reads
//! its writes as one stream), so the maps are exactly as hard to flood.
use std::hash::{BuildHasher, Hasher, RandomState};

/// Bytes gathered before they go to SipHash; longer keys stream through as they come.
const BUF: usize = 64;

/// `std`'s `RandomState` (SipHash, random keys), fed through a buffer.
#[derive(Clone, Default)]
pub(crate) struct Sip(RandomState);

impl BuildHasher for Sip {
    type Hasher = Buffered;

    fn build_hasher(&self) -> Buffered {
        Buffered {
            sip: self.0.build_hasher(),
            buf: [0; BUF],
            len: 0,
        }
    }
}

pub(crate) struct Buffered {
    sip: std::hash::DefaultHasher,
    buf: [u8; BUF],
    len: usize,
}

impl Hasher for Buffered {
    fn write(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(room) = self.buf.get_mut(self.len..end) {
            room.copy_from_slice(bytes);
            self.len = end;
        } else {
            self.sip.write(&self.buf[..self.len]);
            self.len = 0;
            self.sip.write(bytes);
        }
    }

    fn finish(&self) -> u64 {
        let mut sip = self.sip.clone();
        sip.write(&self.buf[..self.len]);
        sip.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{collections::HashMap, net::SocketAddr};

    #[test]
    fn the_hash_is_sip_of_the_same_bytes_however_they_were_written() {
        let s = Sip::default();
        let whole = |b: &[u8]| {
            let mut h = s.0.build_hasher();
            h.write(b);
            h.finish()
        };
        let bytes: Vec<u8> = (0..200u8).collect();
        for len in [0, 1, 13, BUF - 1, BUF, BUF + 1, 100, 200] {
            for split in [0, 1, 7, len / 2, len] {
                let mut h = s.build_hasher();
                h.write(&bytes[..split.min(len)]);
                h.write(&bytes[split.min(len)..len]);
                assert_eq!(h.finish(), whole(&bytes[..len]), "len {len} split {split}");
            }
        }
        // Another map's key hashes otherwise.
        let mut other = Sip::default().build_hasher();
        other.write(&bytes[..13]);
        assert_ne!(other.finish(), whole(&bytes[..13]));
    }

    #[test]
    fn a_map_with_it_finds_what_it_holds() {
        let mut m: HashMap<SocketAddr, u32, Sip> = HashMap::default();
        for i in 0..1000u32 {
            let a: SocketAddr = format!("10.0.{}.{}:{}", i / 256, i % 256, 1000 + i)
                .parse()
                .unwrap();
            m.insert(a, i);
        }
        let six: SocketAddr = "[fd00::1]:53".parse().unwrap();
        m.insert(six, 7);
        assert_eq!(m.len(), 1001);
        assert_eq!(m.get(&"10.0.1.4:1260".parse().unwrap()), Some(&260));
        assert_eq!(m.get(&six), Some(&7));
        assert_eq!(m.get(&"10.0.1.4:1261".parse().unwrap()), None);
    }
}

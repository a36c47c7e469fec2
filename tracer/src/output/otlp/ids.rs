//! Deterministic trace and span ids, scheme **v1** (docs/otlp.md, "Ids"): every node that sees
//! a client's query computes the same ids from what it sees of it, without talking to the
//! others.
//!
//! - key: `SipHash-2-4-128` under the all-zero key of `"dnspath otlp id key v1\0" ‖ secret`
//!   (the cluster secret, `--otlp-secret-file` or `DNSPATH_OTLP_SECRET`; empty without one);
//! - query key (`dnspath.query_key`, no time in it): `SipHash-2-4-128` under the key of
//!   `"q" ‖ version ‖ client address (family byte ‖ octets) ‖ client port (BE) ‖ transport
//!   (IP protocol number) ‖ DNS id (BE) ‖ name ‖ type ‖ class`, each string length-prefixed
//!   (u32 BE), the name in presentation form in ASCII lower case;
//! - trace id: `SipHash-2-4-128` under the key of `"t" ‖ query key ‖ epoch (u64 BE)`, the
//!   epoch being the wall-clock time of the client's query as this node first saw it in
//!   [`EPOCH_NS`] (10 s) buckets;
//! - span id: `SipHash-2-4` (64 bits) under the key of `"s" ‖ trace id ‖ role`, where the
//!   role is the root, a query sent from a socket (client address, port, transport, DNS id)
//!   or a query served by a socket for a client socket.
//!
//! Any change of these bytes is a new version (the `dnspath.id_scheme` attribute).
use std::{hash::Hasher, net::SocketAddr};

use crate::decode::dns::{RrClass, RrType};
use siphasher::{
    sip::SipHasher24 as Sip64,
    sip128::{Hasher128, SipHasher24 as Sip128},
};

/// The id scheme's version, written as `dnspath.id_scheme`.
pub const VERSION: u8 = 1;
/// The time buckets of trace ids.
pub const EPOCH_NS: u64 = 10_000_000_000;
/// A query seen this close to an epoch boundary may be seen on the other side of it by
/// another node (clocks, network time): its server spans link to the neighbouring epoch's
/// client span (see [`neighbour_epoch`]).
pub const EPOCH_GUARD_NS: u64 = 1_000_000_000;

/// The key every id is made with, from the cluster secret.
#[derive(Clone)]
pub struct IdKey([u8; 16]);

impl std::fmt::Debug for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdKey(..)")
    }
}

impl IdKey {
    pub fn from_secret(secret: &[u8]) -> Self {
        let mut h = Sip128::new_with_key(&[0; 16]);
        h.write(b"dnspath otlp id key v1\0");
        h.write(secret);
        Self(h.finish128().as_bytes())
    }

    fn sip128(&self) -> Sip128 {
        Sip128::new_with_key(&self.0)
    }
}

impl Default for IdKey {
    fn default() -> Self {
        Self::from_secret(b"")
    }
}

/// What every node sees of a client's query.
#[derive(Clone, Copy, Debug)]
pub struct QueryIdentity<'a> {
    pub client: SocketAddr,
    /// IPPROTO_UDP or IPPROTO_TCP.
    pub proto: u8,
    pub dns_id: u16,
    pub name: &'a str,
    pub qtype: RrType,
    pub class: RrClass,
}

fn write_str(h: &mut impl Hasher, s: &str, lower: bool) {
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    h.write(&len.to_be_bytes());
    if lower && s.bytes().any(|b| b.is_ascii_uppercase()) {
        h.write(s.to_ascii_lowercase().as_bytes());
    } else {
        h.write(s.as_bytes());
    }
}

fn write_socket(h: &mut impl Hasher, a: SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            h.write(&[4]);
            h.write(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            h.write(&[6]);
            h.write(&v6.ip().octets());
        }
    }
    h.write(&a.port().to_be_bytes());
}

/// The epoch-free key of a query (`dnspath.query_key`).
pub fn query_key(key: &IdKey, q: &QueryIdentity<'_>) -> [u8; 16] {
    // The scheme hashes the type and class as written (their mnemonics).
    query_key_of(key, q, &q.qtype.name(), &q.class.name())
}

fn query_key_of(key: &IdKey, q: &QueryIdentity<'_>, qtype: &str, class: &str) -> [u8; 16] {
    let mut h = key.sip128();
    h.write(b"q");
    h.write(&[VERSION]);
    write_socket(&mut h, q.client);
    h.write(&[q.proto]);
    h.write(&q.dns_id.to_be_bytes());
    write_str(&mut h, q.name, true);
    write_str(&mut h, qtype, false);
    write_str(&mut h, class, false);
    h.finish128().as_bytes()
}

/// The epoch of a wall-clock time (Unix nanoseconds).
pub fn epoch(wall_ns: u64) -> u64 {
    wall_ns / EPOCH_NS
}

/// The other epoch a node may have seen this query in: the previous one within
/// [`EPOCH_GUARD_NS`] after a boundary, the next one within it before.
pub fn neighbour_epoch(wall_ns: u64) -> Option<u64> {
    let e = epoch(wall_ns);
    let into = wall_ns % EPOCH_NS;
    if into < EPOCH_GUARD_NS {
        e.checked_sub(1)
    } else if EPOCH_NS - into <= EPOCH_GUARD_NS {
        e.checked_add(1)
    } else {
        None
    }
}

/// The trace id of a query key in an epoch; never all zeros (invalid in OTLP).
pub fn trace_id(key: &IdKey, query_key: &[u8; 16], epoch: u64) -> [u8; 16] {
    let mut h = key.sip128();
    h.write(b"t");
    h.write(query_key);
    h.write(&epoch.to_be_bytes());
    let mut id = h.finish128().as_bytes();
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// A span's place in a trace, from which its id follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The client's question (on the client's node).
    Root,
    /// A query sent from `client` over `proto` with `dns_id`: a leg's CLIENT span. The
    /// node that serves it names it as its SERVER span's parent.
    Query {
        client: SocketAddr,
        proto: u8,
        dns_id: u16,
    },
    /// Another leg of the same transaction sent from the same socket with the same DNS id
    /// (a forwarder asking several upstreams at once, dnsmasq's `all-servers`): the
    /// `repeat`-th such leg (from 1) gets an id of its own. A serving node names the first.
    QueryAgain {
        client: SocketAddr,
        proto: u8,
        dns_id: u16,
        repeat: u16,
    },
    /// That query served by `server` (where it was delivered, after DNAT). `repeat` counts
    /// the earlier legs of the transaction served there from the same socket with the same
    /// DNS id (a resend after a truncated answer or a timeout), so each has an id of its own;
    /// only this node names them (its forwards' parents), so its own count is enough.
    Serve {
        client: SocketAddr,
        server: SocketAddr,
        proto: u8,
        dns_id: u16,
        repeat: u16,
    },
}

/// The id of the span with `role` in trace `trace`; never all zeros.
pub fn span_id(key: &IdKey, trace: &[u8; 16], role: Role) -> [u8; 8] {
    let mut h = Sip64::new_with_key(&key.0);
    h.write(b"s");
    h.write(trace);
    match role {
        Role::Root => h.write(b"r"),
        Role::Query {
            client,
            proto,
            dns_id,
        }
        | Role::QueryAgain {
            client,
            proto,
            dns_id,
            ..
        } => {
            h.write(b"c");
            write_socket(&mut h, client);
            h.write(&[proto]);
            h.write(&dns_id.to_be_bytes());
            if let Role::QueryAgain { repeat, .. } = role {
                h.write(b"#");
                h.write(&repeat.to_be_bytes());
            }
        }
        Role::Serve {
            client,
            server,
            proto,
            dns_id,
            repeat,
        } => {
            h.write(b"v");
            write_socket(&mut h, client);
            write_socket(&mut h, server);
            h.write(&[proto]);
            h.write(&dns_id.to_be_bytes());
            if repeat > 0 {
                h.write(b"#");
                h.write(&repeat.to_be_bytes());
            }
        }
    }
    let id = h.finish();
    if id == 0 {
        1u64.to_be_bytes()
    } else {
        id.to_be_bytes()
    }
}

/// Lower-case hex, as OTLP/JSON and the receivers' query APIs write ids.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// Whether a trace is kept at `ratio` (0..=1): decided from the trace id alone, so that
/// every node keeps the same traces (as OpenTelemetry's TraceIdRatioBased: the id's last
/// 8 bytes against the ratio of 2^64).
pub fn sampled(trace: &[u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 || ratio.is_nan() {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace[8..]);
    // 2^64 · ratio, as an integer bound (the float's error is far below any ratio's meaning).
    let bound = (ratio * 18_446_744_073_709_551_616.0) as u64;
    u64::from_be_bytes(low) < bound
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q<'a>(client: &str, id: u16, name: &'a str) -> QueryIdentity<'a> {
        QueryIdentity {
            client: client.parse().unwrap(),
            proto: 17,
            dns_id: id,
            name,
            qtype: RrType::A,
            class: RrClass::IN,
        }
    }

    const T: u64 = 1_764_655_000_000_000_000; // 2025-12-02T05:56:40Z, an epoch's start

    /// Fixed vectors: the same bytes in every run, process, build and node. A change here
    /// is a new id scheme (bump [`VERSION`]).
    #[test]
    fn ids_are_fixed_vectors() {
        let key = IdKey::from_secret(b"cluster-secret");
        let qi = q("10.244.1.2:40005", 54820, "www.lab.test.");
        let qk = query_key(&key, &qi);
        let t = trace_id(&key, &qk, epoch(T));
        let got = [
            hex(&qk),
            hex(&t),
            hex(&span_id(&key, &t, Role::Root)),
            hex(&span_id(
                &key,
                &t,
                Role::Query {
                    client: qi.client,
                    proto: 17,
                    dns_id: 54820,
                },
            )),
            {
                let d = IdKey::default();
                hex(&trace_id(&d, &query_key(&d, &qi), epoch(T)))
            },
        ];
        assert_eq!(
            got,
            [
                "3bb12d49d17d0048e34a3c626f219437",
                "821078ebc7d9068a56281f7d1bd0ee52",
                "b3703580b14ae244",
                "5832a7dbd8103294",
                "8976e01dec28716fbd2301c6feb1dacd",
            ]
        );
    }

    /// "Two nodes": the same inputs made separately (a name in another case, strings not
    /// shared) give the same ids.
    #[test]
    fn two_nodes_agree() {
        let a_key = IdKey::from_secret(b"s");
        // Another node: its own copy of the secret.
        let secret_b: Vec<u8> = vec![b's'];
        let b_key = IdKey::from_secret(&secret_b);
        let name_b = String::from("WWW.Lab.Test.");
        let a = trace_id(
            &a_key,
            &query_key(&a_key, &q("10.0.0.1:5000", 7, "www.lab.test.")),
            epoch(T + 3),
        );
        let b = trace_id(
            &b_key,
            &query_key(&b_key, &q("10.0.0.1:5000", 7, &name_b)),
            epoch(T + 5_000_000),
        );
        assert_eq!(a, b);
        let role = Role::Query {
            client: "10.0.0.1:5000".parse().unwrap(),
            proto: 17,
            dns_id: 7,
        };
        assert_eq!(span_id(&a_key, &a, role), span_id(&b_key, &b, role));
    }

    /// A reused port and DNS id: another epoch, another question, another transport or
    /// another secret is another trace.
    #[test]
    fn reused_port_and_id_do_not_merge() {
        let key = IdKey::from_secret(b"s");
        let base = q("10.0.0.1:5000", 7, "a.lab.test.");
        let qk = query_key(&key, &base);
        let t = trace_id(&key, &qk, epoch(T));
        assert_ne!(t, trace_id(&key, &qk, epoch(T + EPOCH_NS)));
        let other_name = query_key(&key, &q("10.0.0.1:5000", 7, "b.lab.test."));
        assert_ne!(qk, other_name);
        assert_ne!(t, trace_id(&key, &other_name, epoch(T)));
        let aaaa = QueryIdentity {
            qtype: RrType::AAAA,
            ..base
        };
        assert_ne!(qk, query_key(&key, &aaaa));
        let tcp = QueryIdentity { proto: 6, ..base };
        assert_ne!(qk, query_key(&key, &tcp));
        let v6 = q("[::ffff:10.0.0.1]:5000", 7, "a.lab.test.");
        assert_ne!(qk, query_key(&key, &v6));
        assert_ne!(qk, query_key(&IdKey::from_secret(b"t"), &base));
        // Length prefixes: moving bytes between name and type changes the key.
        let x = QueryIdentity {
            name: "a.lab.test.A",
            ..base
        };
        assert_ne!(qk, query_key_of(&key, &x, "", "IN"));
        // Roles are distinct.
        let c: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let s: SocketAddr = "10.0.0.3:53".parse().unwrap();
        let query = |dns_id| Role::Query {
            client: c,
            proto: 17,
            dns_id,
        };
        let serve = |repeat| Role::Serve {
            client: c,
            server: s,
            proto: 17,
            dns_id: 7,
            repeat,
        };
        let ids = [Role::Root, query(7), query(8), serve(0), serve(1)]
            .map(|role| span_id(&key, &t, role));
        for i in 0..ids.len() {
            for j in i + 1..ids.len() {
                assert_ne!(ids[i], ids[j]);
            }
        }
    }

    #[test]
    fn epochs_and_their_neighbours() {
        assert_eq!(neighbour_epoch(T), Some(epoch(T) - 1));
        assert_eq!(neighbour_epoch(T + 5 * 1_000_000_000), None);
        assert_eq!(neighbour_epoch(T + EPOCH_NS - 1), Some(epoch(T) + 1));
    }

    #[test]
    fn sampling_is_a_function_of_the_id() {
        let key = IdKey::default();
        let mut kept = 0;
        for id in 0..10_000u16 {
            let t = trace_id(&key, &query_key(&key, &q("10.0.0.1:5000", id, "x.")), 1);
            assert_eq!(sampled(&t, 0.1), sampled(&t, 0.1));
            assert!(sampled(&t, 1.0) && !sampled(&t, 0.0));
            if sampled(&t, 0.1) {
                kept += 1;
                assert!(sampled(&t, 0.5), "a higher ratio keeps a superset");
            }
        }
        assert!((800..1200).contains(&kept), "{kept}");
    }
}

//! DNS wire format (RFC 1035 §4), just enough for realistic messages, and the scenarios the
//! offline capture cycles through.

pub(super) const T_A: u16 = 1;
const T_NS: u16 = 2;
const T_CNAME: u16 = 5;
const T_SOA: u16 = 6;
const T_PTR: u16 = 12;
const T_MX: u16 = 15;
const T_TXT: u16 = 16;
const T_AAAA: u16 = 28;
const T_SRV: u16 = 33;
const T_OPT: u16 = 41;
/// Compression pointer to the question name, which always starts at offset 12.
const QNAME_PTR: [u8; 2] = [0xc0, 0x0c];

fn put_name(m: &mut Vec<u8>, name: &str) {
    for label in name.trim_end_matches('.').split('.') {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
}

fn put_u16(m: &mut Vec<u8>, v: u16) {
    m.extend_from_slice(&v.to_be_bytes());
}

fn put_u32(m: &mut Vec<u8>, v: u32) {
    m.extend_from_slice(&v.to_be_bytes());
}

/// OPT pseudo-record (RFC 6891 §6.1.2), 1232-byte UDP size, with a client cookie on
/// queries.
fn put_opt(m: &mut Vec<u8>, cookie: Option<u64>) {
    m.push(0);
    put_u16(m, T_OPT);
    put_u16(m, 1232);
    put_u32(m, 0);
    match cookie {
        Some(c) => {
            put_u16(m, 12);
            put_u16(m, 10); // COOKIE (RFC 7873)
            put_u16(m, 8);
            m.extend_from_slice(&c.to_be_bytes());
        }
        None => put_u16(m, 0),
    }
}

/// An answer's rdata, written with its length.
enum Rdata<'a> {
    A([u8; 4]),
    Aaaa([u8; 16]),
    Name(&'a str),
    Mx(u16, &'a str),
    Srv(u16, u16, u16, &'a str),
    Txt(&'a str),
    Soa(&'a str, &'a str),
}

pub(super) struct Rr<'a> {
    /// None: the question name, compressed.
    owner: Option<&'a str>,
    rtype: u16,
    ttl: u32,
    data: Rdata<'a>,
}

fn put_rr(m: &mut Vec<u8>, rr: &Rr) {
    match rr.owner {
        Some(n) => put_name(m, n),
        None => m.extend_from_slice(&QNAME_PTR),
    }
    put_u16(m, rr.rtype);
    put_u16(m, 1);
    put_u32(m, rr.ttl);
    let len_at = m.len();
    put_u16(m, 0);
    match &rr.data {
        Rdata::A(a) => m.extend_from_slice(a),
        Rdata::Aaaa(a) => m.extend_from_slice(a),
        Rdata::Name(n) => put_name(m, n),
        Rdata::Mx(pref, n) => {
            put_u16(m, *pref);
            put_name(m, n);
        }
        Rdata::Srv(prio, weight, port, n) => {
            put_u16(m, *prio);
            put_u16(m, *weight);
            put_u16(m, *port);
            put_name(m, n);
        }
        Rdata::Txt(t) => {
            m.push(t.len() as u8);
            m.extend_from_slice(t.as_bytes());
        }
        Rdata::Soa(mname, rname) => {
            put_name(m, mname);
            put_name(m, rname);
            for v in [2026010101u32, 7200, 1800, 86400, 30] {
                put_u32(m, v);
            }
        }
    }
    let rdlen = (m.len() - len_at - 2) as u16;
    m[len_at..len_at + 2].copy_from_slice(&rdlen.to_be_bytes());
}

pub(super) struct Scenario {
    pub(super) qname: &'static str,
    pub(super) qtype: u16,
    pub(super) rcode: u8,
    pub(super) aa: bool,
    pub(super) answers: Vec<Rr<'static>>,
    pub(super) authority: Vec<Rr<'static>>,
}

pub(super) fn scenarios() -> Vec<Scenario> {
    let rr = |owner, rtype, ttl, data| Rr {
        owner,
        rtype,
        ttl,
        data,
    };
    vec![
        Scenario {
            qname: "www.example.com.",
            qtype: T_A,
            rcode: 0,
            aa: false,
            answers: vec![
                rr(None, T_A, 300, Rdata::A([93, 184, 215, 14])),
                rr(None, T_A, 300, Rdata::A([93, 184, 215, 15])),
            ],
            authority: vec![],
        },
        Scenario {
            qname: "www.example.com.",
            qtype: T_AAAA,
            rcode: 0,
            aa: false,
            answers: vec![rr(
                None,
                T_AAAA,
                300,
                Rdata::Aaaa([
                    0x26, 0x06, 0x28, 0, 0x02, 0x20, 0, 1, 0x2, 0x48, 0x18, 0x93, 0x25, 0xc8, 0x19,
                    0x46,
                ]),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "kubernetes.default.svc.cluster.local.",
            qtype: T_A,
            rcode: 0,
            aa: true,
            answers: vec![rr(None, T_A, 30, Rdata::A([10, 96, 0, 1]))],
            authority: vec![],
        },
        Scenario {
            qname: "_http._tcp.api.default.svc.cluster.local.",
            qtype: T_SRV,
            rcode: 0,
            aa: true,
            answers: vec![rr(
                None,
                T_SRV,
                30,
                Rdata::Srv(0, 100, 80, "api.default.svc.cluster.local."),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "example.org.",
            qtype: T_TXT,
            rcode: 0,
            aa: false,
            answers: vec![rr(
                None,
                T_TXT,
                3600,
                Rdata::Txt("v=spf1 include:_spf.example.org -all"),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "10.0.96.10.in-addr.arpa.",
            qtype: T_PTR,
            rcode: 0,
            aa: true,
            answers: vec![rr(
                None,
                T_PTR,
                30,
                Rdata::Name("kube-dns.kube-system.svc.cluster.local."),
            )],
            authority: vec![],
        },
        Scenario {
            qname: "nosuch.example.com.default.svc.cluster.local.",
            qtype: T_A,
            rcode: 3,
            aa: true,
            answers: vec![],
            authority: vec![rr(
                Some("cluster.local."),
                T_SOA,
                30,
                Rdata::Soa("ns.dns.cluster.local.", "hostmaster.cluster.local."),
            )],
        },
        Scenario {
            qname: "api.example.net.",
            qtype: T_A,
            rcode: 0,
            aa: false,
            answers: vec![
                rr(None, T_CNAME, 60, Rdata::Name("edge.cdn.example.net.")),
                rr(
                    Some("edge.cdn.example.net."),
                    T_A,
                    20,
                    Rdata::A([198, 51, 100, 7]),
                ),
            ],
            authority: vec![rr(
                Some("example.net."),
                T_NS,
                86400,
                Rdata::Name("ns1.example.net."),
            )],
        },
        Scenario {
            qname: "example.com.",
            qtype: T_MX,
            rcode: 0,
            aa: false,
            answers: vec![
                rr(None, T_MX, 3600, Rdata::Mx(10, "mx1.example.com.")),
                rr(None, T_MX, 3600, Rdata::Mx(20, "mx2.example.com.")),
            ],
            authority: vec![],
        },
    ]
}

pub(super) fn dns_message(s: &Scenario, id: u16, response: bool, cookie: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(256);
    put_u16(&mut m, id);
    let flags: u16 = if response {
        0x8000 | 0x0100 | 0x0080 | if s.aa { 0x0400 } else { 0 } | u16::from(s.rcode)
    } else {
        0x0100
    };
    put_u16(&mut m, flags);
    put_u16(&mut m, 1);
    put_u16(&mut m, if response { s.answers.len() as u16 } else { 0 });
    put_u16(
        &mut m,
        if response {
            s.authority.len() as u16
        } else {
            0
        },
    );
    put_u16(&mut m, 1);
    put_name(&mut m, s.qname);
    put_u16(&mut m, s.qtype);
    put_u16(&mut m, 1);
    if response {
        for rr in s.answers.iter().chain(&s.authority) {
            put_rr(&mut m, rr);
        }
    }
    put_opt(&mut m, (!response).then_some(cookie));
    m
}

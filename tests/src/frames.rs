//! Crafted frames for the kernel programs' `BPF_PROG_TEST_RUN` tests and cost benchmark:
//! Ethernet (with VLAN tags), IPv4 (with options, fragments), IPv6 (with extension headers),
//! UDP and TCP (with options) around a small DNS query, and the tunnels (VXLAN, Geneve, GRE)
//! around those.

/// A DNS query: id 0x1234, RD, one question "a.test. A IN", then `extra` bytes of padding
/// (as if an EDNS answer followed).
pub fn dns_query(extra: usize) -> Vec<u8> {
    let mut d = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    d.extend_from_slice(b"\x01a\x04test\x00\x00\x01\x00\x01");
    d.extend(std::iter::repeat_n(0xab, extra));
    d
}

/// A UDP header (checksum 0) and `payload`.
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// TCP with `opt_words` 32-bit words of options (NOPs) and a 2-byte DNS length prefix.
pub fn tcp(sport: u16, dport: u16, opt_words: usize, payload: &[u8]) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
    t.push(((5 + opt_words) as u8) << 4);
    t.push(0x18); // PSH|ACK
    t.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
    t.extend(std::iter::repeat_n(1u8, opt_words * 4));
    t.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    t.extend_from_slice(payload);
    t
}

/// IPv4 10.244.1.2 → 10.96.0.10 carrying `proto` with `option_words` 32-bit words of NOP
/// options and the flags/fragment-offset field `frag`.
pub fn ipv4(proto: u8, option_words: usize, frag: u16, l4: &[u8]) -> Vec<u8> {
    let ihl = 5 + option_words;
    let total = ihl * 4 + l4.len();
    let mut ip = vec![(4 << 4) | ihl as u8, 0];
    ip.extend_from_slice(&(total as u16).to_be_bytes());
    ip.extend_from_slice(&[0x33, 0x44]);
    ip.extend_from_slice(&frag.to_be_bytes());
    ip.extend_from_slice(&[64, proto, 0, 0, 10, 244, 1, 2, 10, 96, 0, 10]);
    ip.extend(std::iter::repeat_n(1u8, option_words * 4)); // NOP options
    ip.extend_from_slice(l4);
    ip
}

/// IPv6 with the extension headers `ext` (each: next-header byte is filled in), then `l4`.
pub fn ipv6(ext: &[Vec<u8>], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut chain: Vec<u8> = Vec::new();
    let mut ext = ext.to_vec();
    // Each header's byte 0 holds its own kind until linked to the next one's.
    let kinds: Vec<u8> = ext.iter().map(|e| e[0]).collect();
    for (i, e) in ext.iter_mut().enumerate() {
        e[0] = kinds.get(i + 1).copied().unwrap_or(proto);
        chain.extend_from_slice(e);
    }
    let first = kinds.first().copied().unwrap_or(proto);
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&((chain.len() + l4.len()) as u16).to_be_bytes());
    ip.push(first);
    ip.push(64);
    ip.extend_from_slice(&[0xfd, 0, 2, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    ip.extend_from_slice(&[0xfd, 0, 2, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]);
    ip.extend_from_slice(&chain);
    ip.extend_from_slice(l4);
    ip
}

/// An 8-byte extension header of `kind` (0 hop-by-hop, 60 destination options) with PadN.
pub fn ext_opts(kind: u8) -> Vec<u8> {
    vec![kind, 0, 1, 4, 0, 0, 0, 0]
}

/// A fragment header (44) at fragment `offset` (8-octet units), more-fragments set,
/// identification 0x1234.
pub fn ext_frag(offset: u16) -> Vec<u8> {
    ext_frag_id(offset, 0x1234)
}

pub fn ext_frag_id(offset: u16, id: u32) -> Vec<u8> {
    let o = (offset << 3) | 1;
    let b = o.to_be_bytes();
    let mut h = vec![44, 0, b[0], b[1]];
    h.extend_from_slice(&id.to_be_bytes());
    h
}

/// Ethernet with `tags` (TPID, VID) pairs, then `ethertype` and `payload`.
pub fn eth(tags: &[(u16, u16)], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    for (tpid, vid) in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A VXLAN header (I flag, `vni`) and the Ethernet `frame` it carries: a UDP payload for
/// port 4789 or 8472.
pub fn vxlan(vni: u32, frame: &[u8]) -> Vec<u8> {
    let mut v = vec![0x08, 0, 0, 0];
    v.extend_from_slice(&(vni << 8).to_be_bytes());
    v.extend_from_slice(frame);
    v
}

/// A Geneve header with `option_words` 32-bit words of options (one option, its class 0x0102),
/// protocol type `proto` (0x6558: Ethernet; 0x0800, 0x86dd) and `vni`, then `inner`: a UDP
/// payload for port 6081.
pub fn geneve(option_words: u8, proto: u16, vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut g = vec![option_words & 0x3f, 0];
    g.extend_from_slice(&proto.to_be_bytes());
    g.extend_from_slice(&(vni << 8).to_be_bytes());
    if option_words > 0 {
        // Class, type, length of the data in words (not counting this 4-byte header).
        g.extend_from_slice(&[0x01, 0x02, 0x80, option_words - 1]);
        g.extend(std::iter::repeat_n(0x5a, usize::from(option_words - 1) * 4));
    }
    g.extend_from_slice(inner);
    g
}

/// A GRE header (version 0) with a checksum when `csum`, the `key` and the sequence number
/// `seq` when given, protocol type `proto`, then `inner`: an IP payload for protocol 47.
pub fn gre(csum: bool, key: Option<u32>, seq: Option<u32>, proto: u16, inner: &[u8]) -> Vec<u8> {
    let flags: u16 = (u16::from(csum) << 15)
        | (u16::from(key.is_some()) << 13)
        | (u16::from(seq.is_some()) << 12);
    let mut g = flags.to_be_bytes().to_vec();
    g.extend_from_slice(&proto.to_be_bytes());
    if csum {
        g.extend_from_slice(&[0xbe, 0xef, 0, 0]);
    }
    if let Some(k) = key {
        g.extend_from_slice(&k.to_be_bytes());
    }
    if let Some(s) = seq {
        g.extend_from_slice(&s.to_be_bytes());
    }
    g.extend_from_slice(inner);
    g
}

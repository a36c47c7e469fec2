//! Decode stage: raw bytes from the IP header on → typed packets and DNS messages.
//!
//! Boundary (used by correlate/sinks; keep it small and stable):
//! - [`parse_ip`]: IPv4/IPv6 + UDP/TCP headers of a captured packet (possibly cut by snaplen).
//! - [`tunnel::decapsulate`]: where a VXLAN, Geneve, GRE or IP-in-IP packet's inner IP
//!   packet starts, and the tunnel it was in.
//! - [`dns::decode`]: one DNS message (hickory-proto) → [`dns::DnsMessage`], serialisable;
//!   [`dns::decode_cut`]: one the capture cut short, as far as its bytes go.
//! - [`frag::Reassembler`]: IP fragment reassembly per hop, with bounded memory; a datagram
//!   whose fragments never all came becomes a [`frag::FragmentLoss`].
//! - [`tcp::TcpReassembler`]: per-flow DNS-over-TCP framing (RFC 7766 §8) with bounded buffers.
//! - [`decoder::Decoder`]: the decode stage of the pipeline: source events → packet and drop
//!   records, counters, and typed observations for the correlate stage.
pub mod decoder;
pub mod dns;
pub mod frag;
pub mod ip;
pub mod observation;
pub mod record;
pub mod tcp;
pub mod tunnel;

pub use ip::{addr_string, parse_ip, IpPacket, Transport};

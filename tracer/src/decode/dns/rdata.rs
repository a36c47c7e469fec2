//! Presentation form of record data (RFC 1035 §3.3 and the types' own RFCs).
use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::{RData, RecordType};
use hickory_proto::serialize::binary::{BinDecoder, Restrict};

use super::reader::RdataReader;
use super::*;

/// RFC 7871 §6: FAMILY, SOURCE PREFIX, SCOPE PREFIX, then the address cut to the prefix.
pub(super) fn ecs_summary(data: &[u8]) -> Option<String> {
    let &[f0, f1, source, scope] = data.first_chunk::<4>()?;
    let addr = data.get(4..)?;
    match u16::from_be_bytes([f0, f1]) {
        1 => {
            let mut octets = [0u8; 4];
            octets.get_mut(..addr.len())?.copy_from_slice(addr);
            Some(format!("{}/{source}/{scope}", Ipv4Addr::from(octets)))
        }
        2 => {
            let mut octets = [0u8; 16];
            octets.get_mut(..addr.len())?.copy_from_slice(addr);
            Some(format!("{}/{source}/{scope}", Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

pub(super) fn rdata_summary(
    names: &mut NameReader<'_>,
    start: usize,
    rtype: u16,
    rdata: &[u8],
) -> Result<String, String> {
    if rdata.is_empty() {
        return Ok(String::new());
    }
    let mut s = String::with_capacity(48);
    match rtype {
        // A
        1 => {
            let octets: [u8; 4] = rdata
                .try_into()
                .map_err(|_| format!("A rdata is {} bytes, not 4", rdata.len()))?;
            push_ipv4(&mut s, octets);
        }
        // AAAA
        28 => {
            let octets: [u8; 16] = rdata
                .try_into()
                .map_err(|_| format!("AAAA rdata is {} bytes, not 16", rdata.len()))?;
            let _ = write!(s, "{}", Ipv6Addr::from(octets));
        }
        // NS, CNAME, PTR, DNAME: a single (possibly compressed) name.
        2 | 5 | 12 | 39 => {
            let mut rd = RdataReader::new(names.msg(), start, rdata.len(), rtype)?;
            s.push_str(rd.name(names)?);
            rd.finish()?;
        }
        // MX
        15 => {
            let mut rd = RdataReader::new(names.msg(), start, rdata.len(), rtype)?;
            push_u32(&mut s, rd.u16()?.into());
            s.push(' ');
            s.push_str(rd.name(names)?);
            rd.finish()?;
        }
        // SRV (RFC 2782): priority weight port target
        33 => {
            let mut rd = RdataReader::new(names.msg(), start, rdata.len(), rtype)?;
            for _ in 0..3 {
                push_u32(&mut s, rd.u16()?.into());
                s.push(' ');
            }
            s.push_str(rd.name(names)?);
            rd.finish()?;
        }
        // SOA: mname rname serial refresh retry expire minimum
        6 => {
            let mut rd = RdataReader::new(names.msg(), start, rdata.len(), rtype)?;
            s.push_str(rd.name(names)?);
            s.push(' ');
            s.push_str(rd.name(names)?);
            for _ in 0..5 {
                s.push(' ');
                push_u32(&mut s, rd.u32()?);
            }
            rd.finish()?;
        }
        // TXT: one or more <character-string>s
        16 => {
            let mut rest = rdata;
            while let Some((&len, tail)) = rest.split_first() {
                let text = tail.get(..usize::from(len)).ok_or_else(|| {
                    format!(
                        "TXT string declares {len} bytes, {} left in rdata",
                        tail.len()
                    )
                })?;
                if !s.is_empty() {
                    s.push(' ');
                }
                push_quoted(&mut s, text);
                rest = tail.get(usize::from(len)..).unwrap_or_default();
            }
        }
        // SVCB, HTTPS: RFC 9460's presentation format (hickory's leaves trailing commas).
        64 | 65 => match super::svcb::svcb_summary(names, start, rdata, rtype) {
            Ok(Some(text)) => s = text,
            Ok(None) | Err(_) => push_generic(&mut s, rdata),
        },
        // CAA, NAPTR, HINFO, SSHFP, TLSA: hickory knows their presentation form.
        // Framing is already safe (rdlength checked), so if hickory rejects the contents the
        // record is still shown, generically.
        257 | 35 | 13 | 44 | 52 => {
            let mut dec = BinDecoder::new(names.msg());
            let parsed = dec.read_slice(start).and_then(|_| {
                let len = Restrict::new(u16::try_from(rdata.len()).unwrap_or(u16::MAX));
                RData::read(&mut dec, RecordType::from(rtype), len)
            });
            match parsed {
                Ok(rd) => {
                    let _ = write!(s, "{rd}");
                }
                Err(_) => push_generic(&mut s, rdata),
            }
        }
        _ => push_generic(&mut s, rdata),
    }
    Ok(s)
}

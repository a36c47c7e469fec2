//! pcap (libpcap) records.
use super::*;

/// Reads one pcap packet record.
pub(super) fn pcap_record<R: Read>(
    input: &mut Input<R>,
    parser: &PcapParser,
    linktype: u32,
) -> Result<(usize, Step), RecordError> {
    let header = parser.header();
    if !input.want(PCAP_RECORD_HEADER_LEN)? {
        return Err(RecordError::Truncated {
            need: PCAP_RECORD_HEADER_LEN as u64,
        });
    }
    let incl = u32_at(input.avail(), 8, header.endianness).unwrap_or(0) as usize;
    if incl > MAX_RECORD - PCAP_RECORD_HEADER_LEN {
        return Err(RecordError::Corrupt(format!(
            "captured length {incl} exceeds the {MAX_RECORD}-byte limit"
        )));
    }
    let len = PCAP_RECORD_HEADER_LEN + incl;
    if !input.want(len)? {
        return Err(RecordError::Truncated { need: len as u64 });
    }
    let avail = input.avail();
    let (_, raw) = parser
        .next_raw_packet(avail)
        .map_err(|e| RecordError::Corrupt(e.to_string()))?;
    let frac_ns = match header.ts_resolution {
        TsResolution::MicroSecond => u64::from(raw.ts_frac) * 1_000,
        TsResolution::NanoSecond => u64::from(raw.ts_frac),
    };
    let frame = Frame {
        ts_ns: u64::from(raw.ts_sec) * 1_000_000_000 + frac_ns,
        iface: 0,
        linktype,
        // Some writers leave orig_len below incl_len; the wire had at least what was kept.
        wire_len: raw.orig_len.max(raw.incl_len),
        dir: None,
        data: PCAP_RECORD_HEADER_LEN..len,
        comment: None,
    };
    Ok((len, Step::Packet(frame)))
}

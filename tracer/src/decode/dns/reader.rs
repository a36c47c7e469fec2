//! hickory's decoder over record data: fields read up to the rdata's end, names through the
//! message's [`NameReader`], and its errors worded for the hostile cases that matter.
use hickory_proto::serialize::binary::{BinDecoder, DecodeError, Restrict};

use super::names::{type_name, NameReader};

/// Reads rdata fields through a decoder over the whole message, since names in rdata may
/// point anywhere before them (RFC 1035 §4.1.4).
pub(super) struct RdataReader<'a> {
    dec: BinDecoder<'a>,
    end: usize,
    rtype: u16,
}

impl<'a> RdataReader<'a> {
    pub(super) fn new(msg: &'a [u8], start: usize, len: usize, rtype: u16) -> Result<Self, String> {
        let mut dec = BinDecoder::new(msg);
        dec.read_slice(start).map_err(|e| e.to_string())?;
        Ok(Self {
            dec,
            end: start.saturating_add(len),
            rtype,
        })
    }

    pub(super) fn fail(&self, e: DecodeError) -> String {
        format!("{} rdata: {}", type_name(self.rtype), describe(e))
    }

    pub(super) fn name<'n>(&mut self, names: &'n mut NameReader<'_>) -> Result<&'n str, String> {
        names.read(&mut self.dec).map_err(|e| self.fail(e))
    }

    pub(super) fn u16(&mut self) -> Result<u16, String> {
        self.dec
            .read_u16()
            .map(Restrict::unverified)
            .map_err(|e| self.fail(e))
    }

    pub(super) fn u32(&mut self) -> Result<u32, String> {
        self.dec
            .read_u32()
            .map(Restrict::unverified)
            .map_err(|e| self.fail(e))
    }

    /// How far into the rdata (which starts at `start` in the message) the fields read so
    /// far reach.
    pub(super) fn offset_in(&self, start: usize) -> usize {
        self.dec.index().saturating_sub(start)
    }

    /// The fields must fill the rdata exactly; anything else means the record is misframed.
    pub(super) fn finish(self) -> Result<(), String> {
        let at = self.dec.index();
        if at == self.end {
            Ok(())
        } else {
            Err(format!(
                "{} fields end at offset {at}, rdata ends at {}",
                type_name(self.rtype),
                self.end
            ))
        }
    }
}

/// hickory's messages, reworded where they are cryptic for the hostile cases that matter.
pub(super) fn describe(e: DecodeError) -> String {
    match e {
        DecodeError::PointerNotPriorToLabel { idx, ptr } => format!(
            "compression pointer at offset {idx} targets offset {ptr}, which is not before \
             the name (pointer loop, forward or out-of-range pointer)"
        ),
        DecodeError::LabelOverlapsWithOther { label, other } => {
            format!("compressed name at offset {label} runs into offset {other} (pointer loop)")
        }
        DecodeError::UnrecognizedLabelCode(b) => format!(
            "label length byte {b:#04x} has reserved high bits (label longer than 63 bytes?)"
        ),
        DecodeError::LabelBytesTooLong(n) => format!("label of {n} bytes exceeds 63"),
        DecodeError::DomainNameTooLong(_) => "domain name exceeds 255 bytes".into(),
        DecodeError::InsufficientBytes => "message ends in the middle of this entry".into(),
        other => other.to_string(),
    }
}

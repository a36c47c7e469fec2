//! One DNS message, whole and cut at every length the input says: decoded or an error,
//! never a panic, and a decoded message's presentation never fails.
#![no_main]
use dnspath::decode::dns::{decode, decode_cut};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode(data) {
        let _ = m.summary_line();
    }
    // The first two bytes choose where a capture cut the rest (as a snaplen would).
    if let Some((cut, rest)) = data.split_first_chunk::<2>() {
        let at = usize::from(u16::from_be_bytes(*cut)) % (rest.len() + 1);
        if let Some(part) = rest.get(..at) {
            if let Ok(Some(m)) = decode_cut(part, rest.len()) {
                let _ = m.summary_line();
            }
        }
    }
});

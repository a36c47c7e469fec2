//! Storm shedding: under a detected forwarding loop, the looping question's UDP packets are
//! only counted, recognised by the wire form of their question before any decoding.
use super::*;
use crate::decode::dns::{RrClass, RrType};

/// Packets of one looping question that were counted instead of decoded.
#[derive(Clone, Debug)]
pub struct Summarised {
    pub name: String,
    pub qtype: RrType,
    pub class: RrClass,
    /// Since the last [`Decoder::take_summarised`].
    pub count: u64,
    pub last_ts: u64,
}

/// Lowercased wire form of a message's first question (name, type, class) in `buf`:
/// cheap enough to run on every packet before decoding.
pub(super) fn question_key<'b>(payload: &[u8], buf: &'b mut [u8; 264]) -> Option<&'b [u8]> {
    if payload.get(4..6)? == [0, 0] {
        return None;
    }
    let mut i = 12;
    let mut n = 0;
    loop {
        let len = *payload.get(i)? as usize;
        if len & 0xc0 != 0 {
            return None;
        }
        *buf.get_mut(n)? = len as u8;
        n += 1;
        i += 1;
        if len == 0 {
            break;
        }
        for b in payload.get(i..i + len)? {
            *buf.get_mut(n)? = b.to_ascii_lowercase();
            n += 1;
        }
        i += len;
    }
    buf.get_mut(n..n + 4)?
        .copy_from_slice(payload.get(i..i + 4)?);
    buf.get(..n + 4)
}

/// A question's lowercased wire form (name, type, class): how the decoder and the kernel
/// recognise a looping question's packets before decoding them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WireQuestion(Box<[u8]>);

impl WireQuestion {
    /// From the name's presentation form; `None` for what has no wire form (an escaped
    /// label).
    pub fn of(name: &str, qtype: RrType, class: RrClass) -> Option<Self> {
        question_key_of(name, qtype, class).map(Self)
    }

    /// The kernel's hash of it (`tracer_common::shed`).
    pub fn hash(&self) -> u64 {
        tracer_common::shed::hash(&self.0)
    }
}

/// The kernel's hash of a question (`tracer_common::shed`), from presentation form.
pub fn question_hash(name: &str, qtype: RrType, class: RrClass) -> Option<u64> {
    question_key_of(name, qtype, class).map(|k| tracer_common::shed::hash(&k))
}

/// The same key built from the name in presentation form.
pub(super) fn question_key_of(name: &str, qtype: RrType, class: RrClass) -> Option<Box<[u8]>> {
    let mut out = Vec::with_capacity(name.len() + 6);
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        if label.len() > 63 || label.contains('\\') {
            return None;
        }
        out.push(label.len() as u8);
        out.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
    }
    out.push(0);
    out.extend(qtype.0.to_be_bytes());
    out.extend(class.0.to_be_bytes());
    Some(out.into_boxed_slice())
}

impl Decoder {
    /// From now on only count UDP packets of this question (an active loop).
    pub fn summarise_question(&mut self, name: &str, qtype: RrType, class: RrClass) {
        if let Some(key) = question_key_of(name, qtype, class) {
            self.summarise.entry(key).or_insert_with(|| Summarised {
                name: name.to_string(),
                qtype,
                class,
                count: 0,
                last_ts: 0,
            });
        }
    }

    /// From now on only count UDP packets of `key`, reported as `name`, `qtype`, `class`.
    pub fn summarise(&mut self, key: &WireQuestion, name: &str, qtype: RrType, class: RrClass) {
        if !self.summarise.contains_key(&key.0) {
            self.summarise.insert(
                key.0.clone(),
                Summarised {
                    name: name.to_string(),
                    qtype,
                    class,
                    count: 0,
                    last_ts: 0,
                },
            );
        }
    }

    /// Decode the packets of `key` again.
    pub fn unsummarise(&mut self, key: &WireQuestion) {
        self.summarise.remove(&key.0);
    }

    /// Decode this question's packets again (the loop ended).
    pub fn stop_summarising(&mut self, name: &str, qtype: RrType, class: RrClass) {
        if let Some(key) = question_key_of(name, qtype, class) {
            self.summarise.remove(&key);
        }
    }

    /// Counts since the last call, per question.
    pub fn take_summarised(&mut self, out: &mut Vec<Summarised>) {
        for s in self.summarise.values_mut() {
            if s.count > 0 {
                out.push(s.clone());
                s.count = 0;
            }
        }
    }

    /// `n` packets of a looping question the kernel only counted (live storm shedding).
    pub fn kernel_shed(&mut self, n: u64) {
        self.stats.shed += n;
    }
}

//! A question's type and class as the wire has them: 16-bit codes, carried as such from
//! decode to the sinks (correlate keys, metric labels, storm shedding, OTLP ids) and made
//! into their mnemonic (`A`, `TYPE65534`, `CLASS3`…) only where text is written. A
//! response code likewise, carried with its mnemonic (borrowed for the registry's names).
use std::{borrow::Cow, fmt};

use serde::{Serialize, Serializer};

use super::{class_name, known_type_name, names::rcode_name, type_name, Text};

/// A resource record type (RFC 1035 §3.2.2), any 16-bit code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RrType(pub u16);

/// A resource record class (RFC 1035 §3.2.4), any 16-bit code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RrClass(pub u16);

impl RrType {
    pub const A: Self = Self(1);
    pub const AAAA: Self = Self(28);
    pub const HINFO: Self = Self(13);

    /// Its mnemonic: the IANA name, or `TYPE<code>` (RFC 3597) for a type without one.
    pub fn name(self) -> Text {
        type_name(self.0)
    }

    /// The mnemonic of a type that has one (no allocation).
    pub fn known_name(self) -> Option<&'static str> {
        known_type_name(self.0)
    }

    /// The types whose mnemonic is `word`, ignoring case (how `--qtype` words are read): the
    /// one named so, or `TYPE<code>` for a code without a name.
    pub fn named(word: &str) -> Option<Self> {
        let upper = word.to_ascii_uppercase();
        if let Some(code) = upper
            .strip_prefix("TYPE")
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u16>().ok())
        {
            let t = Self(code);
            return (t.name() == upper.as_str()).then_some(t);
        }
        (0..=u16::MAX)
            .map(Self)
            .find(|t| t.known_name() == Some(upper.as_str()))
    }
}

impl RrClass {
    pub const IN: Self = Self(1);

    /// Its mnemonic: `IN`, `CH`, `HS`, `NONE`, `ANY`, or `CLASS<code>` (RFC 3597).
    pub fn name(self) -> Text {
        class_name(self.0)
    }
}

impl fmt::Display for RrType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Display for RrClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Debug for RrType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Debug for RrClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Written as its mnemonic.
impl Serialize for RrType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// Written as its mnemonic.
impl Serialize for RrClass {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// A response code (RFC 1035 §4.1.1; 12 bits with EDNS, RFC 6891 §6.1.3) and its mnemonic:
/// IANA's name, or `RCODE<code>` for a code without one. Compared by code; written as, and
/// read as (`Deref`), its mnemonic.
#[derive(Clone)]
pub struct Rcode {
    code: u16,
    name: Text,
}

impl Rcode {
    pub const NOERROR: Self = Self::known(0, "NOERROR");
    pub const SERVFAIL: Self = Self::known(2, "SERVFAIL");
    pub const NXDOMAIN: Self = Self::known(3, "NXDOMAIN");
    pub const REFUSED: Self = Self::known(5, "REFUSED");

    const fn known(code: u16, name: &'static str) -> Self {
        Self {
            code,
            name: Cow::Borrowed(name),
        }
    }

    /// The code `code`, named.
    pub fn new(code: u16) -> Self {
        Self {
            code,
            name: rcode_name(code),
        }
    }

    pub fn code(&self) -> u16 {
        self.code
    }

    /// SERVFAIL or REFUSED: the server failed, or would not answer (what `--failures` counts
    /// as a failed answer).
    pub fn is_failure(&self) -> bool {
        *self == Self::SERVFAIL || *self == Self::REFUSED
    }
}

impl PartialEq for Rcode {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code
    }
}

impl Eq for Rcode {}

impl std::hash::Hash for Rcode {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.code.hash(state);
    }
}

impl std::ops::Deref for Rcode {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for Rcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Debug for Rcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Written as its mnemonic.
impl Serialize for Rcode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

/// Tests name rcodes by their mnemonic; a word that is none (the text tests write hostile
/// ones) is kept as the name of a code no message can carry (above 12 bits).
#[cfg(test)]
impl From<&str> for Rcode {
    fn from(word: &str) -> Self {
        (0..4096)
            .map(Self::new)
            .find(|r| &*r.name == word)
            .unwrap_or_else(|| Self {
                code: u16::MAX,
                name: word.to_owned().into(),
            })
    }
}

#[cfg(test)]
impl From<String> for Rcode {
    fn from(word: String) -> Self {
        Self::from(word.as_str())
    }
}

#[cfg(test)]
impl PartialEq<&str> for Rcode {
    fn eq(&self, other: &&str) -> bool {
        &*self.name == *other
    }
}

/// Tests compare with the mnemonic they expect.
#[cfg(test)]
impl PartialEq<&str> for RrType {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

#[cfg(test)]
impl PartialEq<&str> for RrClass {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

/// Tests name types and classes by their mnemonic.
#[cfg(test)]
impl From<&str> for RrType {
    fn from(word: &str) -> Self {
        Self::named(word).unwrap_or(Self(0))
    }
}

#[cfg(test)]
impl From<String> for RrType {
    fn from(word: String) -> Self {
        Self::from(word.as_str())
    }
}

#[cfg(test)]
impl From<&str> for RrClass {
    fn from(word: &str) -> Self {
        (0..=u16::MAX)
            .map(Self)
            .find(|c| c.name().eq_ignore_ascii_case(word))
            .unwrap_or(Self(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mnemonics_are_those_of_decode() {
        for code in [0, 1, 17, 28, 29, 99, 249, 255, 256, 65280, 65305, 65534] {
            assert_eq!(RrType(code).name(), type_name(code));
            assert_eq!(RrClass(code).name(), class_name(code));
        }
        assert_eq!(RrType(65534).to_string(), "TYPE65534");
        assert_eq!(RrClass(3).to_string(), "CH");
        assert_eq!(RrClass(42).to_string(), "CLASS42");
        assert_eq!(serde_json::to_string(&RrType(28)).unwrap(), "\"AAAA\"");
    }

    #[test]
    fn rcodes_are_their_code_written_as_their_mnemonic() {
        assert_eq!(Rcode::new(2), Rcode::SERVFAIL);
        assert_eq!(&*Rcode::new(3), "NXDOMAIN");
        assert_eq!(Rcode::new(4095).to_string(), "RCODE4095");
        assert_eq!(
            serde_json::to_string(&Rcode::new(16)).unwrap(),
            "\"BADVERS\""
        );
        let failures: Vec<u16> = (0..4096)
            .map(Rcode::new)
            .filter(Rcode::is_failure)
            .map(|r| r.code())
            .collect();
        assert_eq!(failures, [2, 5]);
    }

    #[test]
    fn words_name_the_types_they_spell() {
        assert_eq!(RrType::named("aaaa"), Some(RrType::AAAA));
        assert_eq!(RrType::named("spf"), Some(RrType(99)));
        assert_eq!(RrType::named("TYPE65534"), Some(RrType(65534)));
        // `TYPE1` is not how A is written, so it names nothing.
        assert_eq!(RrType::named("TYPE1"), None);
        assert_eq!(RrType::named("TYPE65305"), Some(RrType(65305)));
        assert_eq!(RrType::named("ANAME"), None);
        assert_eq!(RrType::named("nonsense"), None);
        assert_eq!(RrType::named(""), None);
    }
}

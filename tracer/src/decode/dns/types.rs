//! A question's type and class as the wire has them: 16-bit codes, carried as such from
//! decode to the sinks (correlate keys, metric labels, storm shedding, OTLP ids) and made
//! into their mnemonic (`A`, `TYPE65534`, `CLASS3`…) only where text is written.
use std::fmt;

use serde::{Serialize, Serializer};

use super::{class_name, known_type_name, type_name, Text};

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

//! The one syntax of every duration flag and of every size flag.
//!
//! Durations: a plain number of seconds, fractions allowed (`5`, `0.5`, as the flags always
//! took), or a duration with units (`30s`, `1m30s`, `500ms`, humantime's syntax). The value is
//! kept as given and checked when the run starts, so that a flag that would make a run capture
//! nothing or never end is one `dnspath: …` line naming it (exit 1), as before.
//!
//! Sizes: a plain number of megabytes (millions of bytes, as the flags always took), or with a
//! unit: `B`, `kB`/`MB`/`GB` (powers of 1000), `KiB`/`MiB`/`GiB` (powers of 1024), and
//! tcpdump's `-C` suffixes `k`, `m`, `g` (KiB, MiB, GiB). Units are case-insensitive.
use std::{fmt, time::Duration};

/// Longest duration accepted: about 31 years.
const MAX_SECS: f64 = 1e9;

/// A duration flag's value, as given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Secs {
    /// A plain number of seconds (not yet checked: `0`, `inf` and `1e10` parse).
    Number(f64),
    /// A duration with units.
    Units(Duration),
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secs::Number(s) => write!(f, "{s}"),
            Secs::Units(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

impl std::str::FromStr for Secs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(n) = s.parse::<f64>() {
            return Ok(Secs::Number(n));
        }
        humantime::parse_duration(s).map(Secs::Units).map_err(|e| {
            format!(
                "{s:?} is not a duration: seconds (`5`, `0.5`) or with units (`30s`, `1m30s`, `500ms`): {e}"
            )
        })
    }
}

impl Secs {
    /// The duration, if it is longer than zero and shorter than about 31 years; else the
    /// error names `flag`.
    pub fn positive(self, flag: &str) -> anyhow::Result<Duration> {
        let s = match self {
            Secs::Number(s) => s,
            Secs::Units(d) => d.as_secs_f64(),
        };
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!("{flag} must be a positive number of seconds, got {self}")
        }
        if s >= MAX_SECS {
            anyhow::bail!(
                "{flag} {self} is too long: at most {} seconds (about 31 years); leave --duration out to run until stopped",
                MAX_SECS - 1.0
            )
        }
        Ok(match self {
            Secs::Number(s) => Duration::from_secs_f64(s),
            Secs::Units(d) => d,
        })
    }

    /// The duration, zero allowed (`--slower-than 0`, `-G 0`); else the error names `flag`.
    pub fn non_negative(self, flag: &str) -> anyhow::Result<Duration> {
        match self {
            Secs::Units(d) => Ok(d),
            Secs::Number(s) => Duration::try_from_secs_f64(s)
                .map_err(|_| anyhow::anyhow!("{flag} must be 0 or more seconds, got {self}")),
        }
    }

    /// [`Self::positive`] in nanoseconds, saturated.
    pub fn positive_ns(self, flag: &str) -> anyhow::Result<u64> {
        Ok(u64::try_from(self.positive(flag)?.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// clap's parser of duration flags.
pub fn parse_secs(s: &str) -> Result<Secs, String> {
    s.parse()
}

/// clap's parser of size flags: bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let scale: u64 = match unit.as_str() {
        "" | "mb" => 1_000_000,
        "b" => 1,
        "kb" => 1_000,
        "gb" => 1_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => u64::MAX,
    };
    match digits.parse::<u64>() {
        Ok(n) if scale != u64::MAX => Ok(n.saturating_mul(scale)),
        _ => Err(format!(
            "{s:?} is not a size: a whole number of megabytes (`64`), or with a unit \
             (`10MB`, `512KiB`, `2k`, `1GiB`, `4096B`)"
        )),
    }
}

/// [`parse_size`], but zero is refused (a file that holds nothing: `-C`).
pub fn parse_positive_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("{s:?} is not a file size: give more than 0")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> Secs {
        parse_secs(s).unwrap()
    }

    #[test]
    fn plain_seconds_are_taken_as_before() {
        assert_eq!(secs("5").positive("--t").unwrap(), Duration::from_secs(5));
        assert_eq!(
            secs("0.25").positive("--t").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            secs("1e3").positive("--t").unwrap(),
            Duration::from_secs(1000)
        );
        let e = secs("0").positive("--duration").unwrap_err().to_string();
        assert!(e.starts_with("--duration must be a positive number"), "{e}");
        let e = secs("inf").positive("--timeout").unwrap_err().to_string();
        assert!(e.starts_with("--timeout must be a positive number"), "{e}");
        let e = secs("1e10").positive("--duration").unwrap_err().to_string();
        assert!(e.starts_with("--duration 10000000000 is too long"), "{e}");
    }

    #[test]
    fn durations_with_units() {
        for (s, want) in [
            ("30s", Duration::from_secs(30)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("2h", Duration::from_secs(7200)),
        ] {
            assert_eq!(secs(s).positive("--t").unwrap(), want, "{s}");
        }
        let e = secs("0s").positive("--timeout").unwrap_err().to_string();
        assert!(e.starts_with("--timeout must be a positive number"), "{e}");
        let e = secs("40years")
            .positive("--duration")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is too long"), "{e}");
        assert!(parse_secs("soon").is_err());
        assert_eq!(secs("0").non_negative("--t").unwrap(), Duration::ZERO);
        assert_eq!(secs("0s").non_negative("--t").unwrap(), Duration::ZERO);
        assert!(secs("-1").non_negative("--t").is_err());
        assert!(secs("nan").non_negative("--t").is_err());
        assert!(parse_secs("").is_err());
    }

    #[test]
    fn sizes() {
        for (s, want) in [
            ("64", 64_000_000),
            ("0", 0),
            ("10MB", 10_000_000),
            ("10mb", 10_000_000),
            ("512KiB", 512 * 1024),
            ("2k", 2048),
            ("3M", 3 << 20),
            ("1g", 1 << 30),
            ("1GiB", 1 << 30),
            ("5GB", 5_000_000_000),
            ("4096B", 4096),
            ("7kB", 7000),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        for bad in ["", "MB", "1.5MB", "-1", "10 parsecs", "k2"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_positive_size("0").is_err());
        assert!(parse_positive_size("0k").is_err());
        assert_eq!(parse_positive_size("1"), Ok(1_000_000));
    }
}

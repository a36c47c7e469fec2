//! Time, in one place: the clock packet events are stamped with (CLOCK_BOOTTIME live,
//! Unix-epoch time in capture files), its conversion to wall-clock text, and the one way
//! durations are written for people.
use std::{
    fmt,
    time::{SystemTime, UNIX_EPOCH},
};

/// Wall-clock time as Unix-epoch nanoseconds, written (`Display`, and serialised as a
/// string) as RFC 3339 UTC with microseconds, e.g. `2024-05-01T12:00:00.123456Z`: records
/// keep the number and the text is made only when a sink writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WallTime(pub u64);

/// Bytes of [`WallTime::text`]: `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
pub const WALL_TEXT_LEN: usize = 27;

impl WallTime {
    /// The RFC 3339 text written into `buf`, without the formatter (a record's time is
    /// written for every record a sink shows). Unix-epoch nanoseconds in a `u64` end in
    /// 2554, so the year has four digits.
    pub fn text(self, buf: &mut [u8; WALL_TEXT_LEN]) -> &str {
        let secs = self.0 / 1_000_000_000;
        let micros = (self.0 % 1_000_000_000) / 1_000;
        let (days, sod) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days);
        let mut put = |at: usize, width: usize, mut v: u64| {
            for i in (0..width).rev() {
                buf[at + i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, sod / 3600);
        put(14, 2, sod / 60 % 60);
        put(17, 2, sod % 60);
        put(20, 6, micros);
        for (at, c) in [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
        ] {
            buf[at] = c;
        }
        buf[26] = b'Z';
        // Only ASCII digits and separators were written.
        std::str::from_utf8(buf).unwrap_or_default()
    }
}

/// (year, month, day) of the proleptic Gregorian calendar, `days` after 1970-01-01
/// (Howard Hinnant's `civil_from_days`, for days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

impl fmt::Display for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text(&mut [0; WALL_TEXT_LEN]))
    }
}

impl serde::Serialize for WallTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.text(&mut [0; WALL_TEXT_LEN]))
    }
}

/// For `serialize_with`: Unix-epoch nanoseconds written as [`WallTime`] writes them.
pub fn serialize_wall_ns<S: serde::Serializer>(ns: &u64, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&WallTime(*ns), s)
}

/// CLOCK_BOOTTIME in nanoseconds, the clock of live packet events (`bpf_ktime_get_boot_ns`);
/// 0 if it cannot be read.
pub fn boottime_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| {
            u64::try_from(t.tv_sec())
                .unwrap_or(0)
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0))
        })
        .unwrap_or(0)
}

/// Turns a source's timestamps into wall-clock time.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// Live: CLOCK_BOOTTIME ns; `offset_ns` = realtime − boottime at start.
    Boot { offset_ns: i128 },
    /// Files: timestamps are already Unix-epoch ns.
    Epoch,
}

impl Clock {
    pub fn boot() -> Self {
        let real = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME);
        let boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME);
        let ns = |t: nix::sys::time::TimeSpec| {
            i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
        };
        match (real, boot) {
            (Ok(r), Ok(b)) => Clock::Boot {
                offset_ns: ns(r) - ns(b),
            },
            _ => Clock::Boot { offset_ns: 0 },
        }
    }

    /// Unix-epoch nanoseconds of a timestamp on this clock.
    pub fn epoch_ns(&self, ts_ns: u64) -> u64 {
        let epoch_ns = match self {
            Clock::Boot { offset_ns } => (i128::from(ts_ns) + offset_ns).max(0),
            Clock::Epoch => i128::from(ts_ns),
        };
        u64::try_from(epoch_ns).unwrap_or(u64::MAX)
    }

    /// Wall-clock time of a timestamp on this clock (written as RFC 3339, microseconds,
    /// UTC).
    pub fn wall(&self, ts_ns: u64) -> WallTime {
        WallTime(self.epoch_ns(ts_ns))
    }

    /// Now, on this clock.
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Boot { .. } => boottime_ns(),
            Clock::Epoch => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .unwrap_or(0),
        }
    }
}

/// A duration for people: `1.25 s`, `3.40 ms`, `120 µs`.
pub fn format_duration(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{} µs", ns / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The RFC 3339 text humantime writes, for comparison.
    fn humantime_text(ns: u64) -> String {
        humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
    }

    #[test]
    fn wall_time_text_is_humantimes_rfc3339() {
        let day = 86_400 * 1_000_000_000u64;
        let mut cases = vec![0, 1, 999, 1_000, u64::MAX, u64::MAX - 1];
        // Every day boundary (and a second before it) of 1970-2554 in 97-day steps, leap
        // days of 2000, 2100 (none), 2400 and 2024, a year's end.
        cases.extend(
            (0..u64::MAX / day)
                .step_by(97)
                .flat_map(|d| [d * day, d * day + day - 1]),
        );
        for (y, m, d) in [
            (2000u64, 2, 29),
            (2000, 3, 1),
            (2100, 2, 28),
            (2100, 3, 1),
            (2400, 2, 29),
            (2024, 2, 29),
            (2023, 12, 31),
        ] {
            let days = (1970..y)
                .map(|yr| {
                    if yr % 4 == 0 && (yr % 100 != 0 || yr % 400 == 0) {
                        366
                    } else {
                        365
                    }
                })
                .sum::<u64>()
                + [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][..(m - 1) as usize]
                    .iter()
                    .sum::<u64>()
                + u64::from(m > 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))
                + d
                - 1;
            cases.push(days * day + 12 * 3_600_000_000_000 + 345_678_901);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x);
        }
        for ns in cases {
            assert_eq!(WallTime(ns).to_string(), humantime_text(ns), "at {ns} ns");
        }
        assert_eq!(
            WallTime(1_714_564_800_123_456_789).to_string(),
            "2024-05-01T12:00:00.123456Z"
        );
    }

    #[test]
    fn durations_read_well_at_every_scale() {
        assert_eq!(format_duration(5_000_000_000), "5.00 s");
        assert_eq!(format_duration(1_250_000), "1.25 ms");
        assert_eq!(format_duration(120_400), "120 µs");
        assert_eq!(format_duration(0), "0 µs");
    }

    #[test]
    fn epoch_clock_prints_the_file_time() {
        assert_eq!(
            Clock::Epoch.wall(1_000_000_000).to_string(),
            "1970-01-01T00:00:01.000000Z"
        );
    }
}

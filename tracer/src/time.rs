//! Time, in one place: the clock packet events are stamped with (CLOCK_BOOTTIME live,
//! Unix-epoch time in capture files), its conversion to wall-clock text, and the one way
//! durations are written for people.
use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// Wall-clock time as Unix-epoch nanoseconds, written (`Display`, and serialised as a
/// string) as RFC 3339 UTC with microseconds, e.g. `2024-05-01T12:00:00.123456Z`: records
/// keep the number and the text is made only when a sink writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WallTime(pub u64);

impl fmt::Display for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(
            &humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_nanos(self.0)),
            f,
        )
    }
}

impl serde::Serialize for WallTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
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

//! Durations as people read them in messages: `2s 2ms`, not `2.001639427s`.

use std::time::Duration;

/// `d` rounded for a reader (to the millisecond from a second up, to the
/// microsecond below a second) and shown as humantime does: `2s 2ms`,
/// `12ms 346us`, `587ns`.
pub fn duration(d: Duration) -> humantime::FormattedDuration {
    let step: u32 = if d >= Duration::from_secs(1) {
        1_000_000
    } else if d >= Duration::from_micros(1) {
        1_000
    } else {
        1
    };
    let nanos = (d.subsec_nanos() + step / 2) / step * step;
    let rounded = if nanos >= 1_000_000_000 {
        // Rounded up to the next second; at the clock's end, down instead.
        Duration::from_secs(d.as_secs())
            .checked_add(Duration::from_secs(1))
            .unwrap_or(Duration::new(d.as_secs(), d.subsec_nanos() / step * step))
    } else {
        Duration::new(d.as_secs(), nanos)
    };
    humantime::format_duration(rounded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_rounded_for_a_reader() {
        let cases = [
            (Duration::from_nanos(2_001_639_427), "2s 2ms"),
            (Duration::from_nanos(585_553), "586us"),
            (Duration::from_nanos(12_345_678), "12ms 346us"),
            (Duration::from_nanos(587), "587ns"),
            (Duration::from_nanos(1_999_999_999), "2s"),
            (Duration::from_secs(30), "30s"),
            (Duration::ZERO, "0s"),
            (
                Duration::MAX,
                "584542046090years 7months 15days 17h 5m 3s 999ms",
            ),
        ];
        for (d, text) in cases {
            assert_eq!(duration(d).to_string(), text, "{d:?}");
        }
    }
}

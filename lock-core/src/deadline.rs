//! Deadline arithmetic: how long a holder may trust its grant.

use std::time::Duration;

use tokio::time::Instant;

/// The margin subtracted from every TTL to allow for the server's clock
/// running faster than the client's: `fraction * ttl + fixed`.
///
/// Default: 1 % of the TTL plus 2 ms, as in the Redlock paper's
/// recommendation for clock drift.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftMargin {
    /// Proportional part, as a fraction of the TTL (0.01 = 1 %).
    pub fraction: f64,
    /// Fixed part.
    pub fixed: Duration,
}

impl Default for DriftMargin {
    fn default() -> Self {
        DriftMargin {
            fraction: 0.01,
            fixed: Duration::from_millis(2),
        }
    }
}

impl DriftMargin {
    /// The margin for a given TTL. A fraction outside 0..=1 counts as the
    /// nearer end, and one that is not a number as the whole TTL (the safe
    /// side: every grant is then refused as past its deadline).
    pub fn for_ttl(&self, ttl: Duration) -> Duration {
        let fraction = if self.fraction.is_nan() {
            1.0
        } else {
            self.fraction.clamp(0.0, 1.0)
        };
        // `mul_f64` panics past `Duration::MAX`; such a margin is the whole clock.
        Duration::try_from_secs_f64(ttl.as_secs_f64() * fraction)
            .unwrap_or(Duration::MAX)
            .saturating_add(self.fixed)
    }

    /// How long a grant of `ttl` may be trusted from its request's send
    /// time: the TTL less the margin and `extra`.
    pub fn validity(&self, ttl: Duration, extra: Duration) -> Duration {
        ttl.saturating_sub(self.for_ttl(ttl).saturating_add(extra))
    }

    /// The deadline of a grant whose request was sent at `sent_at`: the
    /// server starts the TTL no earlier than it received the request, so
    /// counting from the send time errs on the safe side.
    pub fn deadline(&self, sent_at: Instant, ttl: Duration, extra: Duration) -> Instant {
        // Validated TTLs are at most a day; an unchecked one must not panic.
        sent_at
            .checked_add(self.validity(ttl, extra))
            .unwrap_or(sent_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_margin_is_one_percent_plus_two_ms() {
        let m = DriftMargin::default();
        assert_eq!(
            m.for_ttl(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
    }

    /// Odd settings (the fields are public) give a margin on the safe
    /// side, never a panic.
    #[test]
    fn odd_margins_err_on_the_safe_side_without_panicking() {
        let ttl = Duration::from_secs(10);
        let not_a_number = DriftMargin {
            fraction: f64::NAN,
            fixed: Duration::ZERO,
        };
        assert_eq!(not_a_number.for_ttl(ttl), ttl);
        let huge = DriftMargin {
            fraction: f64::INFINITY,
            fixed: Duration::MAX,
        };
        assert_eq!(huge.for_ttl(ttl), Duration::MAX);
        let sent = Instant::now();
        assert_eq!(huge.deadline(sent, ttl, Duration::MAX), sent);
    }

    #[test]
    fn deadline_counts_from_the_send_time() {
        let m = DriftMargin::default();
        let sent = Instant::now();
        let d = m.deadline(sent, Duration::from_secs(1), Duration::from_millis(8));
        assert_eq!(d - sent, Duration::from_millis(1000 - 12 - 8));
    }
}

//! A waiter's place in a key's waiting line, and the lease that keeps it.

use std::fmt;
use std::time::Duration;

use crate::{Error, Result};

/// How long a place in line lasts without a refresh, unless configured:
/// short enough that a waiter that dies at the head of the line holds the
/// others up for well under a second, long enough that a waiter refreshing
/// every third of it is not dropped by one slow round trip.
pub const DEFAULT_WAITER_LEASE: Duration = Duration::from_millis(400);

/// The shortest waiter lease accepted: below it, the refreshes of a
/// crowd of waiters would cost more than the handoffs they wait for.
const MIN_WAITER_LEASE: Duration = Duration::from_millis(30);

/// The longest waiter lease accepted: a dead head stalls the line this long.
const MAX_WAITER_LEASE: Duration = Duration::from_secs(60);

/// Checks a waiter lease (a backend option, `waiter_lease_ms` in URLs):
/// whole milliseconds from 30 ms to 60 s. An error names `option`, the
/// name the caller's user knows the setting by.
pub fn waiter_lease(option: &'static str, lease: Duration) -> Result<Duration> {
    if lease < MIN_WAITER_LEASE || lease > MAX_WAITER_LEASE {
        return Err(Error::invalid(
            option,
            format!(
                "`{option}` is {lease:?}; the waiter lease must be from {MIN_WAITER_LEASE:?} to {MAX_WAITER_LEASE:?} \
                 (a dead waiter at the head of the line stalls the others for about this long)"
            ),
        ));
    }
    if !lease.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::invalid(
            option,
            format!("`{option}` is {lease:?}; the waiter lease must be whole milliseconds"),
        ));
    }
    Ok(lease)
}

/// One wait's place in the line of a key, on backends whose waiting order
/// is FIFO ([`WaitingOrder`](crate::WaitingOrder)). It stays the same
/// across the wait's attempts, whose owner tokens change. Not a secret:
/// it names a place in line, not a grant, and backends publish it to wake
/// its waiter.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Place {
    id: String,
    arrived_us: u64,
}

impl Place {
    /// A place of its own for a new wait: 128 random bits, in hex, and the
    /// wall-clock time it was taken.
    pub fn new() -> Self {
        let arrived_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64);
        Place {
            id: crate::OwnerToken::random().to_hex(),
            arrived_us,
        }
    }

    /// The place's id, as backends store it (32 hex digits).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// When the wait took its place, in microseconds since the Unix epoch
    /// on this client's clock: the same for all of the wait's attempts. A
    /// backend over independent servers (Redlock) orders its waiters by it,
    /// so that every server puts the same waiters in the same order.
    pub fn arrived_us(&self) -> u64 {
        self.arrived_us
    }
}

impl Default for Place {
    fn default() -> Self {
        Place::new()
    }
}

impl fmt::Debug for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Place({})", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiter_leases_out_of_range_or_fractional_are_refused_naming_the_field() {
        for bad in [
            Duration::ZERO,
            Duration::from_millis(5),
            Duration::from_secs(3600),
            Duration::from_micros(100_500),
        ] {
            let err = waiter_lease("waiter_lease_ms", bad).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidInput { field: "waiter_lease_ms", problem } if problem.contains("`waiter_lease_ms`")),
                "{err}"
            );
        }
        assert_eq!(
            waiter_lease("waiter_lease_ms", DEFAULT_WAITER_LEASE).unwrap(),
            DEFAULT_WAITER_LEASE
        );
    }

    #[test]
    fn places_are_distinct() {
        assert_ne!(Place::new(), Place::new());
        assert_eq!(Place::new().id().len(), 32);
    }
}

//! One clock for every process of a run: `CLOCK_MONOTONIC`, which on Linux
//! is system-wide, read as raw nanoseconds.

use nix::time::{ClockId, clock_gettime};
use tokio::time::Instant;

/// Nanoseconds on `CLOCK_MONOTONIC`: comparable across the processes of
/// one machine.
pub fn now_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always readable");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// An `Instant` of this process (a lease deadline) on the shared clock.
/// `Instant` is `CLOCK_MONOTONIC` too, but opaque; both clocks are read
/// back to back and the offset applied (error well under a microsecond).
pub fn instant_ns(at: Instant) -> u64 {
    let (now, ns) = (Instant::now(), now_ns());
    if at >= now {
        ns + (at - now).as_nanos() as u64
    } else {
        ns.saturating_sub((now - at).as_nanos() as u64)
    }
}

/// Milliseconds between two instants of the shared clock, as a float.
pub fn ms(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

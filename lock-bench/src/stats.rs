//! Latency samples and their percentiles.

use serde::Serialize;

/// Percentiles of a set of latency samples, in microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Number of samples.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// The quantiles plotted as a latency distribution.
pub const CURVE: &[f64] = &[
    0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0,
];

impl Latency {
    /// Percentiles of `nanos` (sorted in place).
    pub fn of(nanos: &mut [u64]) -> (Latency, Vec<f64>) {
        nanos.sort_unstable();
        let q = |q: f64| quantile(nanos, q);
        let latency = Latency {
            samples: nanos.len(),
            p50_us: q(0.50),
            p90_us: q(0.90),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: q(1.0),
        };
        (latency, CURVE.iter().map(|&c| q(c)).collect())
    }
}

/// Nearest-rank quantile of sorted nanosecond samples, in microseconds.
/// A duration in whole nanoseconds, the unit latencies are recorded in.
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

pub(crate) fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<u64> = (1..=1000).rev().map(|i| i * 1000).collect();
        let (l, curve) = Latency::of(&mut v);
        assert_eq!(l.samples, 1000);
        assert_eq!(l.p50_us, 500.0);
        assert_eq!(l.p99_us, 990.0);
        assert_eq!(l.p999_us, 999.0);
        assert_eq!(l.max_us, 1000.0);
        assert_eq!(curve.first(), Some(&1.0));
        assert_eq!(Latency::of(&mut []).0.p50_us, 0.0);
    }
}

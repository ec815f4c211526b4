//! Latency samples and their percentiles.

use hdrhistogram::Histogram;
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

/// Significant figures the histogram keeps: each percentile is within
/// 0.1 % of the sample at its rank.
const SIGNIFICANT_FIGURES: u8 = 3;

impl Latency {
    /// Percentiles of samples in nanoseconds, read from an HDR histogram
    /// (3 significant figures), and the distribution at the quantiles of `CURVE`.
    pub fn of(nanos: &[u64]) -> (Latency, Vec<f64>) {
        let histogram = histogram(nanos);
        let q = |q: f64| quantile_us(&histogram, q);
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

/// A duration in whole nanoseconds, the unit latencies are recorded in.
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// The samples, in nanoseconds, in a histogram that grows to fit them.
pub(crate) fn histogram(nanos: &[u64]) -> Histogram<u64> {
    let mut histogram = Histogram::new(SIGNIFICANT_FIGURES)
        .expect("3 significant figures is within the histogram's range");
    for &sample in nanos {
        // Grows to fit; a sample beyond what it can grow to counts as its largest.
        if histogram.record(sample).is_err() {
            histogram.saturating_record(sample);
        }
    }
    histogram
}

/// The quantile `q` (0 to 1) of a histogram of nanoseconds, in
/// microseconds; 0 when it is empty.
pub(crate) fn quantile_us(histogram: &Histogram<u64>, q: f64) -> f64 {
    if histogram.is_empty() {
        return 0.0;
    }
    histogram.value_at_quantile(q) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample at nearest rank, in microseconds, from sorted samples.
    fn nearest_rank(sorted: &[u64], q: f64) -> f64 {
        let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1] as f64 / 1000.0
    }

    #[test]
    fn percentiles_are_the_nearest_rank_samples_within_a_tenth_of_a_percent() {
        // From 1 µs to about 1 s, spread over six decades, in no order.
        let mut samples: Vec<u64> = (0..10_000u64)
            .map(|i| 1_000 + (i * 7_919 % 10_000).pow(3))
            .collect();
        let (latency, curve) = Latency::of(&samples);
        samples.sort_unstable();
        assert_eq!(latency.samples, 10_000);
        let close = |got: f64, q: f64| {
            let want = nearest_rank(&samples, q);
            assert!(
                (got - want).abs() <= want * 0.001,
                "quantile {q}: {got} µs, the sample at its rank is {want} µs"
            );
        };
        close(latency.p50_us, 0.5);
        close(latency.p90_us, 0.9);
        close(latency.p99_us, 0.99);
        close(latency.p999_us, 0.999);
        close(latency.max_us, 1.0);
        for (&got, &q) in curve.iter().zip(CURVE) {
            close(got, q);
        }
    }

    #[test]
    fn no_samples_read_zero() {
        let (l, curve) = Latency::of(&[]);
        assert_eq!((l.samples, l.p50_us, l.max_us), (0, 0.0, 0.0));
        assert!(curve.iter().all(|&c| c == 0.0));
    }
}

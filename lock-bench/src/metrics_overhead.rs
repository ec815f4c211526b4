//! What recording lock-core's metrics costs: uncontended pairs per second
//! at 64 tasks through a `Locker` whose metrics go to the Prometheus
//! recorder, against one with no recorder, over the same backend (the same
//! connections), in paired rounds.
//!
//! The recorder is local to the measured locker (a locker takes its handles
//! from the recorder in place when it is made), so both run in this one
//! process, in turns. A task renders the recorder every second, as a
//! scrape would, which also drains its histograms' samples.

use crate::Paired;
use crate::report::Goal;

/// The backends measured, and the least ratio each is held to.
const GOALS: &[(&str, f64)] = &[("redis", 0.97), ("memory", 0.85)];

/// Concurrent tasks in every round.
const TASKS: usize = 64;

/// The fewest rounds: the figures compared are a few percent apart, which
/// the median of three rounds on a busy host cannot tell.
const MIN_ROUNDS: usize = 7;

/// The report's names of the two sides over `backend`.
fn sides(backend: &str) -> (String, String) {
    (
        format!("{backend}, Prometheus recorder"),
        format!("{backend}, no recorder"),
    )
}

/// How many comparisons run when only the subjects `wanted` says yes to do.
pub fn planned(wanted: &impl Fn(&str) -> bool) -> usize {
    if cfg!(feature = "metrics") {
        GOALS.iter().filter(|(b, _)| wanted(b)).count()
    } else {
        0
    }
}

/// The goals: with the recorder, at least the least ratio of the pairs per
/// second without, at the median of the paired rounds.
pub fn goals(paired: &[Paired]) -> Vec<Goal> {
    GOALS
        .iter()
        .filter_map(|&(backend, least)| {
            let (subject, against) = sides(backend);
            let p = paired
                .iter()
                .find(|p| p.subject == subject && p.against == against)?;
            let cpu = p.client_us_per_pair.map_or(String::new(), |(a, b)| {
                format!("; lab process CPU per pair {a:.1} µs with, {b:.1} µs without")
            });
            Some(Goal {
                goal: format!(
                    "Metrics: {backend} pairs/s with a Prometheus recorder >= {least}x without ({TASKS} tasks)"
                ),
                measured: format!("{}{cpu}", crate::report::paired_outcome(p)),
                met: p.median().map(|m| m >= least),
            })
        })
        .collect()
}

/// Runs the comparison for every wanted backend.
#[cfg(feature = "metrics")]
pub async fn all(
    wanted: &impl Fn(&str) -> bool,
    rounds: usize,
    phase: std::time::Duration,
    progress: &std::sync::Arc<crate::progress::Progress>,
    prefix: &str,
) -> Vec<Paired> {
    let mut out = Vec::new();
    for &(backend, _) in GOALS.iter().filter(|(b, _)| wanted(b)) {
        let (subject, against) = sides(backend);
        let _step = progress.step(format!(
            "paired rounds: {subject} and {against}, {TASKS} tasks"
        ));
        let prefix = format!("{prefix}/metrics-{backend}");
        out.push(
            compare(backend, rounds.max(MIN_ROUNDS), phase, &prefix)
                .await
                .unwrap_or_else(|e| {
                    let mut failed =
                        Paired::new(&subject, &against, TASKS, crate::Metric::PairsPerSecond);
                    failed.errors.push(e);
                    failed
                }),
        );
    }
    out
}

#[cfg(not(feature = "metrics"))]
pub async fn all(
    _: &impl Fn(&str) -> bool,
    _: usize,
    _: std::time::Duration,
    _: &std::sync::Arc<crate::progress::Progress>,
    _: &str,
) -> Vec<Paired> {
    Vec::new()
}

/// One backend: the same backend under two lockers, one recorded.
#[cfg(feature = "metrics")]
async fn compare(
    backend: &str,
    rounds: usize,
    phase: std::time::Duration,
    prefix: &str,
) -> Result<Paired, String> {
    use lockkit::Locker;
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

    use crate::subject::Client;

    // As the example serves them: buckets, so that quantiles can be taken.
    const BUCKETS: [f64; 14] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let url = match backend {
        "memory" => "memory://".to_owned(),
        _ => std::env::var("LOCKKIT_REDIS_URL").map_err(|_| "LOCKKIT_REDIS_URL is not set")?,
    };
    let (locker, ..) = crate::connect(backend, &url).await?;
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .map_err(|e| e.to_string())?
        .build_recorder();
    let recorded =
        metrics::with_local_recorder(&recorder, || Locker::from_arc(locker.backend().clone()));
    let plain = Locker::from_arc(locker.backend().clone());
    let handle = recorder.handle();
    let scrapes = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            every.tick().await;
            std::hint::black_box(handle.render());
        }
    });
    let servers = match backend {
        "redis" => crate::counters::redis_nodes(&url).await.ok(),
        _ => None,
    };
    let (subject, against) = sides(backend);
    let (recorded, plain) = (Client::Lockkit(recorded), Client::Lockkit(plain));
    let mut paired = crate::paired::run(
        ((&subject, &recorded), (&against, &plain)),
        TASKS,
        crate::Metric::PairsPerSecond,
        rounds,
        phase,
        servers,
        prefix,
    )
    .await;
    scrapes.abort();
    paired.client_workers = tokio::runtime::Handle::current().metrics().num_workers();
    Ok(paired)
}

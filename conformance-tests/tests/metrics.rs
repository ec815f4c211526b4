//! Every metric of lock-core moves as it should, on the memory backend and
//! on the shared Redis: a debugging recorder is in place when the lockers
//! are made, so their series land in it whatever thread records them.
//!
//! The recorder is local to each test (tests in this binary run side by
//! side), and its snapshots reset what they read, so [`Readings`] adds
//! them up.

use lock_core::Wait;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, GuardOptions, KeyLabel, Locker, LockerOptions, LostReason, MemoryBackend};
use lock_testkit::{Net, Proxy};
use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const WAIT: &str = "lockkit_acquire_wait_seconds";
const HELD: &str = "lockkit_held_seconds";
const ACQUISITIONS: &str = "lockkit_acquisitions_total";
const RENEWAL_FAILURES: &str = "lockkit_renewal_failures_total";
const LOST: &str = "lockkit_locks_lost_total";
const GIVE_BACKS: &str = "lockkit_give_backs_total";
const RELEASES_NOT_HELD: &str = "lockkit_releases_not_held_total";
const LOCKS_HELD: &str = "lockkit_locks_held";

/// Everything recorded so far, by series (`name{label=value,...}`, labels
/// sorted): counters and gauges summed, histograms' samples gathered.
struct Readings {
    snapshotter: Snapshotter,
    values: BTreeMap<String, f64>,
    samples: BTreeMap<String, Vec<f64>>,
    units: BTreeMap<String, Option<Unit>>,
}

impl Readings {
    fn new(recorder: &DebuggingRecorder) -> Self {
        Readings {
            snapshotter: recorder.snapshotter(),
            values: BTreeMap::new(),
            samples: BTreeMap::new(),
            units: BTreeMap::new(),
        }
    }

    /// Adds what was recorded since the last read.
    fn read(&mut self) -> &mut Self {
        for (key, unit, _, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let series = format!("{}{{{}}}", key.name(), labels.join(","));
            self.units.insert(key.name().to_owned(), unit);
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *self.values.entry(series).or_default() += n as f64
                }
                (MetricKind::Gauge, DebugValue::Gauge(g)) => {
                    *self.values.entry(series).or_default() += g.into_inner()
                }
                (MetricKind::Histogram, DebugValue::Histogram(h)) => self
                    .samples
                    .entry(series)
                    .or_default()
                    .extend(h.into_iter().map(|v| v.into_inner())),
                (kind, value) => panic!("{series}: a {kind:?} with {value:?}"),
            }
        }
        self
    }

    fn series(name: &str, labels: &[(&str, &str)]) -> String {
        let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        format!("{name}{{{}}}", labels.join(","))
    }

    /// A counter's or a gauge's value (zero when never recorded).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.values
            .get(&Self::series(name, labels))
            .copied()
            .unwrap_or(0.0)
    }

    /// A histogram's samples.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.samples
            .get(&Self::series(name, labels))
            .map_or(&[], Vec::as_slice)
    }

    /// Every series recorded so far, with its value or its sample count.
    fn all(&self) -> String {
        let values = self.values.iter().map(|(s, v)| format!("{s} = {v}"));
        let samples = self
            .samples
            .iter()
            .map(|(s, v)| format!("{s} = {} samples", v.len()));
        values.chain(samples).collect::<Vec<_>>().join("\n")
    }
}

/// Polls `attempt` once, so that its request is on its way, and drops it.
async fn start_and_drop<T>(attempt: impl Future<Output = T>) {
    let mut attempt = std::pin::pin!(attempt);
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(attempt.as_mut().poll(cx))).await;
    assert!(
        polled.is_pending(),
        "the attempt was answered at its first poll"
    );
}

/// The walk every backend takes: granted, contended, timed out, released,
/// released after it was gone, lost under a guard, dropped.
async fn acquire_contend_time_out_and_lose(
    readings: &mut Readings,
    locker: &Locker,
    other: &Locker,
    ttl: Duration,
) {
    let b = locker.capabilities().backend;
    let key = unique_key(&format!("metrics-{b}"));
    let of = |outcome| [("backend", b), ("outcome", outcome)];

    let lease = locker.try_acquire(&key, ttl).await.expect("granted");
    let r = readings.read();
    assert_eq!(r.value(ACQUISITIONS, &of("granted")), 1.0, "{}", r.all());
    assert_eq!(r.samples(WAIT, &of("granted")).len(), 1, "{}", r.all());
    assert_eq!(r.value(LOCKS_HELD, &[("backend", b)]), 1.0, "{}", r.all());

    let busy = other.try_acquire(&key, ttl).await.expect_err("held");
    assert!(busy.is_contended(), "{busy}");
    let r = readings.read();
    assert_eq!(r.value(ACQUISITIONS, &of("contended")), 1.0, "{}", r.all());
    assert_eq!(r.samples(WAIT, &of("contended")).len(), 1, "{}", r.all());

    let wait = Duration::from_millis(200);
    let gave_up = other
        .acquire(&key, ttl, Wait::at_most(wait))
        .await
        .expect_err("held");
    assert!(gave_up.is_timed_out(), "{gave_up}");
    let r = readings.read();
    assert_eq!(r.value(ACQUISITIONS, &of("timed_out")), 1.0, "{}", r.all());
    let waited = r.samples(WAIT, &of("timed_out"));
    assert!(
        waited.len() == 1 && waited[0] >= wait.as_secs_f64(),
        "the timed-out wait is recorded as at least {wait:?}: {waited:?}"
    );

    locker.release(lease).await.expect("release");
    let r = readings.read();
    assert_eq!(r.samples(HELD, &[("backend", b)]).len(), 1, "{}", r.all());
    assert_eq!(r.value(LOCKS_HELD, &[("backend", b)]), 0.0, "{}", r.all());

    // Released after an operator removed it: counted apart, held time unknown.
    let gone = format!("{key}-gone");
    let lease = locker.try_acquire(&gone, ttl).await.expect("granted");
    assert!(other.force_release(&gone).await.expect("force release"));
    let refused = locker.release(lease).await.expect_err("not held");
    assert!(refused.is_lost(), "{refused}");
    let r = readings.read();
    assert_eq!(
        r.value(RELEASES_NOT_HELD, &[("backend", b)]),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.samples(HELD, &[("backend", b)]).len(), 1, "{}", r.all());
    assert_eq!(r.value(LOCKS_HELD, &[("backend", b)]), 0.0, "{}", r.all());

    // A guard whose grant goes behind its back.
    let guarded = format!("{key}-guard");
    let guard = locker
        .guard(&guarded, GuardOptions::new(ttl).renew_every(ttl / 6))
        .await
        .expect("guard");
    assert_eq!(readings.read().value(LOCKS_HELD, &[("backend", b)]), 1.0);
    let lost = guard.lost();
    assert!(other.force_release(&guarded).await.expect("force release"));
    let reason = tokio::time::timeout(Duration::from_secs(30), lost)
        .await
        .expect("the guard notices within 30 s");
    assert_eq!(reason, LostReason::NotHeld);
    let r = readings.read();
    let lost_as = |reason| [("backend", b), ("reason", reason)];
    assert_eq!(r.value(LOST, &lost_as("not_held")), 1.0, "{}", r.all());
    assert_eq!(r.value(LOCKS_HELD, &[("backend", b)]), 0.0, "{}", r.all());
    drop(guard);

    // A lease dropped unreleased is no longer held by this process's account.
    let dropped = format!("{key}-dropped");
    drop(locker.try_acquire(&dropped, ttl).await.expect("granted"));
    assert_eq!(readings.read().value(LOCKS_HELD, &[("backend", b)]), 0.0);
    other.force_release(&dropped).await.expect("force release");
}

/// Every series is named `lockkit_*`, carries its backend and no key, and
/// the histograms are in seconds.
fn check_names_and_labels(readings: &Readings, backend: &str) {
    let series = readings.values.keys().chain(readings.samples.keys());
    for s in series {
        assert!(s.starts_with("lockkit_"), "{s}");
        assert!(s.contains(&format!("backend={backend}")), "{s}");
        assert!(!s.contains("key="), "a key label without opting in: {s}");
    }
    for name in [WAIT, HELD] {
        assert_eq!(
            readings.units.get(name),
            Some(&Some(Unit::Seconds)),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_moves_on_the_memory_backend() {
    let recorder = DebuggingRecorder::new();
    let mut readings = Readings::new(&recorder);
    let memory = MemoryBackend::new();
    let (locker, other) = metrics::with_local_recorder(&recorder, || {
        (Locker::new(memory.clone()), Locker::new(memory.clone()))
    });
    let ttl = Duration::from_secs(3);
    acquire_contend_time_out_and_lose(&mut readings, &locker, &other, ttl).await;
    let b = [("backend", "memory")];
    let with = |name, value| [("backend", "memory"), (name, value)];

    // A grant whose reply comes after its validity is given back.
    let key = unique_key("metrics-memory-late");
    let short = Duration::from_millis(100);
    memory.delay_next_grants(1, short * 2);
    let late = locker.try_acquire(&key, short).await.expect_err("too late");
    assert!(
        matches!(
            late,
            Error::Lost {
                reason: LostReason::ReplyTooLate,
                ..
            }
        ),
        "{late}"
    );
    let r = readings.read();
    assert_eq!(
        r.value(GIVE_BACKS, &with("cause", "late")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(
        r.value(ACQUISITIONS, &with("outcome", "error")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.value(LOCKS_HELD, &b), 0.0, "{}", r.all());

    // An attempt dropped while its reply is on its way.
    memory.delay_next_grants(1, Duration::from_secs(3600));
    start_and_drop(locker.try_acquire(&format!("{key}-dropped"), ttl)).await;
    let r = readings.read();
    assert_eq!(
        r.value(GIVE_BACKS, &with("cause", "dropped")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.value(LOCKS_HELD, &b), 0.0, "{}", r.all());

    // The loss signal: the holder's connection is gone.
    let cut = format!("{key}-connection");
    let guard = locker
        .guard(&cut, GuardOptions::new(ttl))
        .await
        .expect("guard");
    assert!(memory.drop_holder(&cut));
    assert_eq!(guard.lost().await, LostReason::ConnectionLost);
    let r = readings.read();
    assert_eq!(
        r.value(LOST, &with("reason", "connection_lost")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.value(LOCKS_HELD, &b), 0.0, "{}", r.all());

    // Renewals that fail are retried until the deadline passes.
    memory.fail_next_renewals(u32::MAX);
    let guard = locker
        .guard(
            &format!("{key}-renewals"),
            GuardOptions::new(Duration::from_millis(600)).renew_every(Duration::from_millis(100)),
        )
        .await
        .expect("guard");
    assert_eq!(guard.lost().await, LostReason::DeadlinePassed);
    memory.fail_next_renewals(0);
    let r = readings.read();
    assert!(r.value(RENEWAL_FAILURES, &b) >= 1.0, "{}", r.all());
    assert_eq!(
        r.value(LOST, &with("reason", "deadline_passed")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.value(LOCKS_HELD, &b), 0.0, "{}", r.all());
    drop(guard);

    check_names_and_labels(&readings, "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_moves_on_redis() {
    let Some(url) = server_url("LOCKKIT_REDIS_URL") else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let mut readings = Readings::new(&recorder);
    let recorder = &recorder;
    let connect = |url: String| async move {
        let backend = lock_redis::RedisBackend::connect(&url)
            .await
            .expect("connect");
        metrics::with_local_recorder(recorder, || Locker::new(backend))
    };
    let (locker, other) = (connect(url.clone()).await, connect(url.clone()).await);
    acquire_contend_time_out_and_lose(&mut readings, &locker, &other, Duration::from_secs(3)).await;
    let b = [("backend", "redis")];
    let with = |name, value| [("backend", "redis"), (name, value)];

    // An attempt dropped while its request is on its way.
    let key = unique_key("metrics-redis-dropped");
    start_and_drop(locker.try_acquire(&key, Duration::from_secs(3))).await;
    let r = readings.read();
    assert_eq!(
        r.value(GIVE_BACKS, &with("cause", "dropped")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.value(LOCKS_HELD, &b), 0.0, "{}", r.all());

    // Renewals through a proxy that stops passing anything: they fail, are
    // retried, and the deadline passes.
    let port = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("a port in LOCKKIT_REDIS_URL");
    let proxy = Proxy::start(port).await.expect("proxy");
    let cut_off = connect(format!("redis://127.0.0.1:{}?timeout_ms=200", proxy.port())).await;
    let key = unique_key("metrics-redis-renewals");
    let guard = cut_off
        .guard(
            &key,
            GuardOptions::new(Duration::from_secs(2)).renew_every(Duration::from_millis(300)),
        )
        .await
        .expect("guard");
    proxy.set(Net {
        delay: Duration::ZERO,
        blackhole: true,
    });
    let reason = tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("the guard gives up within 30 s");
    assert_eq!(reason, LostReason::DeadlinePassed);
    let r = readings.read();
    assert!(r.value(RENEWAL_FAILURES, &b) >= 1.0, "{}", r.all());
    assert_eq!(
        r.value(LOST, &with("reason", "deadline_passed")),
        1.0,
        "{}",
        r.all()
    );
    assert_eq!(r.value(LOCKS_HELD, &b), 0.0, "{}", r.all());
    drop(guard);
    other.force_release(&key).await.expect("force release");

    check_names_and_labels(&readings, "redis");
}

/// With the key label on, series carry the key or its prefix; this test
/// runs on one thread, whose local recorder then sees every series.
#[tokio::test(flavor = "current_thread")]
async fn the_key_label_is_there_only_when_asked_for() {
    let recorder = Arc::new(DebuggingRecorder::new());
    let _local = metrics::set_default_local_recorder(&*recorder);
    let mut readings = Readings::new(&recorder);
    let memory = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let labelled = |key_label| {
        Locker::new(memory.clone()).with_options(LockerOptions::default().key_label(key_label))
    };
    let prefix = unique_key("tenant");
    let key = format!("{prefix}/invoice/42");
    for (locker, label) in [
        (labelled(KeyLabel::Key), key.as_str()),
        (labelled(KeyLabel::Prefix('/')), prefix.as_str()),
    ] {
        let lease = locker.try_acquire(&key, ttl).await.expect("granted");
        locker.release(lease).await.expect("release");
        let r = readings.read();
        let keyed = [
            ("backend", "memory"),
            ("key", label),
            ("outcome", "granted"),
        ];
        assert_eq!(r.value(ACQUISITIONS, &keyed), 1.0, "{}", r.all());
        let held = [("backend", "memory"), ("key", label)];
        assert_eq!(r.samples(HELD, &held).len(), 1, "{}", r.all());
        assert_eq!(r.value(LOCKS_HELD, &held), 0.0, "{}", r.all());
    }
    let lease = labelled(KeyLabel::Off)
        .try_acquire(&key, ttl)
        .await
        .expect("granted");
    drop(lease);
    let r = readings.read();
    let plain = [("backend", "memory"), ("outcome", "granted")];
    assert_eq!(r.value(ACQUISITIONS, &plain), 1.0, "{}", r.all());
}

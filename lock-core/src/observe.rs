//! What a [`Locker`](crate::Locker) tells the outside about its locks, for
//! every backend at once: `tracing` events and, with the `metrics` feature,
//! metrics through the `metrics` facade.
//!
//! Events (target `lock_core::observe`): `lock acquired` (INFO: key,
//! backend, fencing token, time waited), `lock released` (INFO: time held),
//! `lock lost` (INFO: reason), and `renewal failed; retrying until the
//! deadline` (WARN: key, error). None carries an owner token.

use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Lease, LostReason, Result};

/// Whether metrics carry the lock's key as a label (the `key` label).
///
/// Off by default. Every distinct value of a label makes series of its own
/// in the metrics system, and keys are as many as the application makes
/// (one per invoice, per user, per job): a key label can grow a
/// Prometheus server's memory and its queries without bound. Turn it on
/// only for a bounded set of keys, or group keys by a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyLabel {
    /// No key label: series by backend only.
    #[default]
    Off,
    /// The whole key.
    Key,
    /// The key up to, not including, its first `separator` (the whole key
    /// when it has none): `Prefix('/')` labels `invoice/42` as `invoice`.
    Prefix(char),
}

impl KeyLabel {
    /// The label's value for `key`, if there is to be one.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn value(self, key: &str) -> Option<&str> {
        match self {
            KeyLabel::Off => None,
            KeyLabel::Key => Some(key),
            KeyLabel::Prefix(separator) => key.split(separator).next(),
        }
    }
}

/// How an acquire ended: its `outcome` label.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Granted,
    Contended,
    TimedOut,
    Error,
}

impl Outcome {
    fn of<T>(result: &Result<T>) -> Outcome {
        match result {
            Ok(_) => Outcome::Granted,
            Err(Error::Contended { .. }) => Outcome::Contended,
            Err(Error::TimedOut { .. }) => Outcome::TimedOut,
            Err(_) => Outcome::Error,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Contended => "contended",
            Outcome::TimedOut => "timed_out",
            Outcome::Error => "error",
        }
    }
}

/// Why a grant was given back unused: its `cause` label.
#[derive(Debug, Clone, Copy)]
pub(crate) enum GiveBackCause {
    /// Its reply came after its validity ran out.
    Late,
    /// The acquire was dropped before its answer.
    Dropped,
}

impl GiveBackCause {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            GiveBackCause::Late => "late",
            GiveBackCause::Dropped => "dropped",
        }
    }
}

/// A loss's `reason`, as a label and an event field.
fn reason_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::NotHeld => "not_held",
        LostReason::DeadlinePassed => "deadline_passed",
        LostReason::ConnectionLost => "connection_lost",
        LostReason::Released => "released",
        LostReason::ReplyTooLate => "reply_too_late",
    }
}

/// A lease's standing in this process's account: held from its grant until
/// it is released, known lost, or dropped (a dropped lease can no longer be
/// used, though its grant stays on the server until its TTL).
pub(crate) struct Held {
    /// When the grant was won; unknown for a lease rebuilt from its parts.
    since: Option<Instant>,
    /// Still counted as held.
    holding: bool,
    /// The `lockkit_locks_held` gauge it was counted in, if it was.
    #[cfg(feature = "metrics")]
    gauge: Option<::metrics::Gauge>,
}

impl Held {
    /// A lease granted now, not yet counted in the gauge.
    pub(crate) fn granted() -> Held {
        Held::since(Some(Instant::now()))
    }

    /// A lease rebuilt from its parts: held since an unknown time.
    pub(crate) fn rebuilt() -> Held {
        Held::since(None)
    }

    fn since(since: Option<Instant>) -> Held {
        Held {
            since,
            holding: true,
            #[cfg(feature = "metrics")]
            gauge: None,
        }
    }

    /// Ends the holding; true if it was still held.
    fn end(&mut self) -> bool {
        #[cfg(feature = "metrics")]
        if let Some(gauge) = self.gauge.take() {
            gauge.decrement(1.0);
        }
        std::mem::replace(&mut self.holding, false)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.end();
    }
}

/// Emits the events and metrics of one [`Locker`](crate::Locker).
#[derive(Debug, Clone)]
pub(crate) struct Observer {
    backend: &'static str,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    key_label: KeyLabel,
    #[cfg(feature = "metrics")]
    series: recorded::Series,
}

impl Observer {
    /// An observer for `backend`. Its metric handles come from the recorder
    /// in place now (the thread's local one, or the global one).
    pub(crate) fn new(backend: &'static str) -> Observer {
        Observer {
            backend,
            key_label: KeyLabel::Off,
            #[cfg(feature = "metrics")]
            series: recorded::Series::register(backend),
        }
    }

    /// The same handles, with this key label.
    pub(crate) fn with_key_label(&self, key_label: KeyLabel) -> Observer {
        Observer {
            key_label,
            ..self.clone()
        }
    }

    /// An acquire of `key` ended with `result` after `waited`.
    pub(crate) fn acquired(&self, key: &str, result: &Result<Lease>, waited: Duration) {
        let outcome = Outcome::of(result);
        if let Ok(lease) = result {
            tracing::info!(
                key,
                backend = self.backend,
                fencing_token = lease.fencing_token().get(),
                waited = ?waited,
                "lock acquired"
            );
        }
        #[cfg(feature = "metrics")]
        {
            let (o, i) = (outcome.label(), outcome as usize);
            self.histogram(key, recorded::WAIT, &[("outcome", o)], |s| &s.wait[i])
                .record(waited.as_secs_f64());
            self.counter(key, recorded::ACQUISITIONS, &[("outcome", o)], |s| {
                &s.acquisitions[i]
            })
            .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }

    /// Counts `lease` as held by this process.
    pub(crate) fn hold(&self, lease: &mut Lease) {
        #[cfg(feature = "metrics")]
        {
            let gauge = self
                .gauge(lease.key().as_str(), recorded::LOCKS_HELD, |s| {
                    &s.locks_held
                })
                .clone();
            gauge.increment(1.0);
            lease.held.gauge = Some(gauge);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = lease;
    }

    /// A release of `lease` answered `result`. A lease already known lost
    /// was counted then, so its release is not counted again.
    pub(crate) fn released(&self, lease: &mut Lease, result: &Result<()>) {
        let held_for = lease.held.since.map(|since| since.elapsed());
        if !lease.held.end() {
            return;
        }
        let (key, token) = (lease.key().as_str(), lease.fencing_token().get());
        match result {
            Ok(()) => {
                match held_for {
                    Some(held) => tracing::info!(
                        key,
                        backend = self.backend,
                        fencing_token = token,
                        held = ?held,
                        "lock released"
                    ),
                    None => tracing::info!(
                        key,
                        backend = self.backend,
                        fencing_token = token,
                        "lock released"
                    ),
                }
                #[cfg(feature = "metrics")]
                if let Some(held) = held_for {
                    self.histogram(key, recorded::HELD, &[], |s| &s.held)
                        .record(held.as_secs_f64());
                }
            }
            Err(Error::Lost { reason, .. }) => {
                self.lost_event(key, token, *reason);
                #[cfg(feature = "metrics")]
                self.counter(key, recorded::RELEASES_NOT_HELD, &[], |s| {
                    &s.releases_not_held
                })
                .increment(1);
            }
            Err(_) => {}
        }
    }

    /// `lease` was found lost, while held, for `reason`. Counted once: a
    /// lease already known lost is not counted again.
    pub(crate) fn lost(&self, lease: &mut Lease, reason: LostReason) {
        if !lease.held.end() {
            return;
        }
        let key = lease.key().as_str();
        self.lost_event(key, lease.fencing_token().get(), reason);
        #[cfg(feature = "metrics")]
        {
            let label = reason_label(reason);
            let extra = [("reason", label)];
            match recorded::LOST_REASONS.iter().position(|r| *r == reason) {
                Some(i) => self.counter(key, recorded::LOST, &extra, |s| &s.lost[i]),
                // Not a loss of a held lease (a release, a late reply): never
                // counted today, but registered, not dropped, should it be.
                None => recorded::Handle::Keyed(recorded::register_counter(
                    self.backend,
                    self.key_label.value(key),
                    recorded::LOST,
                    &extra,
                )),
            }
            .increment(1);
        }
    }

    fn lost_event(&self, key: &str, token: u64, reason: LostReason) {
        tracing::info!(
            key,
            backend = self.backend,
            fencing_token = token,
            reason = reason_label(reason),
            "lock lost"
        );
    }

    /// A guard's renewal of `key` failed with `error` and will be retried.
    pub(crate) fn renewal_failed(&self, key: &str, error: &Error) {
        tracing::warn!(key, error = %error, "renewal failed; retrying until the deadline");
        #[cfg(feature = "metrics")]
        self.counter(key, recorded::RENEWAL_FAILURES, &[], |s| {
            &s.renewal_failures
        })
        .increment(1);
    }

    /// A grant on `key`, or what an attempt may have won, is given back.
    pub(crate) fn gave_back(&self, key: &str, cause: GiveBackCause) {
        #[cfg(feature = "metrics")]
        self.counter(
            key,
            recorded::GIVE_BACKS,
            &[("cause", cause.label())],
            |s| &s.give_backs[cause as usize],
        )
        .increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = (key, cause);
    }

    /// Watches an acquire of `key`: dropped before [`Attempt::answered`],
    /// it counts as a dropped attempt whose backend gives back what its
    /// request in flight may have won.
    pub(crate) fn attempt<'a>(&'a self, key: &'a str) -> Attempt<'a> {
        Attempt {
            observer: self,
            key,
            answered: false,
        }
    }
}

/// An acquire in progress; see [`Observer::attempt`].
pub(crate) struct Attempt<'a> {
    observer: &'a Observer,
    key: &'a str,
    answered: bool,
}

impl Attempt<'_> {
    /// The acquire's outcome reached its caller.
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.observer.gave_back(self.key, GiveBackCause::Dropped);
        }
    }
}

/// The metrics, through the `metrics` facade.
#[cfg(feature = "metrics")]
mod recorded {
    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Unit};

    use super::{GiveBackCause, Observer, Outcome};
    use crate::LostReason;

    pub(super) const WAIT: &str = "lockkit_acquire_wait_seconds";
    pub(super) const ACQUISITIONS: &str = "lockkit_acquisitions_total";
    pub(super) const HELD: &str = "lockkit_held_seconds";
    pub(super) const RENEWAL_FAILURES: &str = "lockkit_renewal_failures_total";
    pub(super) const LOST: &str = "lockkit_locks_lost_total";
    pub(super) const GIVE_BACKS: &str = "lockkit_give_backs_total";
    pub(super) const RELEASES_NOT_HELD: &str = "lockkit_releases_not_held_total";
    pub(super) const LOCKS_HELD: &str = "lockkit_locks_held";

    /// The reasons a held lease can be found lost; their series exist from
    /// the start, at zero, so that a rate or an alert over them has data.
    pub(super) const LOST_REASONS: [LostReason; 3] = [
        LostReason::NotHeld,
        LostReason::DeadlinePassed,
        LostReason::ConnectionLost,
    ];
    // In declaration order: the series' arrays are indexed by `as usize`.
    const OUTCOMES: [Outcome; 4] = [
        Outcome::Granted,
        Outcome::Contended,
        Outcome::TimedOut,
        Outcome::Error,
    ];
    const CAUSES: [GiveBackCause; 2] = [GiveBackCause::Late, GiveBackCause::Dropped];

    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// The handles of one backend's series (no key label), registered once
    /// per `Locker`: recording through a handle skips the registry lookup.
    #[derive(Clone)]
    pub(super) struct Series {
        pub(super) wait: [Histogram; 4],
        pub(super) acquisitions: [Counter; 4],
        pub(super) held: Histogram,
        pub(super) renewal_failures: Counter,
        pub(super) lost: [Counter; 3],
        pub(super) give_backs: [Counter; 2],
        pub(super) releases_not_held: Counter,
        pub(super) locks_held: Gauge,
    }

    impl std::fmt::Debug for Series {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Series").finish_non_exhaustive()
        }
    }

    fn labels(
        backend: &'static str,
        key: Option<&str>,
        extra: &[(&'static str, &str)],
    ) -> Vec<Label> {
        let mut labels = vec![Label::from_static_parts("backend", backend)];
        labels.extend(key.map(|k| Label::new("key", k.to_owned())));
        labels.extend(extra.iter().map(|(k, v)| Label::new(*k, v.to_string())));
        labels
    }

    /// A counter of `name` for `backend`, with the key label if any.
    pub(super) fn register_counter(
        backend: &'static str,
        key: Option<&str>,
        name: &'static str,
        extra: &[(&'static str, &str)],
    ) -> Counter {
        counter(name, labels(backend, key, extra))
    }

    fn counter(name: &'static str, labels: Vec<Label>) -> Counter {
        metrics::with_recorder(|r| r.register_counter(&Key::from_parts(name, labels), &METADATA))
    }

    fn gauge(name: &'static str, labels: Vec<Label>) -> Gauge {
        metrics::with_recorder(|r| r.register_gauge(&Key::from_parts(name, labels), &METADATA))
    }

    fn histogram(name: &'static str, labels: Vec<Label>) -> Histogram {
        metrics::with_recorder(|r| r.register_histogram(&Key::from_parts(name, labels), &METADATA))
    }

    fn describe() {
        let name = KeyName::from_const_str;
        metrics::with_recorder(|r| {
            r.describe_histogram(
                name(WAIT),
                Some(Unit::Seconds),
                "Time an acquire took, from its call to its outcome, by outcome (granted, contended, timed_out, error).".into(),
            );
            r.describe_counter(
                name(ACQUISITIONS),
                Some(Unit::Count),
                "Acquires by outcome (granted, contended, timed_out, error).".into(),
            );
            r.describe_histogram(
                name(HELD),
                Some(Unit::Seconds),
                "Time from a grant to its release.".into(),
            );
            r.describe_counter(
                name(RENEWAL_FAILURES),
                Some(Unit::Count),
                "Guard renewals that failed and were retried until the deadline.".into(),
            );
            r.describe_counter(
                name(LOST),
                Some(Unit::Count),
                "Locks found lost while held, by reason.".into(),
            );
            r.describe_counter(
                name(GIVE_BACKS),
                Some(Unit::Count),
                "Grants given back unused: a reply too late (late), an acquire dropped before its answer (dropped).".into(),
            );
            r.describe_counter(
                name(RELEASES_NOT_HELD),
                Some(Unit::Count),
                "Releases that found the lock already gone.".into(),
            );
            r.describe_gauge(
                name(LOCKS_HELD),
                Some(Unit::Count),
                "Locks this process holds now (leases and guards).".into(),
            );
        });
    }

    impl Series {
        pub(super) fn register(backend: &'static str) -> Series {
            describe();
            let with = |extra: &[(&'static str, &str)]| labels(backend, None, extra);
            Series {
                wait: OUTCOMES.map(|o| histogram(WAIT, with(&[("outcome", o.label())]))),
                acquisitions: OUTCOMES
                    .map(|o| counter(ACQUISITIONS, with(&[("outcome", o.label())]))),
                held: histogram(HELD, with(&[])),
                renewal_failures: counter(RENEWAL_FAILURES, with(&[])),
                lost: LOST_REASONS
                    .map(|r| counter(LOST, with(&[("reason", super::reason_label(r))]))),
                give_backs: CAUSES.map(|c| counter(GIVE_BACKS, with(&[("cause", c.label())]))),
                releases_not_held: counter(RELEASES_NOT_HELD, with(&[])),
                locks_held: gauge(LOCKS_HELD, with(&[])),
            }
        }
    }

    /// A handle: the `Locker`'s own, or one registered for a key label.
    pub(super) enum Handle<'a, T> {
        Shared(&'a T),
        Keyed(T),
    }

    impl<T> std::ops::Deref for Handle<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            match self {
                Handle::Shared(h) => h,
                Handle::Keyed(h) => h,
            }
        }
    }

    // Without a key label, the handles registered with the `Locker`; with
    // one, a handle registered now for the key's series.
    impl Observer {
        pub(super) fn counter<'a>(
            &'a self,
            key: &str,
            name: &'static str,
            extra: &[(&'static str, &str)],
            shared: impl FnOnce(&'a Series) -> &'a Counter,
        ) -> Handle<'a, Counter> {
            match self.key_label.value(key) {
                None => Handle::Shared(shared(&self.series)),
                Some(k) => Handle::Keyed(counter(name, labels(self.backend, Some(k), extra))),
            }
        }

        pub(super) fn gauge<'a>(
            &'a self,
            key: &str,
            name: &'static str,
            shared: impl FnOnce(&'a Series) -> &'a Gauge,
        ) -> Handle<'a, Gauge> {
            match self.key_label.value(key) {
                None => Handle::Shared(shared(&self.series)),
                Some(k) => Handle::Keyed(gauge(name, labels(self.backend, Some(k), &[]))),
            }
        }

        pub(super) fn histogram<'a>(
            &'a self,
            key: &str,
            name: &'static str,
            extra: &[(&'static str, &str)],
            shared: impl FnOnce(&'a Series) -> &'a Histogram,
        ) -> Handle<'a, Histogram> {
            match self.key_label.value(key) {
                None => Handle::Shared(shared(&self.series)),
                Some(k) => Handle::Keyed(histogram(name, labels(self.backend, Some(k), extra))),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_arrays_follow_declaration_order() {
            for (i, outcome) in OUTCOMES.into_iter().enumerate() {
                assert_eq!(outcome as usize, i, "{outcome:?}");
            }
            for (i, cause) in CAUSES.into_iter().enumerate() {
                assert_eq!(cause as usize, i, "{cause:?}");
            }
        }
    }
}

//! The lock events: acquired, released and lost at INFO, a failed renewal
//! at WARN, each with its fields and never an owner token; a guard's
//! renewals run inside the span its caller was in.
//!
//! Each test runs on one thread with a subscriber of its own, which then
//! sees what the guard's task emits too.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{GuardOptions, Locker, LostReason, MemoryBackend};
use tokio::sync::watch;
use tracing::field::{Field, Visit};
use tracing::{Event, Instrument, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event: its level, message, fields, and the names of the spans it
/// was in, outermost first.
#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
    spans: Vec<String>,
}

impl Captured {
    fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("no field `{name}` in {self:?}"))
    }
}

/// Keeps every event, and tells waiters when one comes.
#[derive(Clone)]
struct Capture {
    events: Arc<Mutex<Vec<Captured>>>,
    count: watch::Sender<usize>,
}

impl Capture {
    fn new() -> Self {
        Capture {
            events: Arc::default(),
            count: watch::channel(0).0,
        }
    }

    /// Waits for the first event with this message that `matches`.
    async fn first(&self, message: &str, matches: impl Fn(&Captured) -> bool) -> Captured {
        let mut count = self.count.subscribe();
        let found = async {
            loop {
                let seen = self
                    .events
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|e| e.message == message && matches(e))
                    .cloned();
                if let Some(event) = seen {
                    return event;
                }
                count.changed().await.expect("the capture lives");
            }
        };
        tokio::time::timeout(Duration::from_secs(30), found)
            .await
            .unwrap_or_else(|_| panic!("no `{message}` event within 30 s: {:#?}", self.all()))
    }

    fn all(&self) -> Vec<Captured> {
        self.events.lock().unwrap().clone()
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.from_root().map(|s| s.name().to_owned()).collect())
            .unwrap_or_default();
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            message: fields.remove("message").unwrap_or_default(),
            fields,
            spans,
        });
        self.count.send_modify(|n| *n += 1);
    }
}

/// A capture for this thread (and so this test's runtime) alone.
fn capture() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::new();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    (capture, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(flavor = "current_thread")]
async fn acquired_released_and_lost_are_told_with_their_fields() {
    let (capture, _default) = capture();
    let memory = MemoryBackend::new();
    let locker = Locker::new(memory.clone());
    let ttl = Duration::from_secs(10);

    let lease = locker.try_acquire("events/a", ttl).await.expect("granted");
    let owner = lease.owner().to_hex();
    let token = lease.fencing_token().get().to_string();
    let acquired = capture.first("lock acquired", |_| true).await;
    assert_eq!(acquired.level, Level::INFO);
    assert_eq!(acquired.field("key"), "events/a");
    assert_eq!(acquired.field("backend"), "memory");
    assert_eq!(acquired.field("fencing_token"), token);
    assert!(acquired.field("waited").ends_with('s'), "{acquired:?}");

    locker.release(lease).await.expect("release");
    let released = capture.first("lock released", |_| true).await;
    assert_eq!(released.level, Level::INFO);
    assert_eq!(released.field("key"), "events/a");
    assert_eq!(released.field("fencing_token"), token);
    assert!(released.field("held").ends_with('s'), "{released:?}");

    let guard = locker
        .guard("events/b", GuardOptions::new(ttl))
        .await
        .expect("guard");
    let token = guard.fencing_token().get().to_string();
    assert!(memory.expire_now("events/b"));
    assert_eq!(guard.lost().await, LostReason::NotHeld);
    let lost = capture.first("lock lost", |_| true).await;
    assert_eq!(lost.level, Level::INFO);
    assert_eq!(lost.field("key"), "events/b");
    assert_eq!(lost.field("fencing_token"), token);
    assert_eq!(lost.field("reason"), "not_held");

    for event in capture.all() {
        assert!(
            event.fields.values().all(|v| !v.contains(&owner)),
            "an owner token in {event:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_guard_renews_inside_its_callers_span() {
    let (capture, _default) = capture();
    let memory = MemoryBackend::new();
    let locker = Locker::new(memory.clone());
    let options = GuardOptions::new(Duration::from_secs(3)).renew_every(Duration::from_millis(50));
    let request = tracing::info_span!("request");
    let guard = locker
        .guard("events/renewed", options)
        .instrument(request)
        .await
        .expect("guard");

    memory.fail_next_renewals(1);
    let failed = capture
        .first("renewal failed; retrying until the deadline", |_| true)
        .await;
    assert_eq!(failed.level, Level::WARN);
    assert_eq!(failed.field("key"), "events/renewed");
    assert!(failed.field("error").contains("unavailable"), "{failed:?}");
    assert_eq!(
        failed.spans.first().map(String::as_str),
        Some("request"),
        "{failed:?}"
    );

    assert!(memory.expire_now("events/renewed"));
    guard.lost().await;
    let lost = capture.first("lock lost", |_| true).await;
    assert_eq!(
        lost.spans.first().map(String::as_str),
        Some("request"),
        "{lost:?}"
    );
}

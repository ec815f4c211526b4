//! Knowing when a waiter has started to wait: the `DEBUG` event every
//! backend emits then ([`lock_core::WAITING_EVENT_TARGET`], with the lock's
//! key), rather than a sleep that guesses.
//!
//! One subscriber for the whole test process, installed by the first case
//! that asks, routes each event to whoever waits for its key. Not a
//! subscriber per waiter's future: tracing caches, per call site, whether
//! any subscriber wants its events, and a call site first reached by another
//! test's thread while such a subscriber is being made can be cached as
//! wanted by none, so that its events never arrive.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use tokio::sync::watch;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Per key being watched, what to tell once its waiter waits.
fn watched() -> &'static Mutex<HashMap<String, watch::Sender<bool>>> {
    static WATCHED: OnceLock<Mutex<HashMap<String, watch::Sender<bool>>>> = OnceLock::new();
    WATCHED.get_or_init(Mutex::default)
}

/// The process's subscriber: it sees only the waiting events.
struct Signal {
    /// Span ids, unique as the trait asks; spans are otherwise ignored.
    spans: AtomicU64,
}

impl Subscriber for Signal {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == lock_core::WAITING_EVENT_TARGET
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.spans.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut key = KeyField(None);
        event.record(&mut key);
        let watched = watched().lock().expect("the watched keys");
        if let Some(waiting) = key.0.and_then(|k| watched.get(&k)) {
            waiting.send_replace(true);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The event's `key` field.
struct KeyField(Option<String>);

impl Visit for KeyField {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "key" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

/// What turns true once a waiter for `key` has started to wait. Panics if
/// the process has another global subscriber (no conformance binary does).
pub fn waiting_signal(key: &str) -> watch::Receiver<bool> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let signal = Signal {
            spans: AtomicU64::new(0),
        };
        tracing::subscriber::set_global_default(signal)
            .expect("the waiting signal needs the process's global subscriber");
        // A call site that was being registered by another thread just now
        // is asked again.
        tracing::callsite::rebuild_interest_cache();
    });
    let (waiting, started) = watch::channel(false);
    watched()
        .lock()
        .expect("the watched keys")
        .insert(key.to_owned(), waiting);
    started
}

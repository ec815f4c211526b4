//! Knowing when a waiter has started to wait: the `DEBUG` event every
//! backend emits then ([`lock_core::WAITING_EVENT_TARGET`]), caught by a
//! subscriber of the waiter's own future, rather than a sleep that guesses.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Event, Metadata, Subscriber};

/// A subscriber that sees only the waiting event, and says when it came.
struct Signal {
    waiting: watch::Sender<bool>,
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
        if event.metadata().target() == lock_core::WAITING_EVENT_TARGET {
            self.waiting.send_replace(true);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// A dispatcher to run a waiter's future under
/// (`tracing::instrument::WithSubscriber`), and what turns true once that
/// waiter has started to wait.
pub(crate) fn waiting_signal() -> (Dispatch, watch::Receiver<bool>) {
    let (waiting, started) = watch::channel(false);
    let signal = Signal {
        waiting,
        spans: AtomicU64::new(0),
    };
    (Dispatch::new(signal), started)
}

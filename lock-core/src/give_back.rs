//! Giving back a grant that no caller will hold.
//!
//! An acquire's caller may stop waiting at any moment (a `select!` or a
//! time-out around it, an aborted task). The server may then hold a grant
//! that no lease stands for, and the lock would stay taken until that
//! grant's TTL ran out: with a watchdog's TTL tens of seconds, with a long
//! TTL much longer. A backend arms a [`GiveBack`] around the acquire's
//! request, and disarms it once the answer is back; dropped armed, it
//! releases what the request may have been granted, at once.
//!
//! A backend may also give back an acquire that answers with an error (a
//! reply lost or late). Once an attempt has ended, nothing uses its owner
//! token again. A dropped attempt ends its [`Locker`](crate::Locker) call,
//! and a waiting loop asks each retry with a fresh owner
//! ([`poll_until_granted`](crate::wait::poll_until_granted)). So a release
//! naming that owner deletes that grant or nothing, whenever it lands. If it
//! runs before the acquire (the backend orders the two where it can), or if
//! it cannot be sent (the server unreachable, no runtime left), the grant's
//! TTL bounds it.

/// Runs its give-back when dropped, unless [`disarm`](Self::disarm)ed
/// first: the acquire's outcome reached its caller.
#[must_use = "a give-back dropped at once gives back before the acquire is answered"]
pub struct GiveBack<F: FnOnce()> {
    give_back: Option<F>,
}

impl<F: FnOnce()> GiveBack<F> {
    /// Armed: `give_back` queues the release of what the acquire may hold.
    /// It must not block; it runs in `drop`.
    pub fn armed(give_back: F) -> Self {
        GiveBack {
            give_back: Some(give_back),
        }
    }

    /// The acquire's answer is in its caller's hands: a grant is the
    /// caller's to release, and a refusal held nothing.
    pub fn disarm(mut self) {
        self.give_back = None;
    }

    /// Disarms it if the acquire was answered (granted or refused). After an
    /// error the server may still run the acquire, so the give-back runs
    /// when this guard is dropped: safe, as nothing asks with that owner
    /// again.
    pub fn disarm_if_answered<T, E>(self, reply: &std::result::Result<T, E>) {
        if reply.is_ok() {
            self.disarm();
        }
    }
}

impl<F: FnOnce()> Drop for GiveBack<F> {
    fn drop(&mut self) {
        if let Some(give_back) = self.give_back.take() {
            give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn gives_back_when_dropped_armed_and_not_once_disarmed() {
        let given = Cell::new(0);
        drop(GiveBack::armed(|| given.set(given.get() + 1)));
        assert_eq!(given.get(), 1);
        GiveBack::armed(|| given.set(given.get() + 1)).disarm();
        assert_eq!(given.get(), 1);
    }

    #[test]
    fn an_answer_disarms_and_an_error_gives_back() {
        let given = Cell::new(0);
        GiveBack::armed(|| given.set(given.get() + 1)).disarm_if_answered(&Ok::<(), ()>(()));
        assert_eq!(given.get(), 0, "answered: nothing to give back");
        GiveBack::armed(|| given.set(given.get() + 1)).disarm_if_answered(&Err::<(), ()>(()));
        assert_eq!(given.get(), 1, "an error: given back");
    }
}

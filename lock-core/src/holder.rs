//! `Holder`: a holder identity for reentrant holds. Async Rust has no
//! thread to borrow an identity from (a task moves between threads, and one
//! piece of work spans many tasks), so the identity is a value: made by the
//! library or named by the caller, cloned into every task that works for
//! it.
//!
//! Holds are counted here, in the process, once for every backend: the
//! backend sees one grant per key, taken by the first hold and released by
//! the last. So an identity lives in one process. The same name used in two
//! processes is two holders, which exclude each other as any two holders
//! do: a count kept in one process cannot be shared with another without a
//! round trip per hold, and a grant that another process could release
//! would break the "only the holder releases" rule.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::{
    Error, FencingToken, GuardOptions, LockGuard, LockKey, Locker, LostReason, Mode, Result,
};

/// The holders of a locker, by name, so that [`Locker::holder`] called
/// twice with one name gives the same identity.
#[derive(Debug, Default)]
pub(crate) struct Holders(Mutex<HashMap<String, Weak<Identity>>>);

/// A holder identity: a key it holds may be taken again under it, at once;
/// the holds count, and the lock is released when the last is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{GuardOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let options = GuardOptions::new(Duration::from_secs(30));
/// let me = locker.new_holder();
///
/// let outer = me.guard("ledger/7", options).await?;
/// let inner = me.guard("ledger/7", options).await?; // at once: it is ours
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// assert_eq!(me.holds("ledger/7"), 2);
///
/// // Another identity is excluded, as from any lock.
/// assert!(locker.new_holder().guard("ledger/7", options).await.unwrap_err().is_contended());
///
/// inner.release().await?; // still held by `outer`
/// outer.release().await?; // the last hold: released
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Holder {
    locker: Locker,
    identity: Arc<Identity>,
}

#[derive(Debug)]
pub(crate) struct Identity {
    name: String,
    /// The hold on each key, behind an async lock so that two tasks of the
    /// identity asking for a key it does not hold make one grant, not two.
    holds: Mutex<HashMap<String, Arc<KeyHold>>>,
}

/// The identity's current hold on one key, if any; locked while a grant
/// for it is being taken.
type KeyHold = tokio::sync::Mutex<Option<Arc<Hold>>>;

/// One grant, shared by the holds counted on it.
#[derive(Debug)]
struct Hold {
    key: LockKey,
    mode: Mode,
    token: FencingToken,
    state: Mutex<HoldState>,
}

#[derive(Debug)]
struct HoldState {
    count: usize,
    /// `None` once the last hold let go.
    guard: Option<LockGuard>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a few assignments that cannot panic half-way.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Locker {
    /// A holder identity of its own, named at random. It is registered
    /// under no name, so no other handle meets it but its clones.
    pub fn new_holder(&self) -> Holder {
        let draw = || getrandom::u64().unwrap_or_default();
        Holder {
            locker: self.clone(),
            identity: Arc::new(Identity {
                name: format!("holder-{:016x}{:016x}", draw(), draw()),
                holds: Mutex::default(),
            }),
        }
    }

    /// The holder identity named `name` in this locker (and its clones):
    /// called again with the same name while a handle to it lives, it gives
    /// the same identity. Another process's holder of the same name is
    /// another identity (see [`Holder`]).
    pub fn holder(&self, name: &str) -> Holder {
        let mut holders = locked(&self.holders().0);
        holders.retain(|_, identity| identity.strong_count() > 0);
        let identity = holders
            .get(name)
            .and_then(Weak::upgrade)
            .unwrap_or_else(|| {
                let identity = Arc::new(Identity {
                    name: name.to_owned(),
                    holds: Mutex::default(),
                });
                holders.insert(name.to_owned(), Arc::downgrade(&identity));
                identity
            });
        Holder {
            locker: self.clone(),
            identity,
        }
    }
}

impl Holder {
    /// The identity's name.
    pub fn name(&self) -> &str {
        &self.identity.name
    }

    /// How many holds this identity has on `key` now (0 when none).
    pub fn holds(&self, key: &str) -> usize {
        let cell = locked(&self.identity.holds).get(key).cloned();
        cell.and_then(|cell| {
            cell.try_lock()
                .ok()
                .and_then(|hold| hold.as_ref().map(|h| locked(&h.state).count))
        })
        .unwrap_or(0)
    }

    /// Takes `key` exclusively for this identity: at once, counted, when it
    /// holds it already (its lock not lost); otherwise as
    /// [`Locker::guard`] does, waiting up to `options.wait`.
    pub async fn guard(&self, key: &str, options: GuardOptions) -> Result<HeldGuard> {
        self.guard_in(key, Mode::Exclusive, options).await
    }

    /// Takes `key` in `mode` for this identity (one permit of a semaphore,
    /// held again at once by the same identity). Asked in another mode
    /// than it holds the key in, it is refused with [`Error::ModeConflict`].
    pub async fn guard_in(
        &self,
        key: &str,
        mode: Mode,
        options: GuardOptions,
    ) -> Result<HeldGuard> {
        let valid = self.locker.key(key)?;
        let cell = locked(&self.identity.holds)
            .entry(key.to_owned())
            .or_default()
            .clone();
        let mut current = cell.lock().await;
        if let Some(hold) = current.as_ref()
            && hold.take_again(mode)?
        {
            return Ok(HeldGuard::new(self, hold.clone()));
        }
        let guard = match self.locker.guard_in(key, mode, options).await {
            Ok(guard) => guard,
            Err(e) => {
                drop(current);
                drop(cell);
                self.forget_if_idle(key);
                return Err(e);
            }
        };
        let hold = Arc::new(Hold {
            key: valid,
            mode,
            token: guard.fencing_token(),
            state: Mutex::new(HoldState {
                count: 1,
                guard: Some(guard),
            }),
        });
        *current = Some(hold.clone());
        Ok(HeldGuard::new(self, hold))
    }

    /// Runs `work` under a hold of `key` by this identity; see
    /// [`Locker::with_lock`]. Work that takes the key again under the same
    /// identity (a clone of this handle) gets it at once.
    pub async fn with_lock<F, Fut, T>(&self, key: &str, options: GuardOptions, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let held = self.guard(key, options).await?;
        let output = held.run_until_lost(work(held.fencing_token())).await?;
        if let Err(e) = held.release().await {
            tracing::warn!(key, error = %e, "release after with_lock failed");
        }
        Ok(output)
    }

    /// Forgets the key's entry once no hold and no acquire uses it.
    fn forget_if_idle(&self, key: &str) {
        let mut holds = locked(&self.identity.holds);
        let idle = holds.get(key).is_some_and(|cell| {
            Arc::strong_count(cell) == 1
                && cell
                    .try_lock()
                    .is_ok_and(|hold| hold.as_ref().is_none_or(|h| h.is_released()))
        });
        if idle {
            holds.remove(key);
        }
    }
}

impl Hold {
    /// Counts one more hold, if the grant is still held; a key held in
    /// another mode is refused.
    fn take_again(&self, mode: Mode) -> Result<bool> {
        let mut state = locked(&self.state);
        let live = state.count > 0 && state.guard.as_ref().is_some_and(LockGuard::is_held);
        if !live {
            return Ok(false);
        }
        if mode != self.mode {
            return Err(Error::ModeConflict {
                key: self.key.to_string(),
                held: Some(self.mode),
                asked: mode,
            });
        }
        state.count += 1;
        Ok(true)
    }

    /// Counts one hold less; the last one hands back the grant's guard.
    fn let_go(&self) -> Option<LockGuard> {
        let mut state = locked(&self.state);
        state.count = state.count.saturating_sub(1);
        if state.count == 0 {
            state.guard.take()
        } else {
            None
        }
    }

    fn is_released(&self) -> bool {
        locked(&self.state).guard.is_none()
    }

    fn with_guard<T>(&self, read: impl FnOnce(&LockGuard) -> T, released: T) -> T {
        locked(&self.state).guard.as_ref().map_or(released, read)
    }
}

/// One hold of a key by a [`Holder`]. The grant behind it is renewed while
/// any hold lives, and released when the last is released or dropped;
/// every hold's [`lost`](Self::lost) fires when the grant is lost. All
/// holds share the first one's fencing token.
#[derive(Debug)]
pub struct HeldGuard {
    holder: Holder,
    hold: Arc<Hold>,
    let_go: bool,
}

impl HeldGuard {
    fn new(holder: &Holder, hold: Arc<Hold>) -> Self {
        HeldGuard {
            holder: holder.clone(),
            hold,
            let_go: false,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// The grant's fencing token: the first hold's.
    pub fn fencing_token(&self) -> FencingToken {
        self.hold.token
    }

    /// The grant's current deadline (see [`LockGuard::deadline`]).
    pub fn deadline(&self) -> Instant {
        self.hold.with_guard(LockGuard::deadline, Instant::now())
    }

    /// How long the grant is certainly held from now (zero once lost).
    pub fn remaining(&self) -> Duration {
        self.hold.with_guard(LockGuard::remaining, Duration::ZERO)
    }

    /// Whether the grant is held, as far as this process can tell.
    pub fn is_held(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// Why the grant was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.hold
            .with_guard(LockGuard::lost_reason, Some(LostReason::Released))
    }

    /// Completes when the grant is lost (see [`LockGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static + use<> {
        let lost = self.hold.with_guard(|g| Some(g.lost()), None);
        async move {
            match lost {
                Some(lost) => lost.await,
                None => LostReason::Released,
            }
        }
    }

    /// Runs `work` while the grant is held; see [`LockGuard::run_until_lost`].
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output> {
        tokio::select! {
            biased;
            reason = self.lost() => Err(Error::lost(self.hold.key.as_str(), reason)),
            output = work => Ok(output),
        }
    }

    /// Gives up this hold. The last hold of the identity on the key
    /// releases the grant and reports the outcome; an earlier one only
    /// counts down ([`Error::Lost`] if the grant was lost meanwhile).
    pub async fn release(mut self) -> Result<()> {
        self.let_go = true;
        let last = self.hold.let_go();
        let outcome = match last {
            Some(guard) => guard.release().await,
            None => match self.lost_reason() {
                Some(reason) if !self.hold.is_released() => {
                    Err(Error::lost(self.hold.key.as_str(), reason))
                }
                _ => Ok(()),
            },
        };
        self.holder.forget_if_idle(self.hold.key.as_str());
        outcome
    }
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        if self.let_go {
            return;
        }
        // The last hold's guard, dropped, releases in the background.
        drop(self.hold.let_go());
        self.holder.forget_if_idle(self.hold.key.as_str());
    }
}

//! `LockBackend`: the small trait every backend implements.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use crate::raw::{Grant, Place, Waiting};
use crate::{
    Capabilities, Error, HeldLock, Lease, LockKey, LockReport, LostReason, Mode, OwnerToken, Result,
};

/// A future that completes when a lock may have been released.
pub type WakeUpFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A future that completes once a place's leaving the line reached the
/// backend (or could not); see [`LockBackend::leave_queue`].
pub type LeaveFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A future that completes when the backend learns that a lease is gone.
pub type LossFuture = Pin<Box<dyn Future<Output = LostReason> + Send + 'static>>;

/// The trait object users hold: `Arc<DynBackend>`, usually inside a
/// [`Locker`](crate::Locker).
pub type DynBackend = dyn LockBackend;

/// What differs between backends, and nothing else.
///
/// Everything built from these primitives (validation, deadlines, waiting,
/// renewal, guards, tracing) lives once in [`Locker`](crate::Locker).
/// Implementations receive validated keys and TTLs, and freshly generated
/// owner tokens. They must be cancellation-safe in the contract's sense: a
/// dropped future may leave a grant behind, but never for longer than its
/// TTL, and gives it back at once where the server can be reached (the
/// conformance suite drops attempts on their way, on every bundled
/// backend, and checks that the key is free long before their TTL);
/// [`GiveBack`](crate::raw::GiveBack) is the guard for that.
#[async_trait]
pub trait LockBackend: Send + Sync + Debug + 'static {
    /// What this backend promises. Must not change over its lifetime.
    fn capabilities(&self) -> &Capabilities;

    /// One attempt to grant `key` to `owner` for `ttl`. On contention returns
    /// [`Error::Contended`](crate::Error::Contended), with the holder's
    /// remaining TTL when known; never waits for the holder.
    ///
    /// An attempt that fails, or is dropped, may give back what it left on
    /// the server, after the fact. So a caller that retries should ask with
    /// a fresh owner, as the default wait does. Under the same owner, a
    /// give-back that a reconnect delays could end the retry's grant.
    ///
    /// A grant `owner` already has may be granted anew, for `ttl` and with a
    /// fresh, higher token. That is an earlier attempt that succeeded though
    /// its caller saw an error, and that was not given back. A backend that
    /// cannot tell it from another owner's grant answers `Contended`, and the
    /// grant lapses with its TTL.
    async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Grant>;

    /// Waits for the grant until `wait.until`. The default polls
    /// [`try_acquire`](Self::try_acquire) with jittered backoff, woken early
    /// by [`on_release`](Self::on_release). Backends that can wait in the
    /// server (a queue, a blocking statement) override it; they set
    /// [`Grant::sent_at`] to when the winning request was sent. A grant won
    /// by a retry under an owner of its own says so in [`Grant::owner`], and
    /// a lease for it must be built with that owner.
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        wait: &Waiting,
    ) -> Result<Grant> {
        crate::wait::poll_until_granted(self, key, owner, ttl, wait).await
    }

    /// One attempt to grant `key` in `mode` (validated, and offered by
    /// [`capabilities`](Self::capabilities)) to `owner` for `ttl`, as
    /// [`try_acquire`](Self::try_acquire) does for the exclusive mode.
    /// Refused with [`Error::Contended`] while the mode admits no more
    /// holders, and with [`Error::ModeConflict`] while the key is held in
    /// another mode. Every grant, whatever its mode, gets a fencing token
    /// above every earlier grant's on the key.
    ///
    /// The lease of the grant carries its mode ([`Lease::mode`]), so that
    /// [`extend`](Self::extend) and [`release`](Self::release) can tell a
    /// permit from an exclusive grant. The default serves the exclusive
    /// mode through `try_acquire` and refuses the others with
    /// [`Error::Unsupported`]: a backend overrides it for the modes it
    /// declares in its capabilities.
    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        match mode {
            Mode::Exclusive => self.try_acquire(key, owner, ttl).await,
            other => Err(Error::unsupported_mode(self.capabilities(), &other)),
        }
    }

    /// Waits for a grant in `mode` until `wait.until`, as
    /// [`acquire`](Self::acquire) does for the exclusive mode (the default
    /// calls it for that mode). For the other modes the default polls
    /// [`try_acquire_in`](Self::try_acquire_in) with jittered backoff, woken
    /// early by [`on_release`](Self::on_release), in no particular order.
    async fn acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
        wait: &Waiting,
    ) -> Result<Grant> {
        match mode {
            Mode::Exclusive => self.acquire(key, owner, ttl, wait).await,
            other => crate::wait::poll_mode_until_granted(self, key, owner, ttl, other, wait).await,
        }
    }

    /// Moves the grant's expiry to `ttl` from now, only if `lease` still holds
    /// it; otherwise [`Error::Lost`](crate::Error::Lost). Never re-creates an
    /// expired grant.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()>;

    /// Deletes the grant only if it is still `lease`'s; otherwise
    /// [`Error::Lost`](crate::Error::Lost), leaving the current holder alone.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Registers interest in the release of `key`, before an attempt, so that
    /// a release between the attempt and the wait is not missed. Returns a
    /// future that completes on a release message, or `None` when the
    /// backend has no wake-ups (waiters then poll).
    async fn on_release(&self, _key: &LockKey) -> Option<WakeUpFuture> {
        None
    }

    /// One attempt by a waiter that holds `place`, on a backend that keeps a
    /// waiting line ([`WaitingOrder`](crate::WaitingOrder) other than
    /// `Unordered`). Granted only when the key is free and `place` is at
    /// the head of the line (or the line is empty), and then `place` leaves
    /// the line. Otherwise [`Error::Contended`], with `place` joined at the
    /// tail or, when already in line, its lease refreshed. The default,
    /// for backends without a line, is [`try_acquire`](Self::try_acquire).
    async fn try_acquire_queued(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        place: &Place,
    ) -> Result<Grant> {
        let _ = place;
        self.try_acquire(key, owner, ttl).await
    }

    /// Like [`on_release`](Self::on_release), for the waiter at `place`:
    /// completes when it is its turn (a release woke it, and no other
    /// waiter). The default is `on_release`.
    async fn on_turn(&self, key: &LockKey, place: &Place) -> Option<WakeUpFuture> {
        let _ = place;
        self.on_release(key).await
    }

    /// Whether the backend keeps its waiters' places in line alive itself
    /// (renewing their leases) and hands a free key to the line's head
    /// without their asking, re-sending a wake-up its waiter may have
    /// missed. Its waiters then ask again only as a last resort, so a crowd
    /// costs the server no more per handoff than a few waiters. The default
    /// is no: waiters renew their places by asking, every third of the
    /// waiter lease.
    fn keeps_places(&self) -> bool {
        false
    }

    /// Takes `place` out of the line of `key` (its waiter gave up), handing
    /// the turn on if it was its own. Must not block: it runs when a wait
    /// is dropped, so it sends at once, in the background, whether or not
    /// the returned future is polled. That future completes once the leave
    /// reached the backend: a wait that runs out awaits it, so that a
    /// release right after the time-out does not reserve the key for a
    /// waiter that is gone. Where it cannot be sent, the place's lease
    /// bounds it. The default does nothing.
    fn leave_queue(&self, key: &LockKey, place: &Place) -> LeaveFuture {
        let _ = (key, place);
        Box::pin(std::future::ready(()))
    }

    /// A future that completes when the backend notices, before the next
    /// renewal, that `lease` is gone (a keep-alive stream ending, the holding
    /// connection dying). `None` when renewal is the only way to notice.
    fn loss_signal(&self, _lease: &Lease) -> Option<LossFuture> {
        None
    }

    /// Operator view: the locks held now whose keys start with `prefix`, in
    /// any order ([`Locker::inspect`](crate::Locker::inspect) sorts them).
    /// Optional; the default answers [`Error::Unsupported`].
    async fn inspect(&self, _prefix: &str) -> Result<Vec<HeldLock>> {
        Err(Error::unsupported(
            self.capabilities().backend,
            "listing held locks",
        ))
    }

    /// Operator view with a leak scan: [`inspect`](Self::inspect)'s locks,
    /// and the keys under `prefix` that will never expire. The default has
    /// no leaks to find: it is `inspect` alone.
    async fn report(&self, prefix: &str) -> Result<LockReport> {
        Ok(LockReport {
            held: self.inspect(prefix).await?,
            ..LockReport::default()
        })
    }

    /// Gives back what the backend keeps for its next grants: idle
    /// connections (PostgreSQL), idle leases (etcd, where each would
    /// otherwise stay on the server until its TTL runs out, then take a
    /// write to remove). Held locks and waiters are not affected. For a
    /// shutdown, or after a burst of locks; the default keeps nothing.
    async fn close_idle(&self) {}

    /// Operator action: deletes the grant on `key` whoever holds it, so that
    /// its holder's next renewal fails as lost. Returns whether a grant
    /// existed. Optional; the default answers [`Error::Unsupported`].
    async fn force_release(&self, _key: &LockKey) -> Result<bool> {
        Err(Error::unsupported(
            self.capabilities().backend,
            "force-releasing a lock",
        ))
    }
}

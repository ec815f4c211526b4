//! `Locker`: the handle users hold. Validation, deadlines, waiting, guards
//! and tracing live here, once, over any backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, debug_span, field};

use crate::guard::{GuardOptions, LockGuard};
use crate::observe::{GiveBackCause, Observer};
use crate::raw::{Grant, Waiting};
use crate::{
    Backoff, Capabilities, DriftMargin, DynBackend, Error, FencingToken, HeldLock, KeyLabel, Lease,
    LockBackend, LockKey, LostReason, Mode, OwnerToken, Result, Wait, validate,
};

/// The longest wait: about 30 years, as far as any clock here can count
/// ahead (what a wait of `Duration::MAX` means).
const FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// Settings of a [`Locker`] that apply to every backend, set one by one so
/// that a setting added later breaks no caller:
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Backoff, KeyLabel, Locker, LockerOptions, MemoryBackend};
///
/// let options = LockerOptions::default()
///     .backoff(Backoff::default())
///     .key_label(KeyLabel::Prefix('/'));
/// let locker = Locker::new(MemoryBackend::new()).with_options(options);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct LockerOptions {
    /// Margin subtracted from every TTL when computing deadlines.
    pub drift: DriftMargin,
    /// Delays between attempts while waiting.
    pub backoff: Backoff,
    /// Whether metrics carry the key (or its prefix) as a label; off by
    /// default, since every distinct key would make series of its own.
    pub key_label: KeyLabel,
}

impl LockerOptions {
    /// Sets the margin subtracted from every TTL when computing deadlines.
    pub fn drift(mut self, drift: DriftMargin) -> Self {
        self.drift = drift;
        self
    }

    /// Sets the delays between attempts while waiting.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets whether metrics carry the key (or its prefix) as a label.
    pub fn key_label(mut self, key_label: KeyLabel) -> Self {
        self.key_label = key_label;
        self
    }
}

/// A lock service over one backend: cheap to clone, safe to share.
///
/// ```
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{GuardOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let total = locker
///     .with_lock("invoice/42", GuardOptions::new(Duration::from_secs(10)), |token| async move {
///         // ... write to the protected resource, passing `token` along ...
///         token.get()
///     })
///     .await?;
/// # let _ = total; Ok(()) }
/// ```
///
/// With the `metrics` feature, a locker takes its metric handles from the
/// recorder in place when it is made: install the recorder first.
#[derive(Clone, Debug)]
pub struct Locker {
    backend: Arc<DynBackend>,
    options: LockerOptions,
    observer: Arc<Observer>,
    holders: Arc<crate::holder::Holders>,
}

impl Locker {
    /// A locker over `backend` with default options.
    pub fn new(backend: impl LockBackend) -> Self {
        Locker::from_arc(Arc::new(backend))
    }

    /// A locker over a shared backend.
    pub fn from_arc(backend: Arc<DynBackend>) -> Self {
        let observer = Arc::new(Observer::new(backend.capabilities().backend));
        Locker {
            backend,
            options: LockerOptions::default(),
            observer,
            holders: Arc::default(),
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: LockerOptions) -> Self {
        if options.key_label != self.options.key_label {
            self.observer = Arc::new(self.observer.with_key_label(options.key_label));
        }
        self.options = options;
        self
    }

    pub(crate) fn holders(&self) -> &crate::holder::Holders {
        &self.holders
    }

    pub(crate) fn observer(&self) -> &Observer {
        &self.observer
    }

    /// The options in force.
    pub fn options(&self) -> &LockerOptions {
        &self.options
    }

    /// What the backend promises.
    ///
    /// ```
    /// use lock_core::{FencingGuarantee, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let caps = locker.capabilities();
    /// assert_eq!(caps.fencing.guarantee, FencingGuarantee::Strict);
    /// println!("{}: tolerates {} server failure(s)", caps.backend, caps.tolerated_server_failures);
    /// ```
    pub fn capabilities(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// The backend itself.
    pub fn backend(&self) -> &Arc<DynBackend> {
        &self.backend
    }

    /// Validates a key against this backend's limits.
    pub fn key(&self, key: &str) -> Result<LockKey> {
        validate::key(key, &self.capabilities().limits)
    }

    fn ttl(&self, ttl: Duration) -> Result<Duration> {
        validate::ttl(
            ttl,
            &self.capabilities().limits,
            self.options.drift.for_ttl(ttl),
        )
    }

    fn span(&self, op: &'static str, key: &str) -> tracing::Span {
        debug_span!(
            "lock",
            op,
            backend = self.capabilities().backend,
            key,
            fencing_token = field::Empty
        )
    }

    /// One attempt to take `key` for `ttl`. Returns the lease, or
    /// [`Error::Contended`] (with the holder's remaining TTL when the backend
    /// knows it) without waiting.
    ///
    /// A grant whose reply came after its validity ran out is given back in
    /// the background and reported as [`Error::Lost`] with
    /// [`LostReason::ReplyTooLate`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let lease = locker.try_acquire("invoice/42", Duration::from_secs(10)).await?;
    /// let busy = locker.try_acquire("invoice/42", Duration::from_secs(10)).await;
    /// assert!(busy.unwrap_err().is_contended());
    /// locker.release(lease).await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease> {
        self.acquire_as("try_acquire", key, Mode::Exclusive, ttl, Wait::NONE)
            .await
    }

    async fn attempt(&self, key: LockKey, ttl: Duration, mode: Mode) -> Result<Lease> {
        let owner = OwnerToken::random();
        let sent = Instant::now();
        let mut grant = self.backend.try_acquire_in(&key, &owner, ttl, mode).await?;
        grant.sent_at.get_or_insert(sent);
        self.lease_from(key, owner, ttl, grant, mode)
    }

    /// Takes `key` for `ttl` in `mode`, waiting as `wait` says, as
    /// [`acquire`](Self::acquire) does for the exclusive mode. A mode the
    /// backend lacks is refused with [`Error::Unsupported`] (its
    /// capabilities say why); a key held in another mode (a semaphore with
    /// another number of permits) with [`Error::ModeConflict`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Locker, MemoryBackend, Mode, Wait};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let ttl = Duration::from_secs(10);
    /// let first = locker.acquire_in("partner-api", Mode::semaphore(2), ttl, Wait::NONE).await?;
    /// let second = locker.acquire_in("partner-api", Mode::semaphore(2), ttl, Wait::NONE).await?;
    /// let third = locker.acquire_in("partner-api", Mode::semaphore(2), ttl, Wait::NONE).await;
    /// assert!(third.unwrap_err().is_contended());
    /// assert!(second.fencing_token() > first.fencing_token());
    /// # Ok(()) }
    /// ```
    pub async fn acquire_in(
        &self,
        key: &str,
        mode: Mode,
        ttl: Duration,
        wait: Wait,
    ) -> Result<Lease> {
        self.acquire_as("acquire", key, mode, ttl, wait).await
    }

    /// Takes `key` in `mode`, traced as the operation `op`.
    async fn acquire_as(
        &self,
        op: &'static str,
        key: &str,
        mode: Mode,
        ttl: Duration,
        wait: Wait,
    ) -> Result<Lease> {
        let wait = wait.limit();
        let span = self.span(op, key);
        async {
            let (valid, ttl) = (self.key(key)?, self.ttl(ttl)?);
            let mode = validate::mode(mode, self.capabilities())?;
            let started = Instant::now();
            let attempt = self.observer.attempt(key);
            let outcome = if wait.is_zero() {
                // "Busy" reads the same from every entry point: Contended.
                self.attempt(valid, ttl, mode).await
            } else {
                self.wait_for(valid, ttl, mode, wait, started).await
            };
            attempt.answered();
            self.observer.acquired(key, &outcome, started.elapsed());
            outcome
        }
        .instrument(span)
        .await
    }

    /// Takes `key` for `ttl`, waiting as `wait` says for the holder to let
    /// go: `Wait::at_most(d)` gives up with [`Error::TimedOut`];
    /// [`Wait::NONE`] makes one attempt, like
    /// [`try_acquire`](Self::try_acquire), and a held key answers
    /// [`Error::Contended`]; [`Wait::FOREVER`] waits until it is free. Dropping the future cancels the wait; a
    /// grant won just before that is given back at once, or lapses after its
    /// TTL should the server be out of reach.
    ///
    /// A grant whose reply came after its validity ran out is given back in
    /// the background, and the wait goes on while it has time left.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Locker, MemoryBackend, Wait};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let ttl = Duration::from_secs(10);
    /// let held = locker.acquire("invoice/42", ttl, Wait::NONE).await?;
    /// let waited = locker.acquire("invoice/42", ttl, Wait::at_most(Duration::from_millis(20))).await;
    /// assert!(waited.unwrap_err().is_timed_out());
    /// locker.release(held).await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, key: &str, ttl: Duration, wait: Wait) -> Result<Lease> {
        self.acquire_as("acquire", key, Mode::Exclusive, ttl, wait)
            .await
    }

    /// Asks for `key` until granted or `wait` from `started` has passed.
    async fn wait_for(
        &self,
        key: LockKey,
        ttl: Duration,
        mode: Mode,
        wait: Duration,
        started: Instant,
    ) -> Result<Lease> {
        let waiting = Waiting {
            started,
            // A wait too long for the clock (`Duration::MAX` for
            // "forever") waits as long as the clock can count.
            until: started
                .checked_add(wait)
                .unwrap_or_else(|| started + FOREVER),
            backoff: self.options.backoff,
        };
        loop {
            let owner = OwnerToken::random();
            let asked = Instant::now();
            let mut grant = self
                .backend
                .acquire_in(&key, &owner, ttl, mode, &waiting)
                .await?;
            // Backends that wait in the server report when the winning request
            // went out; otherwise the start of this round is the safe bound.
            grant.sent_at.get_or_insert(asked);
            // A retry of the wait may have won with an owner of its own.
            let owner = grant.owner.take().unwrap_or(owner);
            match self.lease_from(key.clone(), owner, ttl, grant, mode) {
                Err(Error::Lost {
                    reason: LostReason::ReplyTooLate,
                    ..
                }) if Instant::now() < waiting.until => {
                    tracing::debug!(%key, "the grant's reply came too late; asking again");
                }
                outcome => return outcome,
            }
        }
    }

    /// Turns a grant into a lease, refusing one whose validity was used up
    /// before the reply arrived (Redlock's "validity must be positive" rule,
    /// applied to every backend). The refused grant is given back in the
    /// background: waiting for that round trip, as slow as the one that was
    /// just too slow, would only delay the caller's next move.
    fn lease_from(
        &self,
        key: LockKey,
        owner: OwnerToken,
        ttl: Duration,
        grant: Grant,
        mode: Mode,
    ) -> Result<Lease> {
        let sent = grant.sent_at.unwrap_or_else(Instant::now);
        let deadline = self.options.drift.deadline(sent, ttl, grant.extra_margin);
        let mut lease = Lease::from_grant(key, owner, ttl, deadline, grant, mode);
        if !lease.is_within_deadline() {
            let error = Error::lost(lease.key().as_str(), LostReason::ReplyTooLate);
            self.observer
                .gave_back(lease.key().as_str(), GiveBackCause::Late);
            self.give_back(lease);
            return Err(error);
        }
        self.observer.hold(&mut lease);
        tracing::Span::current().record("fencing_token", lease.fencing_token().get());
        Ok(lease)
    }

    /// Releases `lease` in the background; without a runtime to run it on,
    /// its TTL frees the lock.
    fn give_back(&self, lease: Lease) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let span = self.span("give_back", lease.key().as_str());
        runtime.spawn(
            async move {
                if let Err(e) = backend.release(&lease).await {
                    tracing::debug!(error = %e, "giving back a late grant failed; its TTL frees it");
                }
            }
            .instrument(span),
        );
    }

    /// Moves the lease's deadline to `ttl` from now, if it still holds the lock.
    ///
    /// A lease whose deadline has passed is reported lost without asking the
    /// backend: the holder already had to assume it was gone, and renewing
    /// would hide that gap.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let mut lease = locker.try_acquire("invoice/42", Duration::from_secs(10)).await?;
    /// let before = lease.deadline();
    /// locker.extend(&mut lease, Duration::from_secs(60)).await?;
    /// assert!(lease.deadline() > before);
    /// locker.release(lease).await?;
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let span = self.span("extend", lease.key().as_str());
        async {
            let ttl = self.ttl(ttl)?;
            if !lease.is_within_deadline() {
                self.observer.lost(lease, LostReason::DeadlinePassed);
                return Err(Error::lost(
                    lease.key().as_str(),
                    LostReason::DeadlinePassed,
                ));
            }
            let sent = Instant::now();
            if let Err(e) = self.backend.extend(lease, ttl).await {
                if let Error::Lost { reason, .. } = &e {
                    self.observer.lost(lease, *reason);
                }
                return Err(e);
            }
            lease.renewed(ttl, self.options.drift.deadline(sent, ttl, Duration::ZERO));
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Gives the lock up. Reports [`Error::Lost`] when the lease no longer
    /// held it, in which case nothing was deleted.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Locker, MemoryBackend};
    ///
    /// let memory = MemoryBackend::new();
    /// let locker = Locker::new(memory.clone());
    /// let lease = locker.try_acquire("invoice/42", Duration::from_secs(10)).await?;
    /// memory.expire_now("invoice/42"); // gone behind the holder's back
    /// assert!(locker.release(lease).await.unwrap_err().is_lost()); // nothing deleted
    /// # Ok(()) }
    /// ```
    pub async fn release(&self, mut lease: Lease) -> Result<()> {
        let span = self.span("release", lease.key().as_str());
        async {
            let result = self.backend.release(&lease).await;
            self.observer.released(&mut lease, &result);
            result
        }
        .instrument(span)
        .await
    }

    /// Frees the grant of a lease already counted lost (its deadline
    /// passed, while the backend may still hold it), counting nothing more.
    pub(crate) async fn release_lost(&self, lease: Lease) {
        let span = self.span("release", lease.key().as_str());
        let _ = self.backend.release(&lease).instrument(span).await;
    }

    /// Takes `key` (waiting up to `options.wait`) and keeps it renewed until
    /// the guard is released or dropped. See [`LockGuard`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{GuardOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let options = GuardOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
    /// let guard = locker.guard("jobs/nightly", options).await?;
    /// // ... pass guard.fencing_token() with every write ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn guard(&self, key: &str, options: GuardOptions) -> Result<LockGuard> {
        self.guard_in(key, Mode::Exclusive, options).await
    }

    /// Takes `key` in `mode` (waiting up to `options.wait`) and keeps the
    /// grant renewed, as [`guard`](Self::guard) does for the exclusive mode.
    /// [`Semaphore`](crate::Semaphore) handles call it.
    pub async fn guard_in(
        &self,
        key: &str,
        mode: Mode,
        options: GuardOptions,
    ) -> Result<LockGuard> {
        let ttl = self.ttl(options.ttl)?;
        let validity = self.options.drift.validity(ttl, Duration::ZERO);
        let every = options.renew_interval();
        if every >= validity {
            return Err(Error::invalid(
                "renew_every",
                format!(
                    "renew_every is {every:?}, not shorter than the lease's validity of {validity:?} \
                     (the TTL of {ttl:?} less the drift margin): the lease would lapse before its first renewal"
                ),
            ));
        }
        let lease = self
            .acquire_in(key, mode, ttl, Wait::at_most(options.wait))
            .await?;
        Ok(LockGuard::spawn(self.clone(), lease, every))
    }

    /// Runs `work` while holding `key`, renewing as needed, then releases.
    ///
    /// `work` receives the fencing token to pass to the protected resource.
    /// If the lock is lost before `work` finishes, `work` is cancelled
    /// (dropped at its next await) and [`Error::Lost`] is returned.
    pub async fn with_lock<F, Fut, T>(&self, key: &str, options: GuardOptions, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.with_guard(key, Mode::Exclusive, options, work).await
    }

    /// Runs `work` while holding `key` in `mode`; see [`with_lock`](Self::with_lock).
    pub(crate) async fn with_guard<F, Fut, T>(
        &self,
        key: &str,
        mode: Mode,
        options: GuardOptions,
        work: F,
    ) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.guard_in(key, mode, options).await?;
        let lost = guard.lost();
        let output = tokio::select! {
            biased;
            reason = lost => return Err(Error::lost(key, reason)),
            output = work(guard.fencing_token()) => output,
        };
        if Instant::now() >= guard.deadline() {
            return Err(Error::lost(key, LostReason::DeadlinePassed));
        }
        if let Err(e) = guard.release().await {
            // The work finished within the deadline, so its result stands; the
            // TTL frees the lock if this release did not.
            tracing::warn!(key, error = %e, "release after with_lock failed");
        }
        Ok(output)
    }

    /// Runs fallible `work` while holding `key`, as [`with_lock`](Self::with_lock)
    /// does, with one error type for both: the lock's errors turn into the
    /// work's through `From` (as `anyhow::Error`, `Box<dyn Error>` or a
    /// `#[from] lockkit::Error` variant do), so the caller gets a
    /// `Result<T, E>` rather than a `Result<Result<T, E>>`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use lock_core::{GuardOptions, Locker, MemoryBackend};
    ///
    /// #[derive(Debug)]
    /// enum JobError { Lock(lock_core::Error), Empty }
    /// impl From<lock_core::Error> for JobError {
    ///     fn from(e: lock_core::Error) -> Self { JobError::Lock(e) }
    /// }
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let options = GuardOptions::new(Duration::from_secs(10));
    /// let outcome: Result<u64, JobError> = locker
    ///     .try_with_lock("invoice/42", options, |_token| async { Err(JobError::Empty) })
    ///     .await;
    /// assert!(matches!(outcome, Err(JobError::Empty)));
    /// # }
    /// ```
    pub async fn try_with_lock<F, Fut, T, E>(
        &self,
        key: &str,
        options: GuardOptions,
        work: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.with_lock(key, options, work).await?
    }

    /// Operator view: the locks held now under `prefix` (all when empty),
    /// sorted by key, byte by byte. [`Error::Unsupported`] when the backend
    /// cannot list.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let _lease = locker.try_acquire("jobs/nightly", Duration::from_secs(10)).await?;
    /// let held = locker.inspect("jobs/").await?;
    /// assert_eq!(held[0].key, "jobs/nightly");
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let span = self.span("inspect", prefix);
        let mut held = self.backend.inspect(prefix).instrument(span).await?;
        // Sorted here, once: a backend's own order may follow a database
        // collation (PostgreSQL's `ORDER BY` on text) rather than bytes.
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    /// Operator view with a leak scan: the locks held under `prefix`, as
    /// [`inspect`](Self::inspect) lists them, and the keys there that will
    /// never expire, each blocking its lock until an operator deletes it.
    /// [`Error::Unsupported`] when the backend cannot list.
    pub async fn report(&self, prefix: &str) -> Result<crate::LockReport> {
        let span = self.span("inspect", prefix);
        let mut report = self.backend.report(prefix).instrument(span).await?;
        report.held.sort_by(|a, b| a.key.cmp(&b.key));
        report.leaks.sort();
        Ok(report)
    }

    /// Gives back what the backend keeps idle for the next grants (see
    /// [`LockBackend::close_idle`]); held locks are not affected. The next
    /// grants set up afresh what they need.
    pub async fn close_idle(&self) {
        self.backend.close_idle().await
    }

    /// Operator action: deletes the grant on `key` whoever holds it; its
    /// holder learns at its next renewal (or at once, where the backend
    /// signals losses). Returns whether a grant existed.
    /// [`Error::Unsupported`] when the backend cannot do this.
    pub async fn force_release(&self, key: &str) -> Result<bool> {
        let span = self.span("force_release", key);
        async {
            let key = self.key(key)?;
            self.backend.force_release(&key).await
        }
        .instrument(span)
        .await
    }
}

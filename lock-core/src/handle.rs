//! `Lock`: one named lock with its options, made once and used wherever
//! that lock is taken (what Redisson's `getLock`, redsync's `NewMutex` and
//! DistributedLock's `CreateLock` give): the key is checked once, and the
//! TTL and wait travel with it instead of being repeated at every call.

use std::future::Future;

use crate::{Error, FencingToken, GuardOptions, LockGuard, Locker, Result};

/// One named lock over a [`Locker`]: cheap to clone, safe to share.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{GuardOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let report = locker.lock("jobs/nightly-report", GuardOptions::new(Duration::from_secs(30)))?;
///
/// let guard = report.guard().await?;
/// assert!(report.guard().await.unwrap_err().is_contended());
/// guard.release().await?;
///
/// let rows = report.with_lock(|_token| async { 1234 }).await?;
/// # let _ = rows; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Lock {
    locker: Locker,
    key: String,
    options: GuardOptions,
}

impl Locker {
    /// The lock named `key`, taken with `options` (TTL, wait, renewal).
    /// The key is checked here, once: an invalid one is refused with
    /// [`Error::InvalidInput`] before any call is made.
    pub fn lock(&self, key: &str, options: GuardOptions) -> Result<Lock> {
        self.key(key)?;
        Ok(Lock {
            locker: self.clone(),
            key: key.to_owned(),
            options,
        })
    }
}

impl Lock {
    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The options every call on this lock uses.
    pub fn options(&self) -> GuardOptions {
        self.options
    }

    /// Takes the lock (waiting as the options say) and keeps it renewed;
    /// see [`Locker::guard`].
    pub async fn guard(&self) -> Result<LockGuard> {
        self.locker.guard(&self.key, self.options).await
    }

    /// Runs `work` under the lock; see [`Locker::with_lock`].
    pub async fn with_lock<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.locker.with_lock(&self.key, self.options, work).await
    }

    /// Runs fallible `work` under the lock; see [`Locker::try_with_lock`].
    pub async fn try_with_lock<F, Fut, T, E>(&self, work: F) -> std::result::Result<T, E>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.locker
            .try_with_lock(&self.key, self.options, work)
            .await
    }
}

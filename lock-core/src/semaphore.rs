//! `Semaphore`: a key that admits up to N holders at once, each with a
//! permit of its own (lease, renewal, `lost()`, fencing token), as the
//! [`Lock`](crate::Lock) handle is for the exclusive lock.

use std::future::Future;

use crate::{Error, FencingToken, GuardOptions, LockGuard, Locker, Mode, Result, validate};

/// A semaphore of N permits over a [`Locker`]: cheap to clone, safe to share.
///
/// The number of permits is part of the key's identity: while the key has
/// holders, a caller that asks with another number (or for an exclusive
/// lock) is refused with [`Error::ModeConflict`], naming both.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{GuardOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// // At most 2 calls to the partner's API at once, from every process.
/// let partner = locker.semaphore("partner-api", 2, GuardOptions::new(Duration::from_secs(30)))?;
///
/// let first = partner.guard().await?;
/// let second = partner.guard().await?;
/// assert!(partner.guard().await.unwrap_err().is_contended()); // no third
/// assert!(second.fencing_token() > first.fencing_token());
/// first.release().await?; // its permit goes to the next caller
///
/// let answer = partner.with_permit(|_token| async { "called" }).await?;
/// # let _ = answer; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Locker,
    key: String,
    permits: u32,
    options: GuardOptions,
}

impl Locker {
    /// The semaphore named `key`, of `permits` permits, each taken with
    /// `options` (TTL, wait, renewal). The key and the number are checked
    /// here, once: an invalid one is refused with [`Error::InvalidInput`]
    /// (naming `key` or `permits` and the limit), and a backend without
    /// semaphores with [`Error::Unsupported`] and its reason, before any
    /// call is made.
    pub fn semaphore(&self, key: &str, permits: u32, options: GuardOptions) -> Result<Semaphore> {
        self.key(key)?;
        validate::mode(Mode::semaphore(permits), self.capabilities())?;
        Ok(Semaphore {
            locker: self.clone(),
            key: key.to_owned(),
            permits,
            options,
        })
    }
}

impl Semaphore {
    /// The semaphore's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The options every permit is taken with.
    pub fn options(&self) -> GuardOptions {
        self.options
    }

    /// Takes a permit (waiting as the options say) and keeps it renewed
    /// until the guard is released or dropped; see [`LockGuard`]. A full
    /// semaphore answers [`Error::Contended`] (or [`Error::TimedOut`] after
    /// a wait), with the time until its first permit expires.
    pub async fn guard(&self) -> Result<LockGuard> {
        self.locker
            .guard_in(&self.key, Mode::semaphore(self.permits), self.options)
            .await
    }

    /// Runs `work` holding a permit; see [`Locker::with_lock`].
    pub async fn with_permit<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.locker
            .with_guard(&self.key, Mode::semaphore(self.permits), self.options, work)
            .await
    }

    /// Runs fallible `work` holding a permit; see [`Locker::try_with_lock`].
    pub async fn try_with_permit<F, Fut, T, E>(&self, work: F) -> std::result::Result<T, E>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.with_permit(work).await?
    }
}

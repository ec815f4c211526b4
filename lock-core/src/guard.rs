//! `LockGuard`: a held lock that renews itself and says when it is lost.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::Instrument;

use crate::raw::LossFuture;
use crate::{Error, FencingToken, Lease, LockKey, Locker, LostReason, Result};

/// How to take and keep a lock with [`Locker::guard`] or [`Locker::with_lock`].
///
/// ```
/// use std::time::Duration;
/// use lock_core::GuardOptions;
///
/// let options = GuardOptions::new(Duration::from_secs(30)) // TTL, renewed every 10 s
///     .wait(Duration::from_secs(5))                       // wait up to 5 s for it
///     .renew_every(Duration::from_secs(5));               // or renew more often
/// assert_eq!(options.ttl, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuardOptions {
    /// TTL of the grant, renewed before it runs out.
    pub ttl: Duration,
    /// How long to wait for the lock (zero: one attempt).
    pub wait: Duration,
    /// Renewal interval; `None` means a third of the TTL, which leaves two
    /// more tries before the deadline if one renewal fails.
    pub renew_every: Option<Duration>,
}

impl GuardOptions {
    /// A guard with this TTL, no waiting, renewing every TTL/3.
    pub fn new(ttl: Duration) -> Self {
        GuardOptions {
            ttl,
            wait: Duration::ZERO,
            renew_every: None,
        }
    }

    /// Waits up to `wait` for the lock.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Renews at this interval instead of TTL/3. It must be shorter than
    /// the lease's validity (the TTL less the drift margin):
    /// [`Locker::guard`] refuses one that is not.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    pub(crate) fn renew_interval(&self) -> Duration {
        self.renew_every
            .unwrap_or(self.ttl / 3)
            .max(Duration::from_millis(1))
    }
}

#[derive(Debug, Clone, Copy)]
struct Status {
    deadline: Instant,
    lost: Option<LostReason>,
}

type ReleaseReply = oneshot::Sender<Result<()>>;

/// A held lock, renewed in the background until released or dropped.
///
/// - [`fencing_token`](Self::fencing_token) and [`deadline`](Self::deadline)
///   say what to pass to the resource and until when to trust the lock;
/// - [`lost`](Self::lost) completes when renewal fails, the backend reports
///   the grant gone, or the deadline passes without a renewal;
/// - dropping the guard releases in the background: it never blocks and
///   never panics, even outside a runtime (then the TTL frees the lock).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{GuardOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let guard = locker.guard("jobs/nightly", GuardOptions::new(Duration::from_secs(30))).await?;
/// let token = guard.fencing_token();
/// tokio::select! {
///     reason = guard.lost() => eprintln!("lost the lock: {reason}"),
///     () = async { /* the work, passing `token` along */ } => {}
/// }
/// guard.release().await?;
/// # let _ = token; Ok(()) }
/// ```
#[derive(Debug)]
pub struct LockGuard {
    key: LockKey,
    token: FencingToken,
    status: watch::Receiver<Status>,
    // Dropping this sender is the "release in the background" signal.
    release: Option<oneshot::Sender<ReleaseReply>>,
}

impl LockGuard {
    pub(crate) fn spawn(locker: Locker, lease: Lease, every: Duration) -> LockGuard {
        let (status_tx, status) = watch::channel(Status {
            deadline: lease.deadline(),
            lost: None,
        });
        let (release, release_rx) = oneshot::channel();
        let guard = LockGuard {
            key: lease.key().clone(),
            token: lease.fencing_token(),
            status,
            release: Some(release),
        };
        // Subscribe to the loss signal before returning, so that a loss right
        // after the grant is not missed while the task waits to be scheduled.
        let loss = locker
            .backend()
            .loss_signal(&lease)
            .unwrap_or_else(|| Box::pin(std::future::pending()));
        // Renewals run inside the caller's span, so that a request's span
        // covers the renewals of the locks it took.
        let renewals = keep_renewed(locker, lease, every, loss, status_tx, release_rx);
        tokio::spawn(renewals.instrument(tracing::Span::current()));
        guard
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The grant's fencing token (unchanged by renewals).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The current deadline; it moves forward with each renewal. (A tokio
    /// `Instant`, so that tests on tokio's paused clock see it move with
    /// that clock; [`remaining`](Self::remaining) needs no tokio import.)
    pub fn deadline(&self) -> Instant {
        self.status.borrow().deadline
    }

    /// How long the lock is certainly held from now, unless renewed: zero
    /// once the deadline has passed or the lock is lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{GuardOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let guard = locker.guard("report", GuardOptions::new(Duration::from_secs(30))).await?;
    /// assert!(guard.is_held());
    /// assert!(guard.remaining() <= Duration::from_secs(30));
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Duration {
        let status = self.status.borrow();
        match status.lost {
            Some(_) => Duration::ZERO,
            None => status.deadline.saturating_duration_since(Instant::now()),
        }
    }

    /// Whether the lock is held, as far as this process can tell: not
    /// lost, and its deadline not passed.
    pub fn is_held(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// Runs `work` while the lock is held: its output, or [`Error::Lost`]
    /// as soon as the lock is lost (then `work` is dropped at its next
    /// await, and does no more). The guard stays held after it; release
    /// it, or run more work under it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{GuardOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let guard = locker.guard("report", GuardOptions::new(Duration::from_secs(30))).await?;
    /// let rows = guard.run_until_lost(async { 42 }).await?;
    /// guard.release().await?;
    /// assert_eq!(rows, 42);
    /// # Ok(()) }
    /// ```
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output> {
        tokio::select! {
            biased;
            reason = self.lost() => Err(Error::lost(self.key.as_str(), reason)),
            output = work => Ok(output),
        }
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.status.borrow().lost
    }

    /// Completes when the lock is lost. Can be awaited from another task, any
    /// number of times; it does not borrow the guard.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static + use<> {
        let mut status = self.status.clone();
        async move {
            loop {
                if let Some(reason) = status.borrow_and_update().lost {
                    return reason;
                }
                if status.changed().await.is_err() {
                    // The renewal task is gone without a verdict: the lock is not kept.
                    return status.borrow().lost.unwrap_or(LostReason::Released);
                }
            }
        }
    }

    /// Releases the lock now and reports the outcome.
    pub async fn release(mut self) -> Result<()> {
        let (reply, outcome) = oneshot::channel();
        let sent = self
            .release
            .take()
            .map(|tx| tx.send(reply).is_ok())
            .unwrap_or(false);
        if sent && let Ok(result) = outcome.await {
            return result;
        }
        let reason = self.status.borrow().lost.unwrap_or(LostReason::NotHeld);
        Err(Error::lost(self.key.as_str(), reason))
    }
}

/// The renewal task: renews every `every`, watches the backend's loss
/// signal and the deadline, and releases when the guard says so or is dropped.
async fn keep_renewed(
    locker: Locker,
    mut lease: Lease,
    every: Duration,
    mut loss: LossFuture,
    status: watch::Sender<Status>,
    mut release: oneshot::Receiver<ReleaseReply>,
) {
    let lose = |reason| status.send_modify(|s| s.lost = Some(reason));
    let retry = (every / 4).max(Duration::from_millis(5));
    let drift = locker.options().drift;
    // Renew once `every` has passed since the request that won the grant
    // (or its latest renewal) was sent, whenever its reply came: a grant
    // backdated by a slow reply, a reused etcd lease or Redlock's fencing
    // round has less time left than its validity.
    let due = |lease: &Lease| {
        let unspent = drift
            .validity(lease.ttl(), Duration::ZERO)
            .saturating_sub(every);
        lease
            .deadline()
            .checked_sub(unspent)
            .unwrap_or_else(Instant::now)
    };
    let mut next = due(&lease);
    loop {
        tokio::select! {
            biased;
            asked = &mut release => {
                let key = lease.key().clone();
                let result = locker.release(lease).await;
                lose(LostReason::Released);
                match asked {
                    Ok(reply) => { let _ = reply.send(result); }
                    Err(_dropped) => if let Err(e) = result {
                        tracing::debug!(%key, error = %e, "background release failed; the TTL frees the lock");
                    },
                }
                return;
            }
            reason = &mut loss => {
                locker.observer().lost(&mut lease, reason);
                lose(reason);
                return;
            }
            () = sleep_until(lease.deadline()) => {
                locker.observer().lost(&mut lease, LostReason::DeadlinePassed);
                lose(LostReason::DeadlinePassed);
                // The backend may still hold it (drift margin); free it for others.
                locker.release_lost(lease).await;
                return;
            }
            () = sleep_until(next) => {
                let ttl = lease.ttl();
                match timeout_at(lease.deadline(), locker.extend(&mut lease, ttl)).await {
                    Ok(Ok(())) => {
                        status.send_modify(|s| s.deadline = lease.deadline());
                        next = due(&lease);
                    }
                    Ok(Err(Error::Lost { reason, .. })) => {
                        // `extend` counted the loss.
                        lose(reason);
                        return;
                    }
                    Ok(Err(e)) => {
                        locker.observer().renewal_failed(lease.key().as_str(), &e);
                        next = Instant::now() + retry;
                    }
                    Err(_deadline) => {
                        locker.observer().lost(&mut lease, LostReason::DeadlinePassed);
                        lose(LostReason::DeadlinePassed);
                        locker.release_lost(lease).await;
                        return;
                    }
                }
            }
        }
    }
}

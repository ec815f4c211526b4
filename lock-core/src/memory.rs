//! The in-memory backend: the whole contract in one process, with faults a
//! test can script. Swap it in for a real backend in your own tests.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::raw::{GiveBack, Grant, LeaveFuture, LossFuture, Place, WakeUpFuture};
use crate::{
    Assumption, Capabilities, Error, FencingGuarantee, FencingToken, HeldLock, Lease, LockBackend,
    LockKey, LostReason, Mode, Offer, OwnerToken, Result, SafetyModel, Stall, WaitingOrder, WakeUp,
};

/// Locks kept in this process's memory. Clones share the same locks.
///
/// Time is tokio's clock, so tests may use `tokio::time::pause()` and
/// `advance()` to expire grants without waiting.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{Locker, MemoryBackend};
///
/// let memory = MemoryBackend::new();
/// let locker = Locker::new(memory.clone());
/// let lease = locker.try_acquire("job/7", Duration::from_secs(30)).await?;
/// memory.expire_now("job/7"); // a scripted fault: the grant is gone
/// assert!(locker.release(lease).await.unwrap_err().is_lost());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    capabilities: Arc<Capabilities>,
    waiter_lease: Duration,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<String, Slot>,
    /// One counter for all keys: strictly increasing per key as well.
    last_token: u64,
    failing_renewals: u32,
    unavailable: bool,
    /// The next grants' replies, and how late each comes.
    late_grants: u32,
    grant_delay: Duration,
}

#[derive(Debug)]
struct Slot {
    holder: Option<Holder>,
    /// The key's holders while it is a semaphore (then `holder` is `None`).
    semaphore: Option<Permits>,
    /// The key's shared (read) holders, while it is a read-write lock held
    /// for reading (then `holder` and `semaphore` are `None`).
    readers: Vec<Holder>,
    /// The waiting line, head first: while it has a live head, only that
    /// waiter is granted the free key.
    line: VecDeque<InLine>,
    /// Bumped whenever a grant is removed: wakes waiters and loss signals.
    removals: watch::Sender<Removal>,
}

#[derive(Debug)]
struct InLine {
    place: Place,
    /// Past this, the waiter is taken for dead and skipped.
    expires_at: Instant,
}

/// A semaphore's holders, at most `limit` of them live.
#[derive(Debug)]
struct Permits {
    limit: u32,
    holders: Vec<Holder>,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerToken,
    token: FencingToken,
    expires_at: Instant,
}

/// The latest removal of a grant on a key: whose, and why.
#[derive(Debug, Clone, Default)]
struct Removal {
    /// Every grant removed at once: a semaphore's faults remove them all.
    owners: Vec<OwnerToken>,
    reason: Option<LostReason>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            holder: None,
            semaphore: None,
            readers: Vec::new(),
            line: VecDeque::new(),
            removals: watch::channel(Removal::default()).0,
        }
    }

    /// The holder, if its grant has not expired.
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }

    /// The head of the line, once heads whose lease ran out are dropped.
    fn live_head(&mut self, now: Instant) -> Option<&Place> {
        while self.line.front().is_some_and(|w| w.expires_at <= now) {
            self.line.pop_front();
        }
        self.line.front().map(|w| &w.place)
    }

    /// Joins `place` at the tail, or refreshes its lease if it is in line.
    fn keep_place(&mut self, place: &Place, expires_at: Instant) {
        match self.line.iter_mut().find(|w| w.place == *place) {
            Some(waiter) => waiter.expires_at = expires_at,
            None => self.line.push_back(InLine {
                place: place.clone(),
                expires_at,
            }),
        }
    }

    /// The semaphore's live holders, once expired ones are dropped.
    fn live_permits(&mut self, now: Instant) -> Option<&mut Permits> {
        let permits = self.semaphore.as_mut()?;
        permits.holders.retain(|h| h.expires_at > now);
        if permits.holders.is_empty() {
            self.semaphore = None;
        }
        self.semaphore.as_mut()
    }

    /// The live shared holders, once expired ones are dropped.
    fn live_readers(&mut self, now: Instant) -> &mut Vec<Holder> {
        self.readers.retain(|h| h.expires_at > now);
        &mut self.readers
    }

    /// The mode the key is held in now, if held.
    fn held_mode(&mut self, now: Instant) -> Option<Mode> {
        if self.live_holder(now).is_some() {
            return Some(Mode::Exclusive);
        }
        if !self.live_readers(now).is_empty() {
            return Some(Mode::Shared);
        }
        self.live_permits(now).map(|p| Mode::semaphore(p.limit))
    }

    /// Removes every grant on the key: the exclusive one, or all permits.
    fn remove(&mut self, reason: LostReason) -> bool {
        let mut owners: Vec<OwnerToken> = self.holder.take().into_iter().map(|h| h.owner).collect();
        if let Some(permits) = self.semaphore.take() {
            owners.extend(permits.holders.into_iter().map(|h| h.owner));
        }
        owners.extend(self.readers.drain(..).map(|h| h.owner));
        self.removed(owners, reason)
    }

    /// Tells waiters and loss signals that `owners` lost their grants.
    fn removed(&mut self, owners: Vec<OwnerToken>, reason: LostReason) -> bool {
        if owners.is_empty() {
            return false;
        }
        self.removals.send_replace(Removal {
            owners,
            reason: Some(reason),
        });
        true
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none()
            && self.semaphore.is_none()
            && self.readers.is_empty()
            && self.line.is_empty()
            && self.removals.receiver_count() == 0
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// An empty lock space.
    pub fn new() -> Self {
        MemoryBackend {
            state: Arc::default(),
            capabilities: Arc::new(Self::capabilities_with(crate::raw::DEFAULT_WAITER_LEASE)),
            waiter_lease: crate::raw::DEFAULT_WAITER_LEASE,
        }
    }

    /// Keeps places in line for `lease` without a refresh (default
    /// [`DEFAULT_WAITER_LEASE`](crate::raw::DEFAULT_WAITER_LEASE)): a waiter that
    /// stops refreshing (a leaked wait) holds the line up that long at most.
    /// Refused, naming `waiter_lease`, outside 30 ms to 60 s.
    pub fn with_waiter_lease(mut self, lease: Duration) -> Result<Self> {
        self.waiter_lease = crate::raw::waiter_lease("waiter_lease", lease)?;
        self.capabilities = Arc::new(Self::capabilities_with(lease));
        Ok(self)
    }

    fn capabilities_with(waiter_lease: Duration) -> Capabilities {
        Capabilities::new("memory", SafetyModel::InProcess)
            .with_fencing(FencingGuarantee::Strict, [Assumption::ProcessMemory])
            .with_wake_up(WakeUp::InProcess)
            .with_waiting_order(WaitingOrder::Fifo {
                stall: Stall::WaiterLease(waiter_lease),
            })
            .with_remaining_ttl(true)
            .with_semaphore(Offer::Offered {
                waiting_order: WaitingOrder::Unordered,
            })
            .with_read_write(Offer::Offered {
                waiting_order: WaitingOrder::Unordered,
            })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map half-updated
        // (every update is a single insert or remove), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What every grant shares: the scripted outage, the key's next token,
    /// its slot, and the scripted late replies; `decide` refuses, or
    /// records the grant of `token` in the slot.
    fn record_grant(
        &self,
        key: &LockKey,
        decide: impl FnOnce(&mut Slot, Instant, FencingToken) -> Result<()>,
    ) -> Result<(Grant, Option<Duration>)> {
        let mut state = self.state();
        if state.unavailable {
            return Err(self.unavailable());
        }
        let now = Instant::now();
        let token = FencingToken::new(state.last_token + 1);
        let slot = state.slots.entry(key.to_string()).or_insert_with(Slot::new);
        decide(slot, now, token)?;
        state.last_token = token.get();
        let late = (state.late_grants > 0).then(|| {
            state.late_grants -= 1;
            state.grant_delay
        });
        Ok((Grant::new(token).sent_at(now), late))
    }

    /// Grants `key` to `owner` if it is free and no other waiter's turn
    /// (the waiter at `place`: its own turn); with the delay of its reply
    /// when a scripted fault makes it late. Refused, a `place` keeps its
    /// place in line.
    fn grant(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        place: Option<&Place>,
    ) -> Result<(Grant, Option<Duration>)> {
        let waiter_lease = self.waiter_lease;
        self.record_grant(key, |slot, now, token| {
            if let Some(held @ Mode::Semaphore { .. }) = slot.held_mode(now) {
                return Err(Error::ModeConflict {
                    key: key.to_string(),
                    held: Some(held),
                    asked: Mode::Exclusive,
                });
            }
            // Readers hold until the last of them leaves; a waiting writer's
            // place in line (kept below) makes new readers wait behind it.
            let last_reader = slot.live_readers(now).iter().map(|h| h.expires_at).max();
            let remaining = slot
                .live_holder(now)
                .map(|h| h.expires_at)
                .or(last_reader)
                .map(|until| until - now);
            let others_turn = slot.live_head(now).is_some_and(|head| Some(head) != place);
            if remaining.is_some() || others_turn {
                if let Some(place) = place {
                    slot.keep_place(place, now + waiter_lease);
                }
                return Err(Error::Contended {
                    key: key.to_string(),
                    remaining,
                });
            }
            if let Some(place) = place {
                slot.line.retain(|w| w.place != *place);
            }
            slot.holder = Some(Holder {
                owner: owner.clone(),
                token,
                expires_at: now + ttl,
            });
            Ok(())
        })
    }

    /// Grants one of `key`'s `permits` permits to `owner`, if one is free;
    /// the key's first holder sets its number of permits.
    fn grant_permit(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        permits: u32,
    ) -> Result<(Grant, Option<Duration>)> {
        self.record_grant(key, |slot, now, token| {
            let asked = Mode::semaphore(permits);
            match slot.held_mode(now) {
                Some(held) if held != asked => {
                    return Err(Error::ModeConflict {
                        key: key.to_string(),
                        held: Some(held),
                        asked,
                    });
                }
                _ => {}
            }
            let taken = slot.semaphore.get_or_insert_with(|| Permits {
                limit: permits,
                holders: Vec::new(),
            });
            // An earlier run of this very request (see `LockBackend::try_acquire`).
            taken.holders.retain(|h| h.owner != *owner);
            if taken.holders.len() >= permits as usize {
                let first_free = taken.holders.iter().map(|h| h.expires_at - now).min();
                return Err(Error::Contended {
                    key: key.to_string(),
                    remaining: first_free,
                });
            }
            taken.holders.push(Holder {
                owner: owner.clone(),
                token,
                expires_at: now + ttl,
            });
            Ok(())
        })
    }

    /// Grants `key` to `owner` for reading, unless a writer holds it or
    /// waits for it (a live place in its line: only writers stand there).
    fn grant_shared(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<(Grant, Option<Duration>)> {
        self.record_grant(key, |slot, now, token| {
            if let Some(held @ Mode::Semaphore { .. }) = slot.held_mode(now) {
                return Err(Error::ModeConflict {
                    key: key.to_string(),
                    held: Some(held),
                    asked: Mode::Shared,
                });
            }
            let writer = slot.live_holder(now).map(|h| h.expires_at - now);
            if writer.is_some() || slot.live_head(now).is_some() {
                return Err(Error::Contended {
                    key: key.to_string(),
                    remaining: writer,
                });
            }
            // An earlier run of this very request (see `LockBackend::try_acquire`).
            slot.readers.retain(|h| h.owner != *owner);
            slot.readers.push(Holder {
                owner: owner.clone(),
                token,
                expires_at: now + ttl,
            });
            Ok(())
        })
    }

    /// Removes `owner`'s grant on `key` (exclusive, a permit or a read
    /// hold), if it still has it.
    fn remove_owned(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        let mut state = self.state();
        let Some(slot) = state.slots.get_mut(key.as_str()) else {
            return false;
        };
        let removed = if slot.holder.as_ref().is_some_and(|h| h.owner == *owner) {
            slot.remove(LostReason::Released)
        } else if let Some(permits) = slot.semaphore.as_mut()
            && let Some(at) = permits.holders.iter().position(|h| h.owner == *owner)
        {
            permits.holders.swap_remove(at);
            if permits.holders.is_empty() {
                slot.semaphore = None;
            }
            slot.removed(vec![owner.clone()], LostReason::Released)
        } else if let Some(at) = slot.readers.iter().position(|h| h.owner == *owner) {
            slot.readers.swap_remove(at);
            slot.removed(vec![owner.clone()], LostReason::Released)
        } else {
            false
        };
        if slot.is_idle() {
            // Nobody waits on this key: forget it, so memory tracks held locks only.
            state.slots.remove(key.as_str());
        }
        removed
    }

    /// Takes `place` out of the line of `key`, waking the waiters when it
    /// was the head.
    fn leave_line(&self, key: &LockKey, place: &Place) {
        let mut state = self.state();
        let Some(slot) = state.slots.get_mut(key.as_str()) else {
            return;
        };
        let was_head = slot.line.front().is_some_and(|w| w.place == *place);
        slot.line.retain(|w| w.place != *place);
        if was_head {
            // The next waiter's turn, should the key be free: wake the
            // waiters (a removal with no reason, which loss signals ignore).
            slot.removals.send_replace(Removal::default());
        }
        if slot.is_idle() {
            state.slots.remove(key.as_str());
        }
    }

    /// The reply to a grant, as late as a scripted fault makes it.
    async fn reply(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        (grant, late): (Grant, Option<Duration>),
    ) -> Result<Grant> {
        let Some(delay) = late else {
            return Ok(grant);
        };
        // Dropped while the reply is on its way: nobody will hold the grant.
        let give_back = GiveBack::armed(|| {
            self.remove_owned(key, owner);
        });
        tokio::time::sleep(delay).await;
        give_back.disarm();
        Ok(grant)
    }

    fn unavailable(&self) -> Error {
        Error::Unavailable {
            backend: "memory",
            endpoint: "memory://".into(),
            reason: "made unavailable by a scripted fault".into(),
            source: None,
        }
    }

    // ---- scripted faults ------------------------------------------------

    /// Fault: the grant on `key` expires now. Its holder's next renewal
    /// fails as lost and its guard's `lost()` fires. Returns whether a grant existed.
    pub fn expire_now(&self, key: &str) -> bool {
        self.state()
            .slots
            .get_mut(key)
            .is_some_and(|s| s.remove(LostReason::NotHeld))
    }

    /// Fault: the holder of `key` vanishes as if its connection died; its
    /// grant is removed and its guard reports [`LostReason::ConnectionLost`].
    pub fn drop_holder(&self, key: &str) -> bool {
        self.state()
            .slots
            .get_mut(key)
            .is_some_and(|s| s.remove(LostReason::ConnectionLost))
    }

    /// Fault: the next `n` renewals (on any key) fail as if the backend were
    /// unreachable. A guard retries until its deadline, then reports lost.
    pub fn fail_next_renewals(&self, n: u32) {
        self.state().failing_renewals = n;
    }

    /// Fault: the next `n` grants are made at once but their replies come
    /// `by` later, as over a slow network. A reply later than the lease's
    /// validity (its TTL less the drift margin) is refused by the
    /// [`Locker`](crate::Locker), which gives the grant back; a waiting
    /// acquire then tries again.
    pub fn delay_next_grants(&self, n: u32, by: Duration) {
        let mut state = self.state();
        state.late_grants = n;
        state.grant_delay = by;
    }

    /// Fault: every operation fails as unreachable until set back to `false`.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
    }

    // ---- inspection -----------------------------------------------------

    /// The fencing token of the current holder of `key`, if any.
    pub fn holder_token(&self, key: &str) -> Option<FencingToken> {
        let now = Instant::now();
        self.state()
            .slots
            .get(key)
            .and_then(|s| s.live_holder(now))
            .map(|h| h.token)
    }

    /// The keys currently held, with their remaining TTL, sorted by key.
    pub fn held(&self) -> Vec<(String, Duration)> {
        let now = Instant::now();
        let mut held: Vec<_> = self
            .state()
            .slots
            .iter()
            .filter_map(|(k, s)| s.live_holder(now).map(|h| (k.clone(), h.expires_at - now)))
            .collect();
        held.sort();
        held
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Grant> {
        let granted = self.grant(key, owner, ttl, None)?;
        self.reply(key, owner, granted).await
    }

    async fn try_acquire_in(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        mode: Mode,
    ) -> Result<Grant> {
        let granted = match mode {
            Mode::Semaphore { permits } => self.grant_permit(key, owner, ttl, permits)?,
            Mode::Shared => self.grant_shared(key, owner, ttl)?,
            Mode::Exclusive => self.grant(key, owner, ttl, None)?,
        };
        self.reply(key, owner, granted).await
    }

    async fn try_acquire_queued(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        place: &Place,
    ) -> Result<Grant> {
        let granted = self.grant(key, owner, ttl, Some(place))?;
        self.reply(key, owner, granted).await
    }

    async fn on_turn(&self, key: &LockKey, _place: &Place) -> Option<WakeUpFuture> {
        // Every waiter of the key wakes and asks; only the head is granted.
        // In one process that costs a lock and a look each, not a herd of
        // round trips.
        self.on_release(key).await
    }

    fn leave_queue(&self, key: &LockKey, place: &Place) -> LeaveFuture {
        self.leave_line(key, place);
        Box::pin(std::future::ready(()))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let mut state = self.state();
        if state.unavailable {
            return Err(self.unavailable());
        }
        if state.failing_renewals > 0 {
            state.failing_renewals -= 1;
            return Err(self.unavailable());
        }
        let now = Instant::now();
        let slot = state.slots.get_mut(lease.key().as_str());
        let holder = match lease.mode() {
            Mode::Semaphore { .. } => slot
                .and_then(|s| s.semaphore.as_mut())
                .and_then(|p| p.holders.iter_mut().find(|h| h.owner == *lease.owner())),
            Mode::Shared => {
                slot.and_then(|s| s.readers.iter_mut().find(|h| h.owner == *lease.owner()))
            }
            Mode::Exclusive => slot.and_then(|s| s.holder.as_mut()),
        };
        match holder {
            Some(h) if h.owner == *lease.owner() && h.expires_at > now => {
                h.expires_at = now + ttl;
                Ok(())
            }
            _ => Err(Error::lost(lease.key().as_str(), LostReason::NotHeld)),
        }
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        if self.state().unavailable {
            return Err(self.unavailable());
        }
        let now = Instant::now();
        let key = lease.key().as_str();
        let live = {
            let mut state = self.state();
            state
                .slots
                .get_mut(key)
                .is_some_and(|slot| match lease.mode() {
                    Mode::Semaphore { .. } => slot
                        .live_permits(now)
                        .is_some_and(|p| p.holders.iter().any(|h| h.owner == *lease.owner())),
                    Mode::Shared => slot
                        .live_readers(now)
                        .iter()
                        .any(|h| h.owner == *lease.owner()),
                    Mode::Exclusive => slot
                        .live_holder(now)
                        .is_some_and(|h| h.owner == *lease.owner()),
                })
        };
        if !live || !self.remove_owned(lease.key(), lease.owner()) {
            return Err(Error::lost(key, LostReason::NotHeld));
        }
        Ok(())
    }

    async fn inspect(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let state = self.state();
        if state.unavailable {
            return Err(self.unavailable());
        }
        let now = Instant::now();
        let held: Vec<_> = state
            .slots
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .flat_map(|(k, s)| {
                let permits = s.semaphore.iter().flat_map(move |p| {
                    let mode = Mode::semaphore(p.limit);
                    p.holders.iter().map(move |h| (h, mode))
                });
                let readers = s.readers.iter().map(|h| (h, Mode::Shared));
                s.holder
                    .iter()
                    .map(|h| (h, Mode::Exclusive))
                    .chain(permits)
                    .chain(readers)
                    .filter(move |(h, _)| h.expires_at > now)
                    .map(move |(h, mode)| {
                        HeldLock::new(k.clone())
                            .with_remaining(h.expires_at - now)
                            .with_fencing_token(h.token)
                            .with_mode(mode)
                    })
            })
            .collect();
        Ok(held)
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let mut state = self.state();
        if state.unavailable {
            return Err(self.unavailable());
        }
        let now = Instant::now();
        Ok(state.slots.get_mut(key.as_str()).is_some_and(|s| {
            let live = s.held_mode(now).is_some();
            s.remove(LostReason::NotHeld) && live
        }))
    }

    async fn on_release(&self, key: &LockKey) -> Option<WakeUpFuture> {
        let mut removals = self
            .state()
            .slots
            .entry(key.to_string())
            .or_insert_with(Slot::new)
            .removals
            .subscribe();
        Some(Box::pin(async move {
            let _ = removals.changed().await;
        }))
    }

    fn loss_signal(&self, lease: &Lease) -> Option<LossFuture> {
        let state = self.state();
        let slot = state.slots.get(lease.key().as_str());
        let owner = lease.owner().clone();
        let now = Instant::now();
        let held = slot.is_some_and(|s| {
            let permits = s.semaphore.iter().flat_map(|p| p.holders.iter());
            s.holder
                .iter()
                .chain(permits)
                .chain(&s.readers)
                .any(|h| h.owner == owner && h.expires_at > now)
        });
        let (true, Some(slot)) = (held, slot) else {
            return Some(Box::pin(std::future::ready(LostReason::NotHeld)));
        };
        let mut removals = slot.removals.subscribe();
        drop(state);
        Some(Box::pin(async move {
            loop {
                if removals.changed().await.is_err() {
                    return std::future::pending().await;
                }
                let removal = removals.borrow_and_update().clone();
                match removal.reason {
                    // The holder's own release ends its guard through another path.
                    Some(LostReason::Released) => {}
                    Some(reason) if removal.owners.contains(&owner) => return reason,
                    _ => {}
                }
            }
        }))
    }
}

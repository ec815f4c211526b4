#![doc = include_str!("../README.md")]

mod backend;
mod capabilities;
mod deadline;
mod error;
mod fencing;
mod give_back;
mod guard;
mod handle;
mod holder;
pub mod human;
mod key;
mod lease;
mod locker;
mod memory;
mod mode;
mod observe;
mod operator;
mod owner;
mod patience;
mod place;
mod read_write;
mod semaphore;
#[cfg(feature = "sqlx")]
mod sqlx_support;
pub mod url;
// Reached through `raw`; public here only so that `raw` can re-export them.
#[doc(hidden)]
pub mod validate;
#[doc(hidden)]
pub mod wait;

pub use backend::{DynBackend, LockBackend};
pub use capabilities::{
    Assumption, Capabilities, Fencing, FencingGuarantee, Limits, SafetyModel, Stall, WaitingOrder,
    WakeUp,
};
pub use deadline::DriftMargin;
pub use error::{BoxError, Error, LostReason, Result};
pub use fencing::{Fence, FencingToken, StaleToken};
pub use guard::{GuardOptions, LockGuard};
pub use handle::Lock;
pub use holder::{HeldGuard, Holder};
pub use key::LockKey;
pub use lease::{Lease, LeaseState};
pub use locker::{Locker, LockerOptions};
pub use memory::MemoryBackend;
pub use mode::{MAX_PERMITS, Mode, Modes, Offer};
pub use observe::KeyLabel;
pub use operator::{HeldLock, LockReport};
pub use owner::{OwnerToken, Secret};
pub use patience::Wait;
pub use read_write::ReadWrite;
pub use semaphore::Semaphore;
pub use wait::{Backoff, WAITING_EVENT_TARGET};

/// For those who write a backend: what [`LockBackend`]'s methods take and
/// return, and the helpers every backend shares. An application that only
/// takes locks never needs this module.
pub mod raw {
    /// The trait's async methods are declared with this macro; backends use it too.
    pub use async_trait::async_trait;

    pub use crate::backend::{DynBackend, LeaveFuture, LockBackend, LossFuture, WakeUpFuture};
    pub use crate::give_back::GiveBack;
    pub use crate::lease::Grant;
    pub use crate::place::{DEFAULT_WAITER_LEASE, Place, waiter_lease};
    pub use crate::wait::Waiting;
    pub use crate::wait::poll_mode_until_granted;
    pub use crate::{validate, wait};
}

#![doc = include_str!("../README.md")]

mod backend;
mod capabilities;
mod deadline;
mod error;
mod fencing;
mod give_back;
mod guard;
mod handle;
pub mod human;
mod key;
mod lease;
mod locker;
mod memory;
mod observe;
mod operator;
mod owner;
mod patience;
mod place;
#[cfg(feature = "sqlx")]
mod sqlx_support;
pub mod url;
pub mod validate;
pub mod wait;

pub use backend::{DynBackend, LeaveFuture, LockBackend, LossFuture, WakeUpFuture};
pub use capabilities::{
    Assumption, Capabilities, Fencing, FencingGuarantee, Limits, SafetyModel, Stall, WaitingOrder,
    WakeUp,
};
pub use deadline::DriftMargin;
pub use error::{BoxError, Error, LostReason, Result};
pub use fencing::{Fence, FencingToken, StaleToken};
pub use give_back::GiveBack;
pub use guard::{GuardOptions, LockGuard};
pub use handle::Lock;
pub use key::LockKey;
pub use lease::{Grant, Lease, LeaseState};
pub use locker::{Locker, LockerOptions};
pub use memory::MemoryBackend;
pub use observe::KeyLabel;
pub use operator::{HeldLock, LockReport};
pub use owner::{OwnerToken, Secret};
pub use patience::Wait;
pub use place::{DEFAULT_WAITER_LEASE, Place, waiter_lease};
pub use wait::{Backoff, WAITING_EVENT_TARGET, Waiting};

/// The trait's async methods are declared with this macro; backends use it too.
pub use async_trait::async_trait;

#![doc = include_str!("../README.md")]

pub mod batch;
pub mod config;
pub mod errors;
pub mod holds;
pub mod keys;
pub mod read_write;
mod reply;
pub mod scripts;
pub mod semaphore;
pub mod server;
pub mod socket;

pub use batch::{Batcher, Claim, Handout};
pub use config::{RedisSettings, Timeouts};
pub use errors::map_error;
pub use keys::{KeyLayout, LockKeys};
pub use scripts::{AcquireReply, Scripts, TokenRule};

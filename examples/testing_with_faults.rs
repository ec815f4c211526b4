//! Testing your own code against lock failures with the memory backend:
//! no server, and faults on cue. `cargo test --example testing_with_faults`
//! runs the tests below; this is how they look in your crate's tests.
//!
//! The code under test takes a `Locker`, so that production passes one from
//! `lockkit::connect(url)` and the tests one over a `MemoryBackend`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lockkit::{GuardOptions, Locker};

/// The code under test: processes a batch under the lock, one item per
/// step, and stops as soon as the lock is lost. Returns the items done.
pub async fn process_batch(
    locker: &Locker,
    items: u32,
    done: Arc<AtomicU32>,
) -> lockkit::Result<u32> {
    let guard = locker
        .guard("batch", GuardOptions::new(Duration::from_secs(30)))
        .await?;
    for _ in 0..items {
        guard
            .run_until_lost(async {
                tokio::task::yield_now().await; // the item's real work
                done.fetch_add(1, Ordering::SeqCst);
            })
            .await?;
    }
    guard.release().await?;
    Ok(done.load(Ordering::SeqCst))
}

fn main() {
    println!("run `cargo test --example testing_with_faults`");
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockkit::{LostReason, MemoryBackend};

    #[tokio::test]
    async fn a_lost_lock_stops_the_batch() {
        let memory = MemoryBackend::new();
        let locker = Locker::new(memory.clone());
        let done = Arc::new(AtomicU32::new(0));
        // The lock expires behind the holder's back once 3 items are done.
        let watcher = {
            let (memory, done) = (memory.clone(), done.clone());
            tokio::spawn(async move {
                while done.load(Ordering::SeqCst) < 3 {
                    tokio::task::yield_now().await;
                }
                memory.expire_now("batch");
            })
        };
        let result = process_batch(&locker, 1_000, done.clone()).await;
        watcher.await.unwrap();
        match result {
            Err(lockkit::Error::Lost { reason, .. }) => assert_eq!(reason, LostReason::NotHeld),
            other => panic!("the batch went on under a lost lock: {other:?}"),
        }
        assert!(done.load(Ordering::SeqCst) < 1_000);
    }

    #[tokio::test]
    async fn a_busy_lock_is_reported_not_waited_for() {
        let locker = Locker::new(MemoryBackend::new());
        let _other = locker
            .guard("batch", GuardOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        let err = process_batch(&locker, 10, Arc::default())
            .await
            .unwrap_err();
        assert!(err.is_contended(), "{err}");
    }

    #[tokio::test]
    async fn the_batch_runs_to_the_end_when_nothing_fails() {
        let locker = Locker::new(MemoryBackend::new());
        assert_eq!(
            process_batch(&locker, 10, Arc::default()).await.unwrap(),
            10
        );
    }
}

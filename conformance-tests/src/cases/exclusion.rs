//! Mutual exclusion under contention.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::Wait;

use super::{LONG_TTL, SLACK, within};
use crate::Fixture;

const CONTENDERS: usize = 32;
const SECTIONS_EACH: usize = 2;

/// 32 tasks, half on each of two independent clients, each enter the
/// critical section twice and do a non-atomic read-modify-write there; the
/// final value equals the number of sections, no section ever starts while
/// another is running, and each section's fencing token is greater than
/// the one before it, in the order the sections ran.
pub async fn mutual_exclusion(fx: &Fixture) {
    let key = fx.key("exclusion");
    let counter = Arc::new(std::sync::Mutex::new(0usize));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(std::sync::Mutex::new(None));
    let mut tasks = Vec::new();
    for contender in 0..CONTENDERS {
        let locker = if contender % 2 == 0 {
            &fx.locker
        } else {
            &fx.other
        };
        let (locker, key) = (locker.clone(), key.clone());
        let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
        let last_token = last_token.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..SECTIONS_EACH {
                let lease = locker
                    .acquire(&key, LONG_TTL, Wait::at_most(Duration::from_secs(120)))
                    .await
                    .expect("acquire");
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let token = lease.fencing_token();
                    let mut last = last_token.lock().unwrap();
                    assert!(
                        Some(token) > *last,
                        "token {token} entered after {last:?}: tokens out of grant order"
                    );
                    *last = Some(token);
                }
                // Read, yield to let any intruder run, then write: a lost update shows a broken lock.
                let seen = *counter.lock().unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                *counter.lock().unwrap() = seen + 1;
                assert!(
                    lease.is_within_deadline(),
                    "section outlived its lease; raise the TTL"
                );
                inside.store(false, Ordering::SeqCst);
                locker.release(lease).await.expect("release");
            }
        }));
    }
    within(
        Duration::from_secs(120) + SLACK,
        "all contenders finish",
        async {
            for t in tasks {
                t.await.expect("contender panicked");
            }
        },
    )
    .await;
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "critical sections overlapped"
    );
    assert_eq!(
        *counter.lock().unwrap(),
        CONTENDERS * SECTIONS_EACH,
        "lost updates"
    );
}

//! What more than one etcd test file checks.

use std::time::Duration;

use lock_core::{Lease, Locker};
use tokio::time::Instant;

/// The lock `lapsing` holds, never renewed, lapses on the server no earlier
/// than its deadline: `next` (another contender) waits for it, and is
/// granted at or after that deadline.
pub async fn lapses_no_earlier_than_its_deadline(next: &Locker, key: &str, lapsing: &Lease) {
    let granted_lease = next
        .acquire(key, Duration::from_secs(10), Duration::from_secs(30))
        .await
        .expect("granted after the lapse");
    let granted = Instant::now();
    assert!(
        granted >= lapsing.deadline(),
        "granted again {:?} before the lapsed holder's deadline",
        lapsing.deadline() - granted
    );
    next.release(granted_lease).await.expect("release");
}

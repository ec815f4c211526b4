//! The conformance suite against the etcd cluster of `scripts/servers.sh`.

use conformance_tests::{Fixture, Sabotage, conformance_suite, server_url};
use lock_core::Locker;
use lock_etcd::EtcdBackend;

/// Takes a lock away the way an operator would: revokes the holder's lease.
struct Revoke(EtcdBackend);

#[async_trait::async_trait]
impl Sabotage for Revoke {
    async fn remove_grant(&self, key: &str) {
        let holder = self
            .0
            .holder(key)
            .await
            .expect("read the holder")
            .expect("no holder to remove");
        self.0
            .revoke_lease(holder.lease_id)
            .await
            .expect("revoke the holder's lease");
    }
}

async fn fixture() -> Option<Fixture> {
    let url = server_url("LOCKKIT_ETCD_URL")?;
    let backend = EtcdBackend::connect(&url).await.expect("connect to etcd");
    let other = EtcdBackend::connect(&url).await.expect("connect to etcd");
    Some(Fixture::new(
        Locker::new(backend.clone()),
        Locker::new(other),
        Revoke(backend),
    ))
}

conformance_suite!(fixture);

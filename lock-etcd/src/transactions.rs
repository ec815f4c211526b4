//! The transactions the backend sends to join a lock's queue and to leave
//! it, built as the backend builds them: for measuring what the cluster
//! alone takes to apply exactly these (the lab's etcd watch ring, in
//! `lock-bench`). Locking goes through [`EtcdBackend`](crate::EtcdBackend).

use etcd_client::Txn;
use lock_core::LockKey;

use crate::queue::Queue;

/// The key of entry `slot` in `key`'s queue under `namespace` (the
/// backend's slots are its lease ids).
pub fn entry(namespace: &str, key: &LockKey, slot: i64) -> Vec<u8> {
    Queue::new(namespace, key).entry(slot)
}

/// Creates `entry` with `owner_hex` (only if it does not exist), and, when
/// the queue was not empty, reads the queue's head and newest entries, in
/// one revision. Bound to `lease`; 0 for none.
pub fn enqueue(namespace: &str, key: &LockKey, entry: &[u8], lease: i64, owner_hex: &str) -> Txn {
    Queue::new(namespace, key).enqueue(entry, lease, owner_hex)
}

/// Whether the reply to [`enqueue`] shows the entry created.
pub fn created(resp: &etcd_client::TxnResponse) -> bool {
    matches!(Queue::joined(resp), Ok(Some(_)))
}

/// Deletes `entry` only if it is still the one created at `revision` with
/// `owner_hex` (an exclusive grant's value): the release of a lease rebuilt elsewhere, and the forced
/// release. The backend releases its own grants with a plain delete (their
/// entries' keys name a lease only they use).
pub fn release(entry: &[u8], revision: i64, owner_hex: &str) -> Txn {
    Queue::release(entry, revision, owner_hex)
}

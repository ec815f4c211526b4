//! A reader's look for writers reads a long queue page by page, all at the
//! revision of its first page. Compaction of that revision between two
//! pages (on a private one-member cluster, compacted over and over while
//! readers try) makes the reader look again, never fail.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lock_core::{Mode, Wait};

const TTL: Duration = Duration::from_secs(30);
/// More than one page (64 entries) of the look for writers.
const READERS: usize = 70;
const TRIES: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_between_pages_of_the_look_for_writers_is_no_error() {
    let (cluster, _backend, locker) = common::on_private_cluster().await;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let reader = locker
            .acquire_in("long", Mode::Shared, TTL, Wait::NONE)
            .await
            .expect("a reader");
        readers.push(reader);
    }
    // Writes elsewhere move the revision on; each is compacted at once, so
    // a page read at an earlier revision finds it compacted.
    let stop = Arc::new(AtomicBool::new(false));
    let compactions = Arc::new(AtomicU64::new(0));
    let compactor = {
        let (stop, compactions) = (stop.clone(), compactions.clone());
        let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("a client of our own");
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let put = client.put("elsewhere", "x", None).await.expect("put");
                let revision = put.header().expect("a header").revision();
                client.compact(revision, None).await.expect("compact");
                compactions.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut failures = Vec::new();
    for _ in 0..TRIES {
        match locker
            .acquire_in("long", Mode::Shared, TTL, Wait::NONE)
            .await
        {
            Ok(reader) => locker.release(reader).await.expect("release"),
            Err(e) => failures.push(e.to_string()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    compactor.await.expect("the compactor panicked");
    let compacted = compactions.load(Ordering::Relaxed);
    assert!(compacted >= TRIES as u64, "only {compacted} compactions");
    assert!(
        failures.is_empty(),
        "{} of {TRIES} tries failed ({compacted} compactions): {:?}",
        failures.len(),
        failures.first()
    );
    for reader in readers {
        locker.release(reader).await.expect("release");
    }
}

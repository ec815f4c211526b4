//! A try for a read hold or a permit (on the shared cluster) is granted
//! whenever there is room, however busy the key: readers and permit
//! holders coming and going beside it (each a put and a delete in the
//! key's queue) never turn a try on a key with room into a refusal; and
//! tries racing for the last permits never exceed N, and a try refused
//! after it put its entry takes the entry back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, Locker, Mode, Wait};
use lock_etcd::EtcdBackend;

const TTL: Duration = Duration::from_secs(30);
/// Contenders coming and going beside the tries.
const CHURNERS: usize = 8;
/// Tries, each of which must be granted.
const TRIES: usize = 60;

async fn connect() -> Option<Locker> {
    let url = server_url("LOCKKIT_ETCD_URL")?;
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    Some(Locker::new(backend))
}

/// With `mode` holders coming and going on `key` (never so many that a
/// try lacks room), every try in `mode` is granted.
async fn every_try_is_granted_under_churn(locker: &Locker, key: &str, mode: Mode) {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let mut churners = Vec::new();
    for _ in 0..CHURNERS {
        // A backend of its own each, as separate processes would be.
        let url = server_url("LOCKKIT_ETCD_URL").expect("url");
        let churner = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
        let (key, stop, cycles) = (key.to_owned(), stop.clone(), cycles.clone());
        churners.push(tokio::spawn(async move {
            let wait = Wait::at_most(Duration::from_secs(30));
            while !stop.load(Ordering::Relaxed) {
                let held = churner
                    .acquire_in(&key, mode, TTL, wait)
                    .await
                    .expect("a churner is granted");
                churner.release(held).await.expect("release");
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut refusals = Vec::new();
    for _ in 0..TRIES {
        match locker.acquire_in(key, mode, TTL, Wait::NONE).await {
            Ok(held) => locker.release(held).await.expect("release"),
            Err(e @ Error::Contended { .. }) => refusals.push(e),
            Err(e) => panic!("a try under churn: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for churner in churners {
        churner.await.expect("a churner panicked");
    }
    let churned = cycles.load(Ordering::Relaxed);
    // Without churn the test shows nothing.
    assert!(churned >= TRIES as u64, "only {churned} churn cycles");
    assert!(
        refusals.is_empty(),
        "{} of {TRIES} tries refused with room free ({churned} churn cycles): {:?}",
        refusals.len(),
        refusals.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_try_reader_is_granted_while_readers_come_and_go() {
    let Some(locker) = connect().await else {
        return;
    };
    let key = unique_key("etcd-churn-readers");
    every_try_is_granted_under_churn(&locker, &key, Mode::Shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_try_for_a_permit_is_granted_while_permits_come_and_go() {
    let Some(locker) = connect().await else {
        return;
    };
    let key = unique_key("etcd-churn-permits");
    // More permits than churners and the try together: always room.
    let permits = CHURNERS as u32 + 2;
    every_try_is_granted_under_churn(&locker, &key, Mode::semaphore(permits)).await;
}

/// Contenders that only try, all at once, for a semaphore of fewer permits
/// than there are of them: at most N hold at a time, and once every one has
/// released, the queue is empty (no refused try left its entry behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tries_never_exceed_n_and_leave_no_entry() {
    let Some(url) = server_url("LOCKKIT_ETCD_URL") else {
        return;
    };
    let key = unique_key("etcd-churn-race");
    const PERMITS: u32 = 2;
    let mode = Mode::semaphore(PERMITS);
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CHURNERS {
        let contender = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
        let (key, inside, most, granted) =
            (key.clone(), inside.clone(), most.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..TRIES / 4 {
                match contender.acquire_in(&key, mode, TTL, Wait::NONE).await {
                    Ok(permit) => {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        granted.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        contender.release(permit).await.expect("release");
                    }
                    Err(Error::Contended { .. }) => {}
                    Err(e) => panic!("a racing try: {e}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a contender panicked");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders of {PERMITS} permits"
    );
    assert!(granted.load(Ordering::SeqCst) > 0, "no try was granted");
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);
}

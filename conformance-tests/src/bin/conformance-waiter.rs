//! A waiter in a process of its own, for the case that kills one in line:
//! `conformance-waiter URL KEY` connects, waits for KEY and prints
//! `waiting` once it has its place in line (the backends' waiting event),
//! then `granted` should it get the lock. The case kills it in between.

use lock_core::Wait;
use std::io::Write;
use std::time::Duration;

use lock_core::{DynBackend, Locker};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(key)) = (args.next(), args.next()) else {
        return Err("usage: conformance-waiter URL KEY".into());
    };
    let backend = connect(&url).await?;
    let mut waiting = conformance_tests::waiting_signal(&key);
    let locker = Locker::from_arc(backend);
    let wait = tokio::spawn(async move {
        locker
            .acquire(
                &key,
                Duration::from_secs(30),
                Wait::at_most(Duration::from_secs(120)),
            )
            .await
    });
    waiting.wait_for(|&w| w).await?;
    println!("waiting");
    std::io::stdout().flush()?;
    let lease = wait.await??;
    println!("granted {}", lease.fencing_token().get());
    Ok(())
}

/// The backend a URL names, by its scheme.
async fn connect(url: &str) -> lock_core::Result<std::sync::Arc<DynBackend>> {
    let scheme = url.split("://").next().unwrap_or_default();
    Ok(match scheme {
        "redlock" | "redlocks" => {
            std::sync::Arc::new(lock_redlock::RedlockBackend::connect(url).await?)
        }
        "redis+sentinel" | "rediss+sentinel" => {
            std::sync::Arc::new(lock_redis::SentinelBackend::connect(url).await?)
        }
        "etcd" | "etcds" => std::sync::Arc::new(lock_etcd::EtcdBackend::connect(url).await?),
        "postgres" | "postgresql" => {
            std::sync::Arc::new(lock_postgres::PostgresBackend::connect(url).await?)
        }
        _ => std::sync::Arc::new(lock_redis::RedisBackend::connect(url).await?),
    })
}

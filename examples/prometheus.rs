//! Serves lockkit's metrics to Prometheus while a few tasks take, hold and
//! give back two locks, so that some wait, some give up and the dashboard
//! in `docs/grafana/dashboard.json` has something to show.
//!
//! ```text
//! cargo run --features metrics --example prometheus
//! cargo run --features metrics,redis --example prometheus -- redis://127.0.0.1:6379 127.0.0.1:9000
//! curl -s http://127.0.0.1:9000/metrics | grep lockkit_
//! ```
//! Arguments: URL (default `memory://`; any scheme this build has the
//! feature of), the address to serve `/metrics` on (default
//! `127.0.0.1:9000`), and for how many seconds (default: until stopped).

use std::net::SocketAddr;
use std::time::Duration;

use lockkit::{GuardOptions, KeyLabel, LockerOptions};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Histogram buckets in seconds, so that Prometheus can take quantiles
/// (`histogram_quantile`) summed over every instance; 1 s is one of them,
/// since the dashboard's alert fires at a p99 wait of 1 s.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".to_owned());
    let listen: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9000".to_owned())
        .parse()
        .map_err(|e| format!("listen address: {e}"))?;
    let seconds: Option<u64> = match args.next() {
        None => None,
        Some(s) => Some(
            s.parse()
                .map_err(|_| format!("seconds: a number, not {s}"))?,
        ),
    };

    // The recorder first: a Locker takes its metric handles from the
    // recorder in place when it is made.
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .and_then(|b| b.install())
        .map_err(|e| format!("metrics exporter: {e}"))?;
    // Keys `example/0` and `example/1` are labelled `example`: a bounded
    // set of series, unlike a label per key.
    let locker = lockkit::connect(&url)
        .await
        .map_err(|e| e.to_string())?
        .with_options(LockerOptions::default().key_label(KeyLabel::Prefix('/')));
    // Redacted: a URL may carry a password.
    let url = lockkit::url::redact(&url);
    println!("locking over {url}; metrics at http://{listen}/metrics");

    let workers: Vec<_> = (0..4u64)
        .map(|worker| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let key = format!("example/{}", worker % 2);
                let options =
                    GuardOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(300));
                loop {
                    let hold = Duration::from_millis(some_ms(250));
                    // Busy keys time out now and then: that is part of the show.
                    let _ = locker
                        .with_lock(&key, options, |_token| tokio::time::sleep(hold))
                        .await;
                }
            })
        })
        .collect();
    match seconds {
        Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
        None => std::future::pending().await,
    }
    for w in workers {
        w.abort();
    }
    Ok(())
}

/// A hold of up to `max` ms, different each time.
fn some_ms(max: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos) % max
}

//! Serves lockkit's metrics to Prometheus (filled in below).
fn main() {}

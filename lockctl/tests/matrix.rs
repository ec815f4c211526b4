//! The README's decision matrix, read from the capabilities of every shared
//! server this build can reach.

mod common;

use lockkit::config::RequirementSet;

/// Which sets each backend meets, in `RequirementSet::ALL`'s order, as the
/// README's matrix states.
fn readme_row(backend: &str) -> [bool; 5] {
    match backend {
        "redis" => [true, true, false, false, false],
        "redlock" => [true, true, false, false, false],
        "etcd" => [true, true, true, true, false],
        "postgres" => [true, true, true, false, true],
        other => panic!("no README row for {other}"),
    }
}

#[test]
fn the_readme_matrix_matches_the_backends_capabilities() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (backend, url) in common::servers() {
        let locker = runtime.block_on(lockkit::connect(&url)).expect("connect");
        let caps = locker.capabilities();
        let row = RequirementSet::ALL.map(|set| set.requirements().shortfalls(caps).is_empty());
        assert_eq!(row, readme_row(backend), "{backend}: {caps:?}");
    }
}

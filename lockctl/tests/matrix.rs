//! The guide's decision matrix (docs/guide/choosing.md), checked against the capabilities of every
//! shared server this build can reach: the table says what the code does.

mod common;

use lockkit::config::RequirementSet;

/// The matrix as the guide states it: for each backend column, the sets it meets.
fn readme_matrix() -> Vec<(String, Vec<(RequirementSet, bool)>)> {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guide/choosing.md"
    ))
    .expect("docs/guide/choosing.md");
    let mut rows = readme
        .lines()
        .skip_while(|l| !l.starts_with("| use case | `use = `"));
    let header: Vec<String> = cells(
        rows.next()
            .expect("the decision matrix in docs/guide/choosing.md"),
    );
    let backends: Vec<String> = header[3..]
        .iter()
        .map(|h| h.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    let sets: Vec<Vec<String>> = rows
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(cells)
        .collect();
    backends
        .iter()
        .enumerate()
        .map(|(column, backend)| {
            let row = sets
                .iter()
                .map(|cells| {
                    let name = cells[1].trim_matches('`');
                    let set = RequirementSet::from_name(name)
                        .unwrap_or_else(|| panic!("unknown set `{name}` in the guide"));
                    (set, cells[3 + column] == "yes")
                })
                .collect();
            (backend.clone(), row)
        })
        .collect()
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

#[test]
fn the_readme_matrix_matches_the_backends_capabilities() {
    let matrix = readme_matrix();
    assert_eq!(matrix.len(), 5, "one column per backend with a server");
    assert!(
        matrix
            .iter()
            .all(|(_, sets)| sets.len() == RequirementSet::ALL.len()),
        "one row per set"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (backend, url) in common::servers() {
        let (_, stated) = matrix
            .iter()
            .find(|(b, _)| b == backend)
            .unwrap_or_else(|| panic!("no guide column for {backend}"));
        let locker = runtime.block_on(lockkit::connect(&url)).expect("connect");
        let caps = locker.capabilities();
        for (set, says) in stated {
            let meets = set.requirements().shortfalls(caps).is_empty();
            assert_eq!(
                meets, *says,
                "the guide says {backend} meets `{set}`: {says}; its capabilities: {caps:?}"
            );
        }
    }
}

/// The guide's example config: each of its profiles is met by a backend of
/// the kind its URL names (here the shared server of that kind).
#[test]
fn the_readme_example_profiles_are_met_by_their_backends() {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guide/choosing.md"
    ))
    .expect("docs/guide/choosing.md");
    let toml: String = readme
        .lines()
        .skip_while(|l| *l != "```toml")
        .skip(1)
        .take_while(|l| *l != "```")
        .map(|l| format!("{l}\n"))
        .collect();
    let config = lockkit::config::Config::parse(&toml, "docs/guide/choosing.md")
        .expect("the example parses");
    let servers = common::servers();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut checked = 0;
    for profile in config.profiles() {
        let scheme = profile.url.split("://").next().unwrap_or_default();
        let Some((_, url)) = servers.iter().find(|(b, _)| *b == scheme) else {
            continue;
        };
        let locker = runtime.block_on(lockkit::connect(url)).expect("connect");
        let short = profile.requirements.shortfalls(locker.capabilities());
        assert!(
            short.is_empty(),
            "the guide's profile `{}` is refused by {scheme}: {short:?}",
            profile.name
        );
        checked += 1;
    }
    if std::env::var("LOCKKIT_REQUIRE_SERVERS").as_deref() == Ok("1") {
        assert_eq!(
            checked,
            config.profiles().count(),
            "a profile was not checked"
        );
    }
}

/// The guide's waiting-order row: "yes" exactly where the backend promises
/// first come, first served (what `fifo_fair = true` requires).
#[test]
fn the_guide_waiting_row_matches_the_backends_waiting_order() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guide/choosing.md"
    ))
    .expect("docs/guide/choosing.md");
    let mut rows = guide.lines().skip_while(|l| !l.starts_with("| waiting |"));
    let header = cells(rows.next().expect("the waiting row's table in choosing.md"));
    let row = cells(rows.nth(1).expect("the waiting row"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (backend, url) in common::servers() {
        let column = header
            .iter()
            .position(|h| h.split_whitespace().next() == Some(backend))
            .unwrap_or_else(|| panic!("no waiting column for {backend}"));
        let locker = runtime.block_on(lockkit::connect(&url)).expect("connect");
        let order = &locker.capabilities().waiting_order;
        assert_eq!(
            row[column] == "yes",
            order.is_fifo(),
            "the guide says {backend} waits first come, first served: `{}`; its order: {order}",
            row[column]
        );
    }
}

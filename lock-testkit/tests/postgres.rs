//! Postgres against a real PostgreSQL server.

use std::io;

use lock_testkit::Postgres;

#[test]
fn postgres_answers_and_keeps_committed_data_across_a_crash() -> io::Result<()> {
    let pg = Postgres::start()?;
    assert_ne!(pg.port(), 5432);
    assert_ne!(pg.port(), 15432);
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/lockkit", pg.port())
    );
    assert_eq!(pg.psql("SELECT 1")?, "1");
    assert_eq!(pg.psql("SELECT current_database()")?, "lockkit");

    pg.psql("CREATE TABLE fence (token bigint); INSERT INTO fence VALUES (7)")?;
    let err = pg.psql("SELECT * FROM no_such_table").unwrap_err();
    assert!(err.to_string().contains("no_such_table"), "{err}");

    let old_pid = pg.pid().expect("running");
    pg.kill()?;
    assert!(!pg.is_running());
    assert!(pg.psql("SELECT 1").is_err());

    pg.restart()?;
    assert_ne!(pg.pid(), Some(old_pid));
    assert_eq!(pg.psql("SELECT token FROM fence")?, "7");
    Ok(())
}

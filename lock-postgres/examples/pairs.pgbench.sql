-- The statements of one uncontended try_acquire + release, one line per
-- round trip, as lock-postgres sends them (default names, 30 s TTL, the
-- default 5 s response timeout; a unit test in src/sql.rs keeps them so):
--   pgbench -n -f lock-postgres/examples/pairs.pgbench.sql -c N -j 2 -T 10 <url>
-- lock-postgres sends the token's flush (the last line) on a connection of its
-- own between the row lock and the TTL refresh, one flush for all the grants
-- waiting on it; pgbench has one connection per client, so here each pair
-- sends it after its ROLLBACK: the same round trips and WAL flushes per pair.
INSERT INTO "lockkit"."locks" (name) VALUES ('pgbench/' || :client_id) ON CONFLICT (name) DO NOTHING;
BEGIN \; SET LOCAL idle_in_transaction_session_timeout = 40000 \; SET LOCAL lock_timeout = 5000 \; SET LOCAL lockkit.held = 'on' \; SELECT set_config('lockkit.statement_timeout', current_setting('statement_timeout'), true), set_config('statement_timeout', '0', true), CASE WHEN current_setting('transaction_timeout', true) IS NOT NULL THEN set_config('transaction_timeout', '0', true) END;
WITH held AS (SELECT name FROM "lockkit"."locks" WHERE name = 'pgbench/' || :client_id FOR UPDATE NOWAIT) SELECT nextval('"lockkit"."fencing_tokens"') FROM held;
SELECT current_setting('lockkit.held', true) = 'on', set_config('idle_in_transaction_session_timeout', '30000', true), set_config('lock_timeout', '5000', true), set_config('statement_timeout', current_setting('lockkit.statement_timeout'), true);
ROLLBACK;
BEGIN \; SET LOCAL synchronous_commit = on \; SET LOCAL statement_timeout = 0 \; INSERT INTO "lockkit"."locks" (name) VALUES ('') ON CONFLICT (name) DO NOTHING \; SELECT 1 FROM "lockkit"."locks" WHERE name = '' FOR KEY SHARE \; COMMIT;

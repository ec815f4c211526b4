-- The statements of one uncontended try_acquire + release, one line per
-- round trip, as lock-postgres sends them (default names, 30 s TTL, the
-- default 5 s response timeout; a unit test in src/sql.rs keeps them so):
--   pgbench -n -f lock-postgres/examples/pairs.pgbench.sql -c N -j 2 -T 10 <url>
-- The lock statement is sent with the highest bound known flushed ($4) set so
-- that it ends the grant itself, as it does when its token is already on disk.
-- The token's WAL flush (the last line) is needed only when the sequence logs
-- ahead again, every 32 values; lock-postgres sends it on a connection of its
-- own between the row lock and a TTL refresh, one flush for all the grants
-- waiting on it. pgbench has one connection per client, so here one pair in 32,
-- drawn at random, sends it after its ROLLBACK.
BEGIN;
WITH held AS (SELECT name FROM "lockkit"."locks" WHERE name = 'pgbench/' || :client_id FOR UPDATE NOWAIT), drawn AS (SELECT nextval('"lockkit"."fencing_tokens"') AS token FROM held) SELECT x.token, x.logged, set_config('lockkit.held', 'on', true) = 'on' AND set_config('lockkit.statement_timeout', current_setting('statement_timeout'), true) IS NOT NULL AND set_config('lock_timeout', '5000', true) IS NOT NULL AND (current_setting('transaction_timeout', true) IS NULL OR set_config('transaction_timeout', '0', true) IS NOT NULL) AND set_config('idle_in_transaction_session_timeout', CASE WHEN x.logged <= 9223372036854775807 THEN '30000' ELSE '40000' END, true) IS NOT NULL AND x.logged <= 9223372036854775807 FROM (SELECT d.token, (SELECT s.last_value + s.log_cnt FROM "lockkit"."fencing_tokens" s WHERE d.token IS NOT NULL) AS logged FROM drawn d OFFSET 0) x;
ROLLBACK;
\set flush random(1, 32)
\if :flush = 1
BEGIN \; SET LOCAL synchronous_commit = on \; SET LOCAL statement_timeout = 0 \; INSERT INTO "lockkit"."locks" (name) VALUES ('') ON CONFLICT (name) DO NOTHING \; SELECT 1 FROM "lockkit"."locks" WHERE name = '' FOR KEY SHARE \; COMMIT;
\endif

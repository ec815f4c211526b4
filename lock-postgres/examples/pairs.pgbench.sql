-- The statements of one uncontended try_acquire + release, one line per
-- round trip, as lock-postgres sends them (default names, 30 s TTL):
--   pgbench -n -f lock-postgres/examples/pairs.pgbench.sql -c N -j 2 -T 10 <url>
INSERT INTO "lockkit"."locks" (name) VALUES ('pgbench/' || :client_id) ON CONFLICT (name) DO NOTHING;
BEGIN \; SET LOCAL idle_in_transaction_session_timeout = 30000 \; SET LOCAL lock_timeout = 5000 \; SET LOCAL lockkit.held = 'on';
WITH held AS (SELECT name FROM "lockkit"."locks" WHERE name = 'pgbench/' || :client_id FOR UPDATE NOWAIT) SELECT nextval('"lockkit"."fencing_tokens"') FROM held;
ROLLBACK;

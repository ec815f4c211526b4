-- lockkit's PostgreSQL schema, for the default names (schema lockkit, tables locks and locks_permits, sequence fencing_tokens).
-- `PostgresBackend::connect` creates it when missing; run it yourself when
-- migrations are managed elsewhere, and connect with `create_schema=false`.
CREATE SCHEMA IF NOT EXISTS "lockkit";
-- One row per lock name; holders lock the row, never update it. The row named ''
-- (no lock key is empty) is reserved: the fencing tokens' WAL flush locks it FOR KEY SHARE.
CREATE TABLE IF NOT EXISTS "lockkit"."locks" (name text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now());
-- Semaphores: per key, a permits row (slot -1) with the number of permits, which
-- permit holders share-lock, and one slot row per permit (slot 0 to N-1), which
-- each holder locks FOR UPDATE. Rows are locked, never updated while held.
-- Read-write locks: readers share-lock the same slot -1 row, which then says 0.
CREATE TABLE IF NOT EXISTS "lockkit"."locks_permits" (name text NOT NULL, slot int NOT NULL, permits int, PRIMARY KEY (name, slot));
-- Fencing tokens. CACHE 1 keeps values increasing across sessions.
CREATE SEQUENCE IF NOT EXISTS "lockkit"."fencing_tokens" AS bigint MINVALUE 1 CACHE 1 NO CYCLE;

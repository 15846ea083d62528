CREATE TABLE resources (
    fleet TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL COLLATE "C",
    body TEXT NOT NULL, etag TEXT NOT NULL,
    PRIMARY KEY (fleet, kind, name));
CREATE TABLE run_log (
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq BIGINT NOT NULL, entry TEXT NOT NULL,
    PRIMARY KEY (fleet, run, seq));
CREATE TABLE run_events (
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq BIGINT NOT NULL, event TEXT NOT NULL,
    PRIMARY KEY (fleet, run, seq));
CREATE TABLE intents (
    fleet TEXT NOT NULL, run TEXT NOT NULL, attempt BIGINT NOT NULL, member TEXT NOT NULL,
    target TEXT NOT NULL, operation_id TEXT, finished BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (fleet, run, attempt));
CREATE TABLE tokens (
    id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL, subject TEXT NOT NULL,
    created_at BIGINT NOT NULL, revoked BOOLEAN NOT NULL DEFAULT FALSE);
CREATE SEQUENCE etag_seq;

CREATE TABLE resources (
    fleet TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    body TEXT NOT NULL, etag TEXT NOT NULL,
    PRIMARY KEY (fleet, kind, name));
CREATE TABLE run_log (
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
    PRIMARY KEY (fleet, run, seq));
CREATE TABLE run_events (
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
    PRIMARY KEY (fleet, run, seq));
CREATE TABLE intents (
    fleet TEXT NOT NULL, run TEXT NOT NULL, attempt INTEGER NOT NULL, member TEXT NOT NULL,
    target TEXT NOT NULL, operation_id TEXT, finished INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (fleet, run, attempt));
CREATE TABLE tokens (
    id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL, subject TEXT NOT NULL,
    created_at INTEGER NOT NULL, revoked INTEGER NOT NULL DEFAULT 0);
CREATE TABLE etag_seq (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
INSERT INTO etag_seq (id, value) VALUES (1, 0);

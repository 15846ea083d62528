-- A run's events are small rows read in key order: kept in their primary key's b-tree
-- (WITHOUT ROWID) instead of a table and a separate index on the same key.
CREATE TABLE run_events_by_key (
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
    PRIMARY KEY (fleet, run, seq)) WITHOUT ROWID;
INSERT INTO run_events_by_key (fleet, run, seq, event) SELECT fleet, run, seq, event FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_by_key RENAME TO run_events;

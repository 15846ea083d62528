-- A run's checkpoint: its engine's state after input-log entry `seq` (FLEET-DESIGN.md,
-- snapshots so a restart replays a bounded tail), always compressed. Writing one deletes the
-- log's entries before `seq`; the entry at `seq` stays so the log's numbering goes on, and a
-- read takes the checkpoint and the entries after it.
CREATE TABLE run_checkpoints (
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq BIGINT NOT NULL, packed BYTEA NOT NULL,
    PRIMARY KEY (fleet, run));

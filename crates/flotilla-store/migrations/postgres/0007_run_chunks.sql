-- A run's document in parts, so that a status write stores what changed (FLEET-DESIGN.md,
-- persistence by change). A run row whose `chunks` is set holds its frame (the document with
-- every group's member list empty, cut where those lists go, as a JSON array of its pieces) in
-- `body`/`packed`; its members' statuses are in `run_chunks`, numbered 0 to `chunks` - 1 in the
-- document's order, each in the `slot`-th list, compressed like run documents when large. A
-- row whose `chunks` is NULL holds its whole document, as before.
ALTER TABLE resources ADD COLUMN chunks BIGINT;
CREATE TABLE run_chunks (
    fleet TEXT NOT NULL, run TEXT NOT NULL COLLATE "C", chunk BIGINT NOT NULL, slot BIGINT NOT NULL,
    body TEXT NOT NULL, packed BYTEA,
    PRIMARY KEY (fleet, run, chunk));

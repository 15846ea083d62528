-- A run's document in parts, so that a status write stores what changed (FLEET-DESIGN.md,
-- persistence by change). A run row whose `chunks` is set holds its frame (the document with
-- every group's member list empty, cut where those lists go, as a JSON array of its pieces) in
-- `body`/`packed`; its members' statuses are in `run_chunks`, numbered 0 to `chunks` - 1 in the
-- document's order, each in the `slot`-th list, compressed like run documents when large. A
-- row whose `chunks` is NULL holds its whole document, as before.
ALTER TABLE resources ADD COLUMN chunks INTEGER;
CREATE TABLE run_chunks (
    fleet TEXT NOT NULL, run TEXT NOT NULL, chunk INTEGER NOT NULL, slot INTEGER NOT NULL,
    body TEXT NOT NULL, packed BLOB,
    PRIMARY KEY (fleet, run, chunk));

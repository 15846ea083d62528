-- A batch's events stored together, compressed: a run waiting on 10,000 members another run
-- holds writes 10,000 MemberPending events of about 170 bytes in one batch, and as one row
-- each they were most of the database (197 of 242 MB with 100 runs over 10,000 members).
-- A pack's row is keyed by its last event's number, holds its first in `first_seq` and its
-- events in `packed` (zstd, one per line), and `{}` in `event`. Rows written before stay
-- single events (`first_seq` NULL). A replica from before packs, still running beside this one
-- on a shared database, numbers its events after the largest `seq` as before and reads a pack
-- as one event `{}`.
ALTER TABLE run_events ADD COLUMN first_seq BIGINT;
ALTER TABLE run_events ADD COLUMN packed BYTEA;

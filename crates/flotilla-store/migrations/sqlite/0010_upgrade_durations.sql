-- How long each upgrade that succeeded took, per member and upgrade type: the history a
-- forecast reads (SEMANTICS §11: each member's last five, the fleet's last fifty).
CREATE TABLE upgrade_durations (
    fleet TEXT NOT NULL, upgrade_type TEXT NOT NULL, member TEXT NOT NULL,
    finished_at INTEGER NOT NULL, run TEXT NOT NULL, seconds INTEGER NOT NULL,
    PRIMARY KEY (fleet, upgrade_type, member, finished_at, run));
CREATE INDEX upgrade_durations_by_time ON upgrade_durations (fleet, upgrade_type, finished_at);

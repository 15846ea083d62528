-- A run's head: its state, failure count and waiting gates, a few hundred bytes the server
-- writes with each status, so that /metrics and resuming a fleet read no run's whole document.
-- Runs stored before this have none until the server reads their documents once.
CREATE TABLE run_heads (
    fleet TEXT NOT NULL, run TEXT NOT NULL, head TEXT NOT NULL,
    PRIMARY KEY (fleet, run));

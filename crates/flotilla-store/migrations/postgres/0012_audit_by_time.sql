-- The audit trail is pruned by age (`--audit-retention`): its old entries are found by time,
-- whatever order replicas' clocks wrote them in, without reading the whole trail.
CREATE INDEX audit_by_time ON audit (at);

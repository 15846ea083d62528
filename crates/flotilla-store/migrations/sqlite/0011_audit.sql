-- The audit trail: every write the API accepted, with who made it (API.md, "Webhooks and audit").
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, subject TEXT NOT NULL,
    role TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL, fleet TEXT,
    status INTEGER NOT NULL, body TEXT);
CREATE INDEX audit_by_fleet ON audit (fleet, id);

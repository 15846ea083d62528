-- Webhooks and their outbox (API.md, "Webhooks and audit"): a delivery is written in the
-- transaction of the run batch that records its event, and claimed, sent and recorded by the
-- server's delivery task.
CREATE TABLE webhooks (
    name TEXT PRIMARY KEY, url TEXT NOT NULL, secret TEXT NOT NULL, fleets TEXT NOT NULL,
    events TEXT NOT NULL, format TEXT NOT NULL, system_data TEXT NOT NULL, etag TEXT NOT NULL);
CREATE TABLE webhook_deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, webhook TEXT NOT NULL, event_id TEXT NOT NULL,
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, event_type TEXT NOT NULL,
    event TEXT NOT NULL, created_at INTEGER NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER, claimed_until INTEGER,
    last_attempt_at INTEGER, last_status INTEGER, last_error TEXT, delivered_at INTEGER,
    UNIQUE (webhook, event_id));
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook, id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'Pending';

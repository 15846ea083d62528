-- Webhooks and their outbox (API.md, "Webhooks and audit"): a delivery is written in the
-- transaction of the run batch that records its event, and claimed, sent and recorded by the
-- server's delivery task.
CREATE TABLE webhooks (
    name TEXT PRIMARY KEY, url TEXT NOT NULL, secret TEXT NOT NULL, fleets TEXT NOT NULL,
    events TEXT NOT NULL, format TEXT NOT NULL, system_data TEXT NOT NULL, etag TEXT NOT NULL);
CREATE TABLE webhook_deliveries (
    id BIGSERIAL PRIMARY KEY, webhook TEXT NOT NULL, event_id TEXT NOT NULL,
    fleet TEXT NOT NULL, run TEXT NOT NULL, seq BIGINT NOT NULL, event_type TEXT NOT NULL,
    event TEXT NOT NULL, created_at BIGINT NOT NULL, state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0, next_attempt_at BIGINT, claimed_until BIGINT,
    last_attempt_at BIGINT, last_status BIGINT, last_error TEXT, delivered_at BIGINT,
    UNIQUE (webhook, event_id));
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook, id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'Pending';

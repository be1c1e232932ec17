-- Webhook delivery state of each outbox row.
ALTER TABLE outbox ADD COLUMN webhook_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN webhook_next_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN webhook_done_at INTEGER;

-- A process without a webhook deletes the outbox rows no worker has claimed only while no worker
-- has been at work within the hour: one with a row in flight or put off (`outbox_webhook_due`),
-- or one that delivered a row (this index). A worker that sends one row after another to a slow
-- receiver, an hour behind, has no row in flight between a batch's last answer and its next
-- claim.
CREATE INDEX outbox_delivered_at ON outbox (webhook_done_at) WHERE webhook_done_at IS NOT NULL;

-- Housekeeping deletes idempotency records and outbox rows by age, a batch at a time, through
-- these indexes: without them every batch scanned its whole table on the one writer connection,
-- holding up the lease renewals queued behind it.
CREATE INDEX idempotency_by_age ON idempotency (created_at);
CREATE INDEX outbox_by_age ON outbox (created_at);
-- The webhook worker's rows due for delivery (it polled the whole outbox on the writer, and a
-- backlog of rows waiting out their backoff while a receiver is down would be walked too).
CREATE INDEX outbox_webhook_due ON outbox (webhook_next_at, id) WHERE webhook_done_at IS NULL;

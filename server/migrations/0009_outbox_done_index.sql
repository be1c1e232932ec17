-- Housekeeping deletes outbox rows whose webhook was delivered, after an hour, through this
-- index: through `outbox_by_age` a delete walked every row older than that, delivered or not, and
-- while a webhook receiver is down that is every row of the last 24 h, on the one writer
-- connection (holding up the lease renewals queued behind it), at every run.
CREATE INDEX outbox_done_by_age ON outbox (created_at) WHERE webhook_done_at IS NOT NULL;

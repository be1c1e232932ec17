-- A process without a webhook deletes, after an hour, the outbox rows no webhook worker has
-- claimed, through this index; a row a worker claimed (another process's, whose receiver may be
-- down) it keeps past that worker's 24 h. Through `outbox_by_age` each of its runs walked every
-- claimed row of the last day, on the one writer connection.
CREATE INDEX outbox_unclaimed_by_age ON outbox (created_at) WHERE webhook_next_at = 0;

-- Housekeeping deletes kicks past their retention a batch at a time through this index (each run
-- scanned the whole table, a day and an hour of kicks, on the one writer connection).
CREATE INDEX kicks_by_age ON kicks (created_at);
-- Unused: every read of `rooms` is by its key. It only cost a write on every lease renewal.
DROP INDEX rooms_lease;

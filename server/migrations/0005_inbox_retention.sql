-- Offline inboxes are kept for a bounded time, and written only for participants seen recently
-- (both lists grew without bound: every committed item wrote a row for every participant who
-- had ever joined the room and was not connected). Rows from before this migration count as
-- made now.
ALTER TABLE inbox ADD COLUMN created_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE participants ADD COLUMN seen_at INTEGER NOT NULL DEFAULT 0;
UPDATE inbox SET created_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER);
UPDATE participants SET seen_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER);
CREATE INDEX inbox_by_age ON inbox (created_at);
CREATE INDEX participants_by_age ON participants (seen_at);

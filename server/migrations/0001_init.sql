-- hostlease-server schema, version 1. Migrations are forward-only: never edit an applied one.

-- The authoritative record, one row per room. `epoch` and `seq` are never reset.
CREATE TABLE rooms (
    room          TEXT PRIMARY KEY NOT NULL,
    host          TEXT,
    session       TEXT,
    epoch         INTEGER NOT NULL DEFAULT 0,
    seq           INTEGER NOT NULL DEFAULT 0,
    -- Store clock, ms since the Unix epoch.
    lease_expires INTEGER NOT NULL DEFAULT 0,
    lease_ms      INTEGER NOT NULL DEFAULT 0,
    -- The current signed assignment, as JSON.
    current       TEXT,
    closed        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX rooms_lease ON rooms (lease_expires) WHERE host IS NOT NULL;

-- The room log: assignments and events on the room's single seq.
CREATE TABLE log (
    room TEXT NOT NULL,
    seq  INTEGER NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (room, seq)
);

-- Written in the same transaction as every commit; tailed by every process for fan-out and
-- worked off once for durable notification.
CREATE TABLE outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- 'assignment' (dedup key room:epoch) or 'event' (dedup key room:seq).
    kind        TEXT NOT NULL,
    dedup_key   TEXT NOT NULL,
    room        TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    item        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    notified_at INTEGER,
    UNIQUE (kind, dedup_key)
);
CREATE INDEX outbox_pending ON outbox (id) WHERE notified_at IS NULL;

CREATE TABLE idempotency (
    room         TEXT NOT NULL,
    sub          TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (room, sub, key)
);

-- Participants that ever joined a room (for the offline inbox).
CREATE TABLE participants (
    room        TEXT NOT NULL,
    participant TEXT NOT NULL,
    PRIMARY KEY (room, participant)
);

CREATE TABLE inbox (
    cursor      INTEGER PRIMARY KEY AUTOINCREMENT,
    room        TEXT NOT NULL,
    participant TEXT NOT NULL,
    item        TEXT NOT NULL
);
CREATE INDEX inbox_by_participant ON inbox (room, participant, cursor);

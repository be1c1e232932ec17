-- Admin kicks, kept so that every process on the database closes the kicked member's sessions
-- (each process applies the rows after the newest it saw when it started). Kept an hour.
CREATE TABLE kicks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    room TEXT NOT NULL,
    participant TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

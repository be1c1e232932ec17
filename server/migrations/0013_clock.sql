-- The store clock's offset for the machine's current boot (`src/clock.rs`): the wall clock minus
-- the boot clock, in ns, when the first store opened the file after the machine started. Every
-- process on the file reads it, so that they all time leases on one clock, which a step of the
-- wall clock does not move. One row; a new boot replaces it.
CREATE TABLE clock (
    boot TEXT PRIMARY KEY NOT NULL,
    offset_ns INTEGER NOT NULL
);

-- Per-room lease TTL override (NULL: the server default). Applies from the next grant or renewal.
ALTER TABLE rooms ADD COLUMN ttl_ms INTEGER;

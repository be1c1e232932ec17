-- A forced grant (an admin's reassign, a kick) takes the role from a holder whose lease may
-- still run and who may not know yet (its connection cut): until that lease has run out (store
-- clock, ms) the new holder's lease is not confirmed, by whichever process it is connected to.
-- 0: no fence.
ALTER TABLE rooms ADD COLUMN fenced_until INTEGER NOT NULL DEFAULT 0;

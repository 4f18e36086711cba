-- Re-stamp at commit only when the commit lags the write by more than half a second (was 50 ms).
-- The polling recipe overlaps by a second (and the Date header rounds down to a second), so half a
-- second is still caught, while ordinary transactions on a busy server keep the updated_at their
-- response showed.
CREATE OR REPLACE FUNCTION customers_restamp_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE customers
     SET updated_at = clock_timestamp()
   WHERE id = NEW.id
     AND updated_at < clock_timestamp() - interval '500 milliseconds';
  RETURN NULL;
END;
$$;

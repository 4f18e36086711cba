-- updated_at on customers is owned by the database, so every writer (API, CLI, back office, raw SQL)
-- gets the same rules:
--  * a real change stamps clock_timestamp(); a no-op write keeps the previous value;
--  * a transaction that commits noticeably later than it wrote is re-stamped at commit time by a
--    deferred constraint trigger, so an `updated_since` poller can never be overtaken by a late commit
--    (plus the one-second overlap documented in the README for the last few milliseconds).
CREATE OR REPLACE FUNCTION customers_stamp_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF pg_trigger_depth() > 1 THEN
    RETURN NEW; -- the commit-time re-stamp below sets updated_at itself
  END IF;
  IF (to_jsonb(NEW) - 'updated_at') = (to_jsonb(OLD) - 'updated_at') THEN
    NEW.updated_at := OLD.updated_at;
  ELSE
    NEW.updated_at := clock_timestamp();
  END IF;
  RETURN NEW;
END;
$$;
--> statement-breakpoint
CREATE TRIGGER customers_stamp_updated_at
  BEFORE UPDATE ON customers
  FOR EACH ROW EXECUTE FUNCTION customers_stamp_updated_at();
--> statement-breakpoint
CREATE OR REPLACE FUNCTION customers_restamp_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE customers
     SET updated_at = clock_timestamp()
   WHERE id = NEW.id
     AND updated_at < clock_timestamp() - interval '50 milliseconds';
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE CONSTRAINT TRIGGER customers_restamp_at_commit_on_insert
  AFTER INSERT ON customers
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (pg_trigger_depth() = 0)
  EXECUTE FUNCTION customers_restamp_at_commit();
--> statement-breakpoint
CREATE CONSTRAINT TRIGGER customers_restamp_at_commit_on_update
  AFTER UPDATE ON customers
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (pg_trigger_depth() = 0 AND OLD.updated_at IS DISTINCT FROM NEW.updated_at)
  EXECUTE FUNCTION customers_restamp_at_commit();

-- Exact `updated_since` polling (docs/decisions.md, "Exact polling"). The spec's pattern, the next
-- poll passing `updated_since` = the time the previous one started, must never miss a committed
-- change, however late its transaction commits after the write. The stamp alone cannot promise it:
-- a change stamped before a poll starts and committed after the poll read is invisible to that poll
-- and older than the next one's `updated_since`.
--
--  * Every transaction that changes customers of an organisation takes two transaction-level
--    advisory locks before it stamps updated_at, held until it ends: (1668641652 = 'cust',
--    hashtext(org_id)) shared, which says "a writer of this organisation is in flight", and
--    (hashtext(org_id), its transaction id) exclusive, a key of its own. Shared locks do not conflict
--    and nobody else asks for the second key, so writers never wait for each other on them.
--  * Every poll (the first page of a customers or entities list walk, with or without updated_since)
--    first runs customers_changes_drained(org) as one statement of its own transaction:
--      - no writer in flight (it gets the first key exclusive, without waiting): it reads the clock and
--        ends, releasing the key; a writer starting meanwhile waits those microseconds and stamps later;
--      - otherwise it reads the clock (drained_at), finds the organisation's writers in pg_locks by
--        their own keys and waits for each to end (a shared request on its key).
--    The page is then read by a new statement, whose snapshot shows all their changes. A writer
--    missing from pg_locks took its key after the scan and stamps after drained_at. So a change the
--    poll cannot see has updated_at > drained_at >= the poll's start. A waiting poll never holds up
--    writers.
--  * The stamp is the next millisecond boundary after the clock (updated_at has millisecond
--    precision), so it is strictly later than the clock reading that made it; rounding to the nearest
--    millisecond could put it up to half a millisecond earlier, back onto a poll's start time.
--  * Each wait is bounded by the session's lock_timeout (55P03), the whole by statement_timeout.
-- The rules of 0001 and 0008 stay: a write that changes nothing keeps updated_at (and takes no lock);
-- every change moves it forward by at least a millisecond; the commit-time re-stamp (0005, 0008) is
-- unchanged and runs in a transaction that already holds both keys.
CREATE OR REPLACE FUNCTION customers_stamp_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  org_key int;
BEGIN
  IF TG_OP = 'UPDATE' AND pg_trigger_depth() = 1 THEN
    NEW.updated_at := OLD.updated_at;
    IF NEW IS NOT DISTINCT FROM OLD THEN
      RETURN NEW;
    END IF;
  END IF;
  -- Taken again by the transaction's later writes: granted from its own lock table, no wait.
  org_key := hashtext(NEW.org_id::text);
  PERFORM pg_advisory_xact_lock_shared(1668641652, org_key);
  PERFORM pg_advisory_xact_lock(org_key, (pg_current_xact_id()::text::bigint % 2147483647)::int);
  IF TG_OP = 'UPDATE' AND pg_trigger_depth() > 1 THEN
    RETURN NEW; -- the commit-time re-stamp sets updated_at itself
  END IF;
  -- Read once both keys are held: a poll that saw neither read its clock before this.
  NEW.updated_at := date_trunc('milliseconds', clock_timestamp()) + interval '1 millisecond';
  IF TG_OP = 'UPDATE' THEN
    NEW.updated_at := greatest(NEW.updated_at, OLD.updated_at + interval '1 millisecond');
  END IF;
  RETURN NEW;
END;
$$;
--> statement-breakpoint
-- An insert is stamped like an update (the column default was read before the keys were taken).
CREATE TRIGGER customers_stamp_updated_at_on_insert
  BEFORE INSERT ON customers
  FOR EACH ROW EXECUTE FUNCTION customers_stamp_updated_at();
--> statement-breakpoint
-- Returns a time such that every change of `org`'s customers stamped at or before it has committed or
-- rolled back by the time this returns (see above). Run it as a statement of its own, outside any
-- explicit transaction (the locks it takes are held until its transaction ends), and read the list in
-- a new statement.
CREATE OR REPLACE FUNCTION customers_changes_drained(org uuid) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
  org_key constant int := hashtext(org::text);
  drained_at timestamptz;
  writer oid;
BEGIN
  IF pg_try_advisory_xact_lock(1668641652, org_key) THEN
    RETURN clock_timestamp();
  END IF;
  drained_at := clock_timestamp();
  FOR writer IN
    SELECT objid FROM pg_locks
     WHERE locktype = 'advisory' AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = org_key::oid
  LOOP
    PERFORM pg_advisory_xact_lock_shared(org_key, writer::int);
  END LOOP;
  RETURN drained_at;
END;
$$;

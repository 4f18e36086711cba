ALTER TABLE "audit_log" DROP CONSTRAINT "audit_log_org_id_organisations_id_fk";
--> statement-breakpoint
ALTER TABLE "outbox_events" DROP CONSTRAINT "outbox_events_org_id_organisations_id_fk";
--> statement-breakpoint
-- The cost of the side records every change writes (measured in bench/README.md), with the same rules:
--  * audit_log and outbox_events keep org_id without a foreign key (dropped above). Each key check
--    was a query per row at the end of its statement, and it key-share locked the organisation's row
--    from every concurrent change. Each row is written in the transaction of a change to a record of
--    that organisation, so the organisation exists; and an audit trail should outlive what it records
--    rather than cascade away with it.
--  * Their large values (audit before/after, the event's payload) are compressed with lz4 where the
--    server supports it, several times cheaper than pglz; a server built without lz4 keeps pglz.
--  * Events no longer have a deferred trigger each (outbox_events_sync_customer_updated_at, 0004):
--    the commit-time re-stamp of a record, rare, brings its events of the transaction in line itself.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
    ALTER TABLE audit_log ALTER COLUMN before SET COMPRESSION lz4, ALTER COLUMN after SET COMPRESSION lz4;
    ALTER TABLE outbox_events ALTER COLUMN payload SET COMPRESSION lz4;
  END IF;
END;
$$;
--> statement-breakpoint
-- Every change of a record gets a later updated_at than the one before, even within one millisecond or
-- across a clock step back: the events a transaction wrote for a record are then exactly those of the
-- record showing the updated_at this transaction stamped or a later one (see the re-stamp below).
CREATE OR REPLACE FUNCTION customers_stamp_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF pg_trigger_depth() > 1 THEN
    RETURN NEW; -- the commit-time re-stamp sets updated_at itself
  END IF;
  NEW.updated_at := OLD.updated_at;
  IF NEW IS DISTINCT FROM OLD THEN
    NEW.updated_at := greatest(clock_timestamp(), OLD.updated_at + interval '1 millisecond');
  END IF;
  RETURN NEW;
END;
$$;
--> statement-breakpoint
-- At commit, as before (0007): a row whose write is recent needs nothing. A row whose commit lags its
-- write by half a second is re-stamped, and so are the events this transaction wrote for it: an event
-- shows the record as GET shows it once committed. They are found among the organisation's events of
-- the last hour (by outbox_events_org_idx; created_at is the application's clock) as this record's
-- events showing the updated_at this transaction stamped or a later one: stamps only grow, and the
-- record has been locked since, so no other transaction's event shows one.
CREATE OR REPLACE FUNCTION customers_restamp_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  iso constant text := 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'; -- how toISOString writes it, as payloads show it
  written text;
  committed text;
BEGIN
  IF NEW.updated_at >= clock_timestamp() - interval '500 milliseconds' THEN
    RETURN NULL;
  END IF;
  UPDATE customers
     SET updated_at = clock_timestamp()
   WHERE id = NEW.id
     AND updated_at < clock_timestamp() - interval '500 milliseconds'
  RETURNING to_char(updated_at AT TIME ZONE 'UTC', iso) INTO committed;
  IF committed IS NULL THEN
    RETURN NULL;
  END IF;
  written := to_char(NEW.updated_at AT TIME ZONE 'UTC', iso);
  UPDATE outbox_events event
     SET payload = replace(event.payload, '"updated_at":"' || shown.updated_at || '"', '"updated_at":"' || committed || '"')
    FROM (SELECT id, payload::jsonb #>> '{data,customer,updated_at}' AS updated_at
            FROM outbox_events
           WHERE org_id = NEW.org_id
             AND created_at >= clock_timestamp() - interval '1 hour'
             AND customer_id = NEW.id) AS shown
   WHERE event.id = shown.id
     AND shown.updated_at >= written
     AND shown.updated_at < committed;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
DROP TRIGGER outbox_events_sync_customer_updated_at ON outbox_events;
--> statement-breakpoint
DROP FUNCTION outbox_events_sync_customer_updated_at();

-- The rules of migrations 0001, 0004 and 0005, unchanged, at a lower cost on the common path (every
-- customer or entity change pays these three functions; see bench/README.md).

-- A write that changes nothing but updated_at keeps the previous value: the two rows are compared
-- column by column instead of as two to_jsonb documents.
CREATE OR REPLACE FUNCTION customers_stamp_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF pg_trigger_depth() > 1 THEN
    RETURN NEW; -- the commit-time re-stamp sets updated_at itself
  END IF;
  NEW.updated_at := OLD.updated_at;
  IF NEW IS DISTINCT FROM OLD THEN
    NEW.updated_at := clock_timestamp();
  END IF;
  RETURN NEW;
END;
$$;
--> statement-breakpoint
-- At commit, a row whose write is recent needs no re-stamp, and no query to find that out: an UPDATE
-- never moves updated_at backwards (the function above), so the row now is at least as recent as the
-- row this event wrote. Only a commit lagging its write by half a second runs the UPDATE.
CREATE OR REPLACE FUNCTION customers_restamp_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.updated_at >= clock_timestamp() - interval '500 milliseconds' THEN
    RETURN NULL;
  END IF;
  UPDATE customers
     SET updated_at = clock_timestamp()
   WHERE id = NEW.id
     AND updated_at < clock_timestamp() - interval '500 milliseconds';
  RETURN NULL;
END;
$$;
--> statement-breakpoint
-- An event whose payload already shows the committed updated_at (the common case) is recognised as
-- text; the payload is parsed as JSON only when it has to be rewritten.
CREATE OR REPLACE FUNCTION outbox_events_sync_customer_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  sent text;
  committed text;
BEGIN
  SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
    INTO committed
    FROM customers
   WHERE id = NEW.customer_id;
  IF committed IS NULL OR position('"updated_at":"' || committed || '"' IN NEW.payload) > 0 THEN
    RETURN NULL;
  END IF;
  sent := NEW.payload::jsonb #>> '{data,customer,updated_at}';
  IF sent IS NULL OR committed = sent THEN
    RETURN NULL;
  END IF;
  UPDATE outbox_events
     SET payload = replace(payload, '"updated_at":"' || sent || '"', '"updated_at":"' || committed || '"')
   WHERE id = NEW.id;
  RETURN NULL;
END;
$$;

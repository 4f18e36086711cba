-- An event's `data.customer` must equal what GET shows for the record once the change is committed.
-- The payload is built before the commit, and a slow commit has customers.updated_at re-stamped at
-- commit (0001), so the payload's updated_at could be earlier than the committed one. This deferred
-- trigger runs at commit after that re-stamp (deferred triggers fire in the order their events were
-- queued: the customer's UPDATE precedes the event's INSERT) and rewrites the payload's updated_at.
CREATE OR REPLACE FUNCTION outbox_events_sync_customer_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  sent text;
  committed text;
BEGIN
  sent := NEW.payload::jsonb #>> '{data,customer,updated_at}';
  IF sent IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
    INTO committed
    FROM customers
   WHERE id = NEW.customer_id;
  IF committed IS NULL OR committed = sent THEN
    RETURN NULL;
  END IF;
  UPDATE outbox_events
     SET payload = replace(payload, '"updated_at":"' || sent || '"', '"updated_at":"' || committed || '"')
   WHERE id = NEW.id;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE CONSTRAINT TRIGGER outbox_events_sync_customer_updated_at
  AFTER INSERT ON outbox_events
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.customer_id IS NOT NULL)
  EXECUTE FUNCTION outbox_events_sync_customer_updated_at();

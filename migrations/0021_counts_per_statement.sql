-- Inserted records are counted once per statement, not once per row: a multi-row INSERT (a bulk
-- import's batch) adds one counter row per key it touches instead of one upsert per record. The
-- counters stay exact in the inserting transaction, as before; updates and deletes keep the row trigger.
CREATE OR REPLACE FUNCTION customer_counts_apply_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  backend_slot constant int := pg_backend_pid() % 16;
BEGIN
  INSERT INTO customer_counts AS counts (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, slot, records)
  SELECT inserted.org_id, inserted.kind, inserted.type, inserted.kyc_status, inserted.aml_status, inserted.review_status,
         inserted.edd_required, backend_slot, count(*)
    FROM inserted
   GROUP BY 1, 2, 3, 4, 5, 6, 7
   ORDER BY 1, 2, 3, 4, 5, 6, 7
  ON CONFLICT (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, slot)
  DO UPDATE SET records = counts.records + EXCLUDED.records;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
DROP TRIGGER customer_counts_on_insert ON customers;
--> statement-breakpoint
CREATE TRIGGER customer_counts_on_insert AFTER INSERT ON customers
  REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION customer_counts_apply_inserted();

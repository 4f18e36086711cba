-- Lists at a million records (docs/decisions.md, "Lists at a million records"). Every list page walks
-- (created_at, id) within an organisation and kind, and every filter gets an index that yields its rows
-- in that order: a page then reads its own rows and not the organisation's. Each index ends with the
-- filtered columns, so a page's ids are chosen by an index-only scan and only the page is read from
-- the table. `updated_since` uses the two partial indexes of rows changed more than a second after
-- their creation. Counts come from customer_counts, kept by triggers in each change's transaction.
CREATE TABLE "customer_counts" (
	"org_id" uuid NOT NULL,
	"kind" text NOT NULL,
	"type" text NOT NULL,
	"kyc_status" text NOT NULL,
	"aml_status" text NOT NULL,
	"slot" integer NOT NULL,
	"records" bigint NOT NULL,
	CONSTRAINT "customer_counts_org_id_kind_type_kyc_status_aml_status_slot_pk" PRIMARY KEY("org_id","kind","type","kyc_status","aml_status","slot")
);
--> statement-breakpoint
ALTER TABLE "customer_counts" ADD CONSTRAINT "customer_counts_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
DROP INDEX "customers_updated_idx";--> statement-breakpoint
DROP INDEX "customers_list_idx";--> statement-breakpoint
CREATE INDEX "customers_list_idx" ON "customers" USING btree ("org_id","kind","created_at","id","updated_at","kyc_status","aml_status","type");--> statement-breakpoint
CREATE INDEX "customers_status_list_idx" ON "customers" USING btree ("org_id","kind","kyc_status","created_at","id","updated_at","aml_status","type");--> statement-breakpoint
CREATE INDEX "customers_aml_list_idx" ON "customers" USING btree ("org_id","kind","aml_status","created_at","id","updated_at","kyc_status","type");--> statement-breakpoint
CREATE INDEX "customers_entity_type_list_idx" ON "customers" USING btree ("org_id","type","created_at","id","updated_at","kyc_status","aml_status") WHERE kind = 'entity';--> statement-breakpoint
CREATE INDEX "customers_late_list_idx" ON "customers" USING btree ("org_id","kind","created_at","id","updated_at","kyc_status","aml_status","type") WHERE (updated_at - created_at) > interval '1 second';--> statement-breakpoint
CREATE INDEX "customers_late_updated_idx" ON "customers" USING btree ("org_id","kind","updated_at","created_at","id","kyc_status","aml_status","type") WHERE (updated_at - created_at) > interval '1 second';--> statement-breakpoint
-- The planner's estimate of how many rows are "late" (the partial indexes' predicate): without it, an
-- expression gets a fixed guess of a third of the table.
CREATE STATISTICS "customers_change_lag_stats" ON ((updated_at - created_at)) FROM "customers";--> statement-breakpoint
-- Applies one record's move between counters: -1 where it was, +1 where it is. Both rows in one
-- statement, in a fixed order (the VALUES are sorted), so two writers sharing a slot never take the
-- same two counter rows in opposite orders. The slot is the backend's: a backend runs one transaction
-- at a time, so writers on other backends mostly touch other rows.
CREATE OR REPLACE FUNCTION customer_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  backend_slot constant int := pg_backend_pid() % 16;
BEGIN
  INSERT INTO customer_counts AS counts (org_id, kind, type, kyc_status, aml_status, slot, records)
  SELECT change.org_id, change.kind, change.type, change.kyc_status, change.aml_status, backend_slot, sum(change.delta)
    FROM (
      SELECT OLD.org_id, OLD.kind, OLD.type, OLD.kyc_status, OLD.aml_status, -1 AS delta WHERE TG_OP IN ('UPDATE', 'DELETE')
      UNION ALL
      SELECT NEW.org_id, NEW.kind, NEW.type, NEW.kyc_status, NEW.aml_status, 1 WHERE TG_OP IN ('UPDATE', 'INSERT')
    ) AS change (org_id, kind, type, kyc_status, aml_status, delta)
   GROUP BY 1, 2, 3, 4, 5
   ORDER BY 1, 2, 3, 4, 5
  ON CONFLICT (org_id, kind, type, kyc_status, aml_status, slot)
  DO UPDATE SET records = counts.records + EXCLUDED.records;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE TRIGGER customer_counts_on_insert AFTER INSERT ON customers
  FOR EACH ROW EXECUTE FUNCTION customer_counts_apply();
--> statement-breakpoint
CREATE TRIGGER customer_counts_on_delete AFTER DELETE ON customers
  FOR EACH ROW EXECUTE FUNCTION customer_counts_apply();
--> statement-breakpoint
-- Only a change of a counted column reaches the function: most updates (a phone, a re-stamp) add no write.
CREATE TRIGGER customer_counts_on_update AFTER UPDATE OF org_id, kind, type, kyc_status, aml_status ON customers
  FOR EACH ROW
  WHEN ((OLD.org_id, OLD.kind, OLD.type, OLD.kyc_status, OLD.aml_status) IS DISTINCT FROM (NEW.org_id, NEW.kind, NEW.type, NEW.kyc_status, NEW.aml_status))
  EXECUTE FUNCTION customer_counts_apply();
--> statement-breakpoint
-- The records already there, counted once (slot 0); SHARE lock: no write may slip between the count and
-- the triggers taking over.
LOCK TABLE customers IN SHARE MODE;--> statement-breakpoint
INSERT INTO customer_counts (org_id, kind, type, kyc_status, aml_status, slot, records)
SELECT org_id, kind, type, kyc_status, aml_status, 0, count(*) FROM customers GROUP BY 1, 2, 3, 4, 5;--> statement-breakpoint
ANALYZE customers;

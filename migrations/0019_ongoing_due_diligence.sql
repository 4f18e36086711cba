CREATE TABLE "customer_reviews" (
	"org_id" uuid NOT NULL,
	"id" uuid DEFAULT gen_random_uuid() NOT NULL,
	"customer_id" uuid NOT NULL,
	"outcome" text NOT NULL,
	"notes" text,
	"reviewer" text NOT NULL,
	"reasons" text[] NOT NULL,
	"status_before" text NOT NULL,
	"next_review_at" timestamp (3) with time zone,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	CONSTRAINT "customer_reviews_pkey" PRIMARY KEY("org_id","id")
);
--> statement-breakpoint
ALTER TABLE "customer_counts" ADD COLUMN "review_status" text DEFAULT 'NOT_SCHEDULED' NOT NULL;--> statement-breakpoint
ALTER TABLE "customer_counts" ADD COLUMN "edd_required" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "customer_counts" DROP CONSTRAINT "customer_counts_org_id_kind_type_kyc_status_aml_status_slot_pk";--> statement-breakpoint
ALTER TABLE "customer_counts" ADD CONSTRAINT "customer_counts_pkey" PRIMARY KEY("org_id","kind","type","kyc_status","aml_status","review_status","edd_required","slot");--> statement-breakpoint
ALTER TABLE "customers" ADD COLUMN "review_status" text DEFAULT 'NOT_SCHEDULED' NOT NULL;--> statement-breakpoint
ALTER TABLE "customers" ADD COLUMN "next_review_at" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "customers" ADD COLUMN "review_completed_at" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "customers" ADD COLUMN "review_reasons" text[] DEFAULT '{}'::text[] NOT NULL;--> statement-breakpoint
ALTER TABLE "customers" ADD COLUMN "edd_required" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "customers" ADD COLUMN "edd_reasons" text[] DEFAULT '{}'::text[] NOT NULL;--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD COLUMN "generation" integer DEFAULT 1 NOT NULL;--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD COLUMN "redate_scheduled" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD COLUMN "redate_total" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD COLUMN "redate_checked" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD COLUMN "redate_moved" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD COLUMN "redate_finished_at" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "customer_reviews" ADD CONSTRAINT "customer_reviews_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "customer_reviews" ADD CONSTRAINT "customer_reviews_customer_fk" FOREIGN KEY ("org_id","customer_id") REFERENCES "public"."customers"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "customer_reviews_history_idx" ON "customer_reviews" USING btree ("org_id","customer_id","created_at","id");--> statement-breakpoint
CREATE INDEX "customer_reviews_created_idx" ON "customer_reviews" USING btree ("org_id","created_at");--> statement-breakpoint
CREATE INDEX "customers_review_list_idx" ON "customers" USING btree ("org_id","kind","review_status","created_at","id","next_review_at","updated_at","kyc_status","aml_status","type");--> statement-breakpoint
CREATE INDEX "customers_review_due_idx" ON "customers" USING btree ("org_id","kind","next_review_at","created_at","id","review_status") WHERE next_review_at IS NOT NULL;--> statement-breakpoint
CREATE INDEX "customers_review_scheduled_idx" ON "customers" USING btree ("org_id","next_review_at") WHERE review_status = 'SCHEDULED';--> statement-breakpoint
CREATE INDEX "customers_review_pending_idx" ON "customers" USING btree ("org_id","next_review_at") WHERE review_status = 'DUE';--> statement-breakpoint
CREATE INDEX "customers_edd_list_idx" ON "customers" USING btree ("org_id","kind","created_at","id","updated_at","kyc_status","aml_status","type") WHERE edd_required;--> statement-breakpoint
-- Records verified before this migration: their first review is scheduled from their verification,
-- at the interval of their rating under their organisation's policy (or the defaults), as
-- review-model.ts schedules a record verified now; the review sweep makes those already past due DUE.
-- EDD reasons follow review-model.ts's rules and order.
UPDATE customers AS c
   SET edd_reasons = derived.reasons,
       edd_required = cardinality(derived.reasons) > 0
  FROM (
    SELECT c2.org_id, c2.id,
           array_remove(ARRAY[
             CASE WHEN c2.risk_rating = 'HIGH' THEN 'HIGH_RISK' END,
             CASE WHEN c2.aml_pep THEN 'PEP' END,
             CASE WHEN c2.aml_sanctions THEN 'SANCTIONS' END,
             CASE WHEN c2.aml_terrorism THEN 'TERRORISM' END,
             CASE WHEN c2.risk_answers->>'complexStructure' = 'true' THEN 'COMPLEX_STRUCTURE' END,
             CASE WHEN c2.risk_answers->>'unexplainedWealth' = 'true' THEN 'UNEXPLAINED_WEALTH' END,
             CASE WHEN c2.risk_answers->>'falseIdentityIndicators' = 'true' THEN 'FALSE_IDENTITY_INDICATORS' END,
             CASE WHEN (c2.kyc_status = 'VERIFIED' AND c2.verified_country = ANY (coalesce(p.high_risk_jurisdictions, ARRAY['IRN','MMR','PRK'])))
                    OR c2.country_of_formation = ANY (coalesce(p.high_risk_jurisdictions, ARRAY['IRN','MMR','PRK']))
                  THEN 'HIGH_RISK_JURISDICTION' END
           ], NULL) AS reasons
      FROM customers c2
      LEFT JOIN due_diligence_policies p ON p.org_id = c2.org_id
  ) AS derived
 WHERE c.org_id = derived.org_id AND c.id = derived.id AND cardinality(derived.reasons) > 0;--> statement-breakpoint
UPDATE customers AS c
   SET review_status = 'SCHEDULED',
       next_review_at = c.kyc_completed_at + make_interval(months => CASE
         WHEN c.edd_required AND coalesce(p.edd_uses_high_interval, true) THEN coalesce(p.review_months_high, 12)
         WHEN c.risk_rating = 'HIGH' THEN coalesce(p.review_months_high, 12)
         WHEN c.risk_rating = 'MEDIUM' THEN coalesce(p.review_months_medium, 24)
         ELSE coalesce(p.review_months_low, 36) END)
  FROM customers c2
  LEFT JOIN due_diligence_policies p ON p.org_id = c2.org_id
 WHERE c.org_id = c2.org_id AND c.id = c2.id AND c.kyc_status = 'VERIFIED' AND c.kyc_completed_at IS NOT NULL;--> statement-breakpoint
-- The counters gain the review status and the EDD flag (list filters review_status and edd_required).
CREATE OR REPLACE FUNCTION customer_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  backend_slot constant int := pg_backend_pid() % 16;
BEGIN
  INSERT INTO customer_counts AS counts (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, slot, records)
  SELECT change.org_id, change.kind, change.type, change.kyc_status, change.aml_status, change.review_status, change.edd_required,
         backend_slot, sum(change.delta)
    FROM (
      SELECT OLD.org_id, OLD.kind, OLD.type, OLD.kyc_status, OLD.aml_status, OLD.review_status, OLD.edd_required, -1 AS delta
       WHERE TG_OP IN ('UPDATE', 'DELETE')
      UNION ALL
      SELECT NEW.org_id, NEW.kind, NEW.type, NEW.kyc_status, NEW.aml_status, NEW.review_status, NEW.edd_required, 1
       WHERE TG_OP IN ('UPDATE', 'INSERT')
    ) AS change (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, delta)
   GROUP BY 1, 2, 3, 4, 5, 6, 7
   ORDER BY 1, 2, 3, 4, 5, 6, 7
  ON CONFLICT (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, slot)
  DO UPDATE SET records = counts.records + EXCLUDED.records;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
DROP TRIGGER customer_counts_on_update ON customers;--> statement-breakpoint
CREATE TRIGGER customer_counts_on_update AFTER UPDATE OF org_id, kind, type, kyc_status, aml_status, review_status, edd_required ON customers
  FOR EACH ROW
  WHEN ((OLD.org_id, OLD.kind, OLD.type, OLD.kyc_status, OLD.aml_status, OLD.review_status, OLD.edd_required)
        IS DISTINCT FROM (NEW.org_id, NEW.kind, NEW.type, NEW.kyc_status, NEW.aml_status, NEW.review_status, NEW.edd_required))
  EXECUTE FUNCTION customer_counts_apply();
--> statement-breakpoint
-- Counted again from the records (their review columns are new); SHARE lock: no write may slip between.
LOCK TABLE customers IN SHARE MODE;--> statement-breakpoint
DELETE FROM customer_counts;--> statement-breakpoint
INSERT INTO customer_counts (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, slot, records)
SELECT org_id, kind, type, kyc_status, aml_status, review_status, edd_required, 0, count(*) FROM customers GROUP BY 1, 2, 3, 4, 5, 6, 7;--> statement-breakpoint
ANALYZE customers;
-- Tenant keys: org_id first (docs/decisions.md, "Tenant keys: org_id first (issue 34, item 6)";
-- DESIGN §9). Every table holding an organisation's data gets a primary key starting with org_id,
-- (org_id, id); every foreign key between such tables becomes composite, (org_id, x) → parent
-- (org_id, id), with its ON DELETE as before. The database then refuses a reference to another
-- organisation's row, and the schema can be distributed by org_id (Citus) as it stands. Lookups made
-- before the organisation is known (an API key's hash, a verification link's token) go through two
-- directory tables keyed by the hash or token, backfilled here. The claims of the email sender and the
-- webhook worker get (org_id, next_attempt_at) indexes, and the retention purges (org_id, created_at).
-- Rows that already reference another organisation's row (none can be made through the API) make
-- this migration fail on the ADD CONSTRAINT that finds them, rather than be kept or dropped silently.
CREATE TABLE "api_key_hashes" (
	"key_hash" text PRIMARY KEY NOT NULL,
	"org_id" uuid NOT NULL,
	"api_key_id" uuid NOT NULL
);
--> statement-breakpoint
CREATE TABLE "verification_link_tokens" (
	"token" text PRIMARY KEY NOT NULL,
	"org_id" uuid NOT NULL,
	"verification_id" uuid NOT NULL
);
--> statement-breakpoint
-- The single-column foreign keys go first: the primary keys they lean on are replaced below.
ALTER TABLE "api_key_usage" DROP CONSTRAINT "api_key_usage_api_key_id_api_keys_id_fk";--> statement-breakpoint
ALTER TABLE "beneficial_owners" DROP CONSTRAINT "beneficial_owners_entity_id_customers_id_fk";--> statement-breakpoint
ALTER TABLE "beneficial_owners" DROP CONSTRAINT "beneficial_owners_customer_id_customers_id_fk";--> statement-breakpoint
ALTER TABLE "credit_ledger" DROP CONSTRAINT "credit_ledger_verification_id_verifications_id_fk";--> statement-breakpoint
ALTER TABLE "emails" DROP CONSTRAINT "emails_verification_id_verifications_id_fk";--> statement-breakpoint
ALTER TABLE "group_parties" DROP CONSTRAINT "group_parties_group_id_groups_id_fk";--> statement-breakpoint
ALTER TABLE "group_parties" DROP CONSTRAINT "group_parties_customer_id_customers_id_fk";--> statement-breakpoint
ALTER TABLE "groups" DROP CONSTRAINT "groups_template_id_group_templates_id_fk";--> statement-breakpoint
ALTER TABLE "idempotency_keys" DROP CONSTRAINT "idempotency_keys_api_key_id_api_keys_id_fk";--> statement-breakpoint
ALTER TABLE "verifications" DROP CONSTRAINT "verifications_customer_id_customers_id_fk";--> statement-breakpoint
ALTER TABLE "verifications" DROP CONSTRAINT "verifications_beneficial_owner_id_beneficial_owners_id_fk";--> statement-breakpoint
ALTER TABLE "webhook_attempts" DROP CONSTRAINT "webhook_attempts_delivery_id_webhook_deliveries_id_fk";--> statement-breakpoint
ALTER TABLE "webhook_deliveries" DROP CONSTRAINT "webhook_deliveries_event_id_outbox_events_id_fk";--> statement-breakpoint
ALTER TABLE "webhook_deliveries" DROP CONSTRAINT "webhook_deliveries_endpoint_id_webhook_endpoints_id_fk";--> statement-breakpoint
-- Global unique keys replaced by the directories; indexes now served by a primary key's prefix
-- (api_keys_org_idx, webhook_endpoints_org_idx) or rebuilt with org_id first below.
DROP INDEX "api_keys_key_hash_key";--> statement-breakpoint
DROP INDEX "verifications_link_token_key";--> statement-breakpoint
DROP INDEX "api_keys_org_idx";--> statement-breakpoint
DROP INDEX "webhook_endpoints_org_idx";--> statement-breakpoint
DROP INDEX "idempotency_keys_created_idx";--> statement-breakpoint
DROP INDEX "emails_due_idx";--> statement-breakpoint
DROP INDEX "group_parties_group_idx";--> statement-breakpoint
DROP INDEX "webhook_attempts_delivery_idx";--> statement-breakpoint
DROP INDEX "webhook_deliveries_due_idx";--> statement-breakpoint
ALTER TABLE "api_key_usage" DROP CONSTRAINT "api_key_usage_pkey";--> statement-breakpoint
ALTER TABLE "api_keys" DROP CONSTRAINT "api_keys_pkey";--> statement-breakpoint
ALTER TABLE "audit_log" DROP CONSTRAINT "audit_log_pkey";--> statement-breakpoint
ALTER TABLE "beneficial_owners" DROP CONSTRAINT "beneficial_owners_pkey";--> statement-breakpoint
ALTER TABLE "credit_ledger" DROP CONSTRAINT "credit_ledger_pkey";--> statement-breakpoint
ALTER TABLE "customers" DROP CONSTRAINT "customers_pkey";--> statement-breakpoint
ALTER TABLE "emails" DROP CONSTRAINT "emails_pkey";--> statement-breakpoint
ALTER TABLE "group_parties" DROP CONSTRAINT "group_parties_pkey";--> statement-breakpoint
ALTER TABLE "group_templates" DROP CONSTRAINT "group_templates_pkey";--> statement-breakpoint
ALTER TABLE "groups" DROP CONSTRAINT "groups_pkey";--> statement-breakpoint
ALTER TABLE "idempotency_keys" DROP CONSTRAINT "idempotency_keys_api_key_id_key_pk";--> statement-breakpoint
ALTER TABLE "outbox_events" DROP CONSTRAINT "outbox_events_pkey";--> statement-breakpoint
ALTER TABLE "verifications" DROP CONSTRAINT "verifications_pkey";--> statement-breakpoint
ALTER TABLE "webhook_attempts" DROP CONSTRAINT "webhook_attempts_pkey";--> statement-breakpoint
ALTER TABLE "webhook_deliveries" DROP CONSTRAINT "webhook_deliveries_pkey";--> statement-breakpoint
ALTER TABLE "webhook_endpoints" DROP CONSTRAINT "webhook_endpoints_pkey";--> statement-breakpoint
ALTER TABLE "api_key_usage" ADD CONSTRAINT "api_key_usage_pkey" PRIMARY KEY("org_id","api_key_id");--> statement-breakpoint
ALTER TABLE "api_keys" ADD CONSTRAINT "api_keys_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "audit_log" ADD CONSTRAINT "audit_log_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "beneficial_owners" ADD CONSTRAINT "beneficial_owners_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "credit_ledger" ADD CONSTRAINT "credit_ledger_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "customers" ADD CONSTRAINT "customers_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "emails" ADD CONSTRAINT "emails_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "group_parties" ADD CONSTRAINT "group_parties_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "group_templates" ADD CONSTRAINT "group_templates_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "groups" ADD CONSTRAINT "groups_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "idempotency_keys" ADD CONSTRAINT "idempotency_keys_pkey" PRIMARY KEY("org_id","api_key_id","key");--> statement-breakpoint
ALTER TABLE "outbox_events" ADD CONSTRAINT "outbox_events_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "verifications" ADD CONSTRAINT "verifications_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "webhook_attempts" ADD CONSTRAINT "webhook_attempts_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "webhook_deliveries" ADD CONSTRAINT "webhook_deliveries_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD CONSTRAINT "webhook_endpoints_pkey" PRIMARY KEY("org_id","id");--> statement-breakpoint
-- The directories, from the rows they point at (the dropped unique indexes kept hashes and tokens unique).
INSERT INTO "api_key_hashes" ("key_hash", "org_id", "api_key_id") SELECT "key_hash", "org_id", "id" FROM "api_keys";--> statement-breakpoint
INSERT INTO "verification_link_tokens" ("token", "org_id", "verification_id")
SELECT "link_token", "org_id", "id" FROM "verifications" WHERE "link_token" IS NOT NULL;--> statement-breakpoint
ALTER TABLE "api_key_hashes" ADD CONSTRAINT "api_key_hashes_api_key_fk" FOREIGN KEY ("org_id","api_key_id") REFERENCES "public"."api_keys"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "verification_link_tokens" ADD CONSTRAINT "verification_link_tokens_verification_fk" FOREIGN KEY ("org_id","verification_id") REFERENCES "public"."verifications"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "api_key_usage" ADD CONSTRAINT "api_key_usage_api_key_fk" FOREIGN KEY ("org_id","api_key_id") REFERENCES "public"."api_keys"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "beneficial_owners" ADD CONSTRAINT "beneficial_owners_entity_fk" FOREIGN KEY ("org_id","entity_id") REFERENCES "public"."customers"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "beneficial_owners" ADD CONSTRAINT "beneficial_owners_customer_fk" FOREIGN KEY ("org_id","customer_id") REFERENCES "public"."customers"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "credit_ledger" ADD CONSTRAINT "credit_ledger_verification_fk" FOREIGN KEY ("org_id","verification_id") REFERENCES "public"."verifications"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "emails" ADD CONSTRAINT "emails_verification_fk" FOREIGN KEY ("org_id","verification_id") REFERENCES "public"."verifications"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "group_parties" ADD CONSTRAINT "group_parties_group_fk" FOREIGN KEY ("org_id","group_id") REFERENCES "public"."groups"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "group_parties" ADD CONSTRAINT "group_parties_customer_fk" FOREIGN KEY ("org_id","customer_id") REFERENCES "public"."customers"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "groups" ADD CONSTRAINT "groups_template_fk" FOREIGN KEY ("org_id","template_id") REFERENCES "public"."group_templates"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "idempotency_keys" ADD CONSTRAINT "idempotency_keys_api_key_fk" FOREIGN KEY ("org_id","api_key_id") REFERENCES "public"."api_keys"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "verifications" ADD CONSTRAINT "verifications_customer_fk" FOREIGN KEY ("org_id","customer_id") REFERENCES "public"."customers"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "verifications" ADD CONSTRAINT "verifications_beneficial_owner_fk" FOREIGN KEY ("org_id","beneficial_owner_id") REFERENCES "public"."beneficial_owners"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhook_attempts" ADD CONSTRAINT "webhook_attempts_delivery_fk" FOREIGN KEY ("org_id","delivery_id") REFERENCES "public"."webhook_deliveries"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhook_deliveries" ADD CONSTRAINT "webhook_deliveries_event_fk" FOREIGN KEY ("org_id","event_id") REFERENCES "public"."outbox_events"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhook_deliveries" ADD CONSTRAINT "webhook_deliveries_endpoint_fk" FOREIGN KEY ("org_id","endpoint_id") REFERENCES "public"."webhook_endpoints"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
-- Batched retention purges walk each organisation's oldest rows.
CREATE INDEX "audit_log_org_created_idx" ON "audit_log" USING btree ("org_id","created_at");--> statement-breakpoint
CREATE INDEX "idempotency_keys_org_created_idx" ON "idempotency_keys" USING btree ("org_id","created_at");--> statement-breakpoint
CREATE INDEX "webhook_attempts_org_created_idx" ON "webhook_attempts" USING btree ("org_id","created_at");--> statement-breakpoint
CREATE INDEX "webhook_deliveries_org_created_idx" ON "webhook_deliveries" USING btree ("org_id","created_at");--> statement-breakpoint
-- The claims: the organisations with work (one probe each, skipping from one org_id to the next), then
-- each organisation's due rows in order.
CREATE INDEX "emails_due_idx" ON "emails" USING btree ("org_id","next_attempt_at") WHERE status = 'queued';--> statement-breakpoint
CREATE INDEX "webhook_deliveries_due_idx" ON "webhook_deliveries" USING btree ("org_id","next_attempt_at") WHERE status = 'pending';--> statement-breakpoint
CREATE INDEX "group_parties_group_idx" ON "group_parties" USING btree ("org_id","group_id","position");--> statement-breakpoint
CREATE INDEX "webhook_attempts_delivery_idx" ON "webhook_attempts" USING btree ("org_id","delivery_id");--> statement-breakpoint
-- The commit-time re-stamp of 0008, unchanged but for org_id in every statement: it reaches the record
-- and its events within their organisation (one shard under Citus).
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
   WHERE org_id = NEW.org_id
     AND id = NEW.id
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
   WHERE event.org_id = NEW.org_id
     AND event.id = shown.id
     AND shown.updated_at >= written
     AND shown.updated_at < committed;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
-- The lease of 0006, unchanged but for the key's row being (org_id, api_key_id).
CREATE OR REPLACE FUNCTION api_key_usage_lease(
  p_key uuid,
  p_org uuid,
  p_burst_window bigint,
  p_burst_limit integer,
  p_burst_wanted integer,
  p_day_window integer,
  p_daily_limit integer,
  p_day_wanted integer
) RETURNS TABLE (burst_window bigint, burst_total integer, burst_granted integer, day_window integer, day_total integer, day_granted integer)
LANGUAGE plpgsql AS $$
DECLARE
  usage api_key_usage%ROWTYPE;
  burst_used integer;
  day_used integer;
  burst_free integer;
  day_free integer;
  admitted boolean;
BEGIN
  INSERT INTO api_key_usage AS u (api_key_id, org_id, burst_window, burst_count, day_window, day_count)
  VALUES (p_key, p_org, p_burst_window, 0, p_day_window, 0)
  ON CONFLICT (org_id, api_key_id) DO NOTHING;
  SELECT * INTO usage FROM api_key_usage AS u WHERE u.org_id = p_org AND u.api_key_id = p_key FOR UPDATE;

  -- A statement that started a moment before another one committed may read an older clock: it
  -- counts in the newer window rather than resetting it.
  burst_window := greatest(usage.burst_window, p_burst_window);
  day_window := greatest(usage.day_window, p_day_window);
  burst_used := CASE WHEN usage.burst_window = burst_window THEN usage.burst_count ELSE 0 END;
  day_used := CASE WHEN usage.day_window = day_window THEN usage.day_count ELSE 0 END;
  burst_free := greatest(0, p_burst_limit - burst_used);
  day_free := greatest(0, p_daily_limit - day_used);
  admitted := (p_burst_wanted = 0 OR burst_free > 0) AND (p_day_wanted = 0 OR day_free > 0);
  burst_granted := CASE WHEN admitted THEN least(p_burst_wanted, burst_free) ELSE 0 END;
  day_granted := CASE WHEN admitted THEN least(p_day_wanted, day_free) ELSE 0 END;
  burst_total := burst_used + burst_granted;
  day_total := day_used + day_granted;

  UPDATE api_key_usage AS u
     SET burst_window = api_key_usage_lease.burst_window,
         burst_count = burst_total,
         day_window = api_key_usage_lease.day_window,
         day_count = day_total
   WHERE u.org_id = p_org AND u.api_key_id = p_key;
  RETURN NEXT;
END;
$$;
--> statement-breakpoint
ANALYZE "api_key_hashes";--> statement-breakpoint
ANALYZE "verification_link_tokens";

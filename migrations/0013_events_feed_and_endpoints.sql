CREATE TABLE "event_feed_heads" (
	"org_id" uuid PRIMARY KEY NOT NULL,
	"last_position" bigint DEFAULT 0 NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "outbox_events" ADD COLUMN "position" bigint;--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD COLUMN "description" text;--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD COLUMN "previous_secret" text;--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD COLUMN "previous_secret_expires_at" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD COLUMN "failing_since" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "event_feed_heads" ADD CONSTRAINT "event_feed_heads_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "outbox_events_feed_idx" ON "outbox_events" USING btree ("org_id","position") WHERE position IS NOT NULL;--> statement-breakpoint
CREATE INDEX "outbox_events_customer_feed_idx" ON "outbox_events" USING btree ("org_id","customer_id","position") WHERE customer_id IS NOT NULL AND position IS NOT NULL;--> statement-breakpoint
CREATE INDEX "outbox_events_unsealed_idx" ON "outbox_events" USING btree ("org_id","created_at","id") WHERE position IS NULL;--> statement-breakpoint
CREATE INDEX "webhook_deliveries_endpoint_idx" ON "webhook_deliveries" USING btree ("org_id","endpoint_id","created_at","id");
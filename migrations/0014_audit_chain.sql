CREATE TABLE "audit_chain_heads" (
	"org_id" uuid PRIMARY KEY NOT NULL,
	"last_sequence" bigint DEFAULT 0 NOT NULL,
	"last_hash" text,
	"updated_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "audit_checkpoints" (
	"org_id" uuid NOT NULL,
	"sequence" bigint NOT NULL,
	"hash" text NOT NULL,
	"signature" text NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	CONSTRAINT "audit_checkpoints_pkey" PRIMARY KEY("org_id","sequence")
);
--> statement-breakpoint
DROP INDEX "audit_log_subject_idx";--> statement-breakpoint
ALTER TABLE "audit_log" ADD COLUMN "idempotency_key" text;--> statement-breakpoint
ALTER TABLE "audit_log" ADD COLUMN "sequence" bigint;--> statement-breakpoint
ALTER TABLE "audit_log" ADD COLUMN "hash" text;--> statement-breakpoint
ALTER TABLE "audit_chain_heads" ADD CONSTRAINT "audit_chain_heads_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "audit_checkpoints" ADD CONSTRAINT "audit_checkpoints_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "audit_log_chain_idx" ON "audit_log" USING btree ("org_id","sequence") WHERE sequence IS NOT NULL;--> statement-breakpoint
CREATE INDEX "audit_log_unsealed_idx" ON "audit_log" USING btree ("org_id","created_at","id") WHERE sequence IS NULL;--> statement-breakpoint
CREATE INDEX "audit_log_subject_idx" ON "audit_log" USING btree ("org_id","subject_id","sequence");
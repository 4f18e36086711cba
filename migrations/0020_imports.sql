-- Bulk imports (issue 46): imports and their rows (purged IMPORT_RETENTION_DAYS after the import finished), and the
-- webhook endpoints' opt-out of the events an import's rows cause.
CREATE TABLE "import_rows" (
	"org_id" uuid NOT NULL,
	"import_id" uuid NOT NULL,
	"row_number" integer NOT NULL,
	"data" jsonb NOT NULL,
	"outcome" text,
	"customer_id" uuid,
	"error" jsonb,
	CONSTRAINT "import_rows_pkey" PRIMARY KEY("org_id","import_id","row_number")
);
--> statement-breakpoint
CREATE TABLE "imports" (
	"org_id" uuid NOT NULL,
	"id" uuid DEFAULT gen_random_uuid() NOT NULL,
	"kind" text NOT NULL,
	"format" text NOT NULL,
	"status" text DEFAULT 'QUEUED' NOT NULL,
	"dry_run" boolean NOT NULL,
	"file_name" text,
	"file_bytes" bigint NOT NULL,
	"file_sha256" text NOT NULL,
	"columns" text[] NOT NULL,
	"rows_total" integer NOT NULL,
	"rows_done" integer DEFAULT 0 NOT NULL,
	"created_count" integer DEFAULT 0 NOT NULL,
	"updated_count" integer DEFAULT 0 NOT NULL,
	"unchanged_count" integer DEFAULT 0 NOT NULL,
	"failed_count" integer DEFAULT 0 NOT NULL,
	"error" jsonb,
	"actor_type" text NOT NULL,
	"actor_id" text,
	"request_id" text,
	"idempotency_key" text,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	"started_at" timestamp (3) with time zone,
	"finished_at" timestamp (3) with time zone,
	"cancel_requested_at" timestamp (3) with time zone,
	CONSTRAINT "imports_pkey" PRIMARY KEY("org_id","id")
);
--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD COLUMN "skip_import_rows" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "import_rows" ADD CONSTRAINT "import_rows_import_fk" FOREIGN KEY ("org_id","import_id") REFERENCES "public"."imports"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "imports" ADD CONSTRAINT "imports_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "imports_list_idx" ON "imports" USING btree ("org_id","created_at","id");--> statement-breakpoint
CREATE INDEX "imports_finished_idx" ON "imports" USING btree ("org_id","finished_at") WHERE finished_at IS NOT NULL;--> statement-breakpoint
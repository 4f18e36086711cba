CREATE TABLE "document_chunks" (
	"org_id" uuid NOT NULL,
	"document_id" uuid NOT NULL,
	"seq" integer NOT NULL,
	"data" "bytea" NOT NULL,
	CONSTRAINT "document_chunks_pkey" PRIMARY KEY("org_id","document_id","seq")
);
--> statement-breakpoint
CREATE TABLE "document_request_tokens" (
	"token_hash" text PRIMARY KEY NOT NULL,
	"org_id" uuid NOT NULL,
	"document_request_id" uuid NOT NULL
);
--> statement-breakpoint
CREATE TABLE "document_requests" (
	"id" uuid DEFAULT gen_random_uuid() NOT NULL,
	"org_id" uuid NOT NULL,
	"entity_id" uuid NOT NULL,
	"types" text[] NOT NULL,
	"message" text,
	"due_at" timestamp (3) with time zone NOT NULL,
	"status" text DEFAULT 'OPEN' NOT NULL,
	"payer" text NOT NULL,
	"cost" integer DEFAULT 0 NOT NULL,
	"recipient_email" text NOT NULL,
	"api_key_id" uuid,
	"fulfilled_at" timestamp (3) with time zone,
	"expired_at" timestamp (3) with time zone,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	CONSTRAINT "document_requests_pkey" PRIMARY KEY("org_id","id")
);
--> statement-breakpoint
CREATE TABLE "entity_documents" (
	"id" uuid DEFAULT gen_random_uuid() NOT NULL,
	"org_id" uuid NOT NULL,
	"entity_id" uuid NOT NULL,
	"type" text NOT NULL,
	"description" text,
	"file_name" text,
	"media_type" text NOT NULL,
	"size_bytes" integer NOT NULL,
	"sha256" text NOT NULL,
	"uploaded_by" text NOT NULL,
	"api_key_id" uuid,
	"document_request_id" uuid,
	"storage" text DEFAULT 'postgres' NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	CONSTRAINT "entity_documents_pkey" PRIMARY KEY("org_id","id")
);
--> statement-breakpoint
ALTER TABLE "credit_ledger" ADD COLUMN "document_id" uuid;--> statement-breakpoint
ALTER TABLE "credit_ledger" ADD COLUMN "document_request_id" uuid;--> statement-breakpoint
ALTER TABLE "document_chunks" ADD CONSTRAINT "document_chunks_document_fk" FOREIGN KEY ("org_id","document_id") REFERENCES "public"."entity_documents"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "document_request_tokens" ADD CONSTRAINT "document_request_tokens_request_fk" FOREIGN KEY ("org_id","document_request_id") REFERENCES "public"."document_requests"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "document_requests" ADD CONSTRAINT "document_requests_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "document_requests" ADD CONSTRAINT "document_requests_entity_fk" FOREIGN KEY ("org_id","entity_id") REFERENCES "public"."customers"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "entity_documents" ADD CONSTRAINT "entity_documents_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "entity_documents" ADD CONSTRAINT "entity_documents_entity_fk" FOREIGN KEY ("org_id","entity_id") REFERENCES "public"."customers"("org_id","id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "entity_documents" ADD CONSTRAINT "entity_documents_request_fk" FOREIGN KEY ("org_id","document_request_id") REFERENCES "public"."document_requests"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "document_requests_entity_idx" ON "document_requests" USING btree ("org_id","entity_id","created_at","id");--> statement-breakpoint
CREATE INDEX "document_requests_open_due_idx" ON "document_requests" USING btree ("org_id","due_at") WHERE status = 'OPEN';--> statement-breakpoint
CREATE INDEX "entity_documents_entity_idx" ON "entity_documents" USING btree ("org_id","entity_id","created_at","id");--> statement-breakpoint
ALTER TABLE "credit_ledger" ADD CONSTRAINT "credit_ledger_document_fk" FOREIGN KEY ("org_id","document_id") REFERENCES "public"."entity_documents"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "credit_ledger" ADD CONSTRAINT "credit_ledger_document_request_fk" FOREIGN KEY ("org_id","document_request_id") REFERENCES "public"."document_requests"("org_id","id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
-- Documents are PDF, PNG or JPEG: already compressed, so TOAST stores the chunks out of line without trying to compress them.
ALTER TABLE "document_chunks" ALTER COLUMN "data" SET STORAGE EXTERNAL;
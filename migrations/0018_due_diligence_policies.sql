CREATE TABLE "due_diligence_policies" (
	"org_id" uuid NOT NULL,
	"review_months_low" integer NOT NULL,
	"review_months_medium" integer NOT NULL,
	"review_months_high" integer NOT NULL,
	"edd_uses_high_interval" boolean NOT NULL,
	"high_risk_jurisdictions" text[] NOT NULL,
	"overdue_after_days" integer NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	CONSTRAINT "due_diligence_policies_pkey" PRIMARY KEY("org_id")
);
--> statement-breakpoint
ALTER TABLE "due_diligence_policies" ADD CONSTRAINT "due_diligence_policies_org_id_organisations_id_fk" FOREIGN KEY ("org_id") REFERENCES "public"."organisations"("id") ON DELETE cascade ON UPDATE no action;
-- The database keeps no usable link token (docs/decisions.md, "Security and operations findings (issue 43)").
-- Verification links: the directory keeps each token's SHA-256 (hex), as document_request_tokens does.
ALTER TABLE "verification_link_tokens" RENAME COLUMN "token" TO "token_hash";--> statement-breakpoint
UPDATE "verification_link_tokens" SET "token_hash" = encode(sha256(convert_to("token_hash", 'UTF8')), 'hex');--> statement-breakpoint
ALTER TABLE "verifications" DROP COLUMN "link_token";--> statement-breakpoint
-- Emails written before sealing: a delivered one no longer needs its link, so the token goes from its
-- body and link. One still queued keeps it until sent; the sender then seals the row.
UPDATE "emails"
   SET "link" = NULL,
       "body" = regexp_replace("body", '(/(verify|pay|documents)/)[A-Za-z0-9_-]{43}', '\1[link removed]', 'g')
 WHERE "status" <> 'queued' AND "link" IS NOT NULL AND "body" NOT LIKE 'sealed:v1:%';--> statement-breakpoint
-- Stored replies written before sealing: a replay within the window returns the link removed, never a usable one.
UPDATE "idempotency_keys"
   SET "response_body" = regexp_replace("response_body", '(/(verify|pay|documents)/)[A-Za-z0-9_-]{43}', '\1[link removed]', 'g')
 WHERE "response_body" ~ '/(verify|pay|documents)/[A-Za-z0-9_-]{43}' AND "response_body" NOT LIKE 'sealed:v1:%';

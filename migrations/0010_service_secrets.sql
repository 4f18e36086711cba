-- Secrets of the service itself (docs/decisions.md, "Signed list cursors"). Global, not an
-- organisation's data, so DESIGN §9's org_id rule does not apply; one row per purpose, never grows.
CREATE TABLE "service_secrets" (
	"name" text PRIMARY KEY NOT NULL,
	"value" text NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL
);
--> statement-breakpoint
-- The HMAC-SHA256 key of list cursors: 32 bytes, hex. gen_random_uuid() draws from
-- pg_strong_random (the server's CSPRNG) with no extension to install; two of them give 244 random
-- bits, hashed to a full-width key. Created here, once per database, so every instance shares it
-- with no configuration.
INSERT INTO "service_secrets" ("name", "value")
VALUES ('list_cursor_hmac', encode(sha256((gen_random_uuid()::text || gen_random_uuid()::text)::bytea), 'hex'));

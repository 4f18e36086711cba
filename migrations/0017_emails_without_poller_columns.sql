-- The emails are sent by pg-boss jobs (src/shared/job-runner.ts): the poller's due time and its index are unused.
DROP INDEX "emails_due_idx";--> statement-breakpoint
ALTER TABLE "emails" DROP COLUMN "next_attempt_at";
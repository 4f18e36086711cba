import type { DataAccess } from '../../db/client.js';
import type { EmailRow, EmailsRepository } from './emails.repository.js';

function toEmailDto(row: EmailRow) {
  return {
    id: row.id,
    recipient: row.recipient,
    subject: row.subject,
    link: row.link,
    status: row.status,
    attempts: row.attempts,
    last_error: row.lastError,
    sent_at: row.sentAt?.toISOString() ?? null,
    created_at: row.createdAt.toISOString(),
  };
}

export function createEmailsService(deps: { database: DataAccess; emails: EmailsRepository }) {
  const repository = deps.emails;
  return {
    async list(orgId: string, filters: { to?: string } = {}) {
      return (await repository.list(orgId, filters, deps.database.db)).map((row) => toEmailDto(repository.openRow(row)));
    },
  };
}

import type { DataAccess, Executor } from '../../db/client.js';
import type { DocumentRequestRow } from '../../db/schema.js';
import { AppError } from '../../shared/app-error.js';
import type { Clock } from '../../shared/clock.js';
import { LINK_TOKEN_PATTERN, linkTokenHash, newLinkToken } from '../../shared/link-tokens.js';
import { createOrgRotation, dueOrganisations } from '../../shared/fair-claims.js';
import { Issues } from '../../shared/issues.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import type { RequestContext } from '../../shared/request-context.js';
import { DOCUMENT_PRICE, DOCUMENT_TYPES, type DocumentTypeCode } from '../documents/document-types.js';
import type { DocumentsService } from '../documents/documents.service.js';
import type { SpooledFile } from '../documents/multipart-intake.js';
import type { EmailsRepository } from '../emails/emails.repository.js';
import type { CreditCharger, PayerResolver } from '../organisations/credits.service.js';
import type { OrganisationsRepository } from '../organisations/organisations.repository.js';
import type { OutboxRepository } from '../../shared/outbox.js';
import type { DocumentRequestsRepository, RequestDocument } from './document-requests.repository.js';
import { DEFAULT_DUE_DAYS, MAX_DUE_DAYS, type CreateDocumentRequestBody, type DocumentRequestDto } from './document-requests.schemas.js';

const DAY_MS = 86_400_000;
const TYPE_NAMES: ReadonlyMap<string, string> = new Map(DOCUMENT_TYPES.map((type) => [type.code, type.name]));
/** The actor of what happens because time passed (expiry). */
const SYSTEM: Actor = { type: 'system', id: null };

const DOCUMENT_REQUEST_EVENT = 'document_request.updated';

/** The name of a document type as the contact reads it. */
function documentTypeName(code: string): string {
  return TYPE_NAMES.get(code) ?? code;
}

/** Why a file for `field` is refused: the request does not ask for that type, or has received it already. */
export function notOutstandingMessage(requested: readonly string[], received: ReadonlySet<string>, field: string): string {
  if (!requested.includes(field)) {
    return TYPE_NAMES.has(field)
      ? `This request does not ask for a document of type "${documentTypeName(field)}".`
      : 'A file was sent for a document type this request does not ask for.';
  }
  return received.has(field) ? `A document of type "${documentTypeName(field)}" has been received already.` : '';
}

/** Why files beyond a request's allowance are refused. */
export function allowanceMessage(maxDocuments: number, received: number): string {
  return `This request takes at most ${maxDocuments} documents; ${received} have been received.`;
}

function toDocumentRequestDto(row: DocumentRequestRow, documents: readonly RequestDocument[]): DocumentRequestDto {
  const own = documents.filter((document) => document.documentRequestId === row.id);
  const received = new Set(own.map((document) => document.type));
  return {
    id: row.id,
    object: 'document_request',
    entity_id: row.entityId,
    types: [...row.types],
    message: row.message,
    due_at: row.dueAt.toISOString(),
    status: row.status,
    payer: row.payer,
    received_types: row.types.filter((type) => received.has(type)),
    document_ids: own.map((document) => document.id),
    fulfilled_at: row.fulfilledAt?.toISOString() ?? null,
    expired_at: row.expiredAt?.toISOString() ?? null,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

/** What the upload page shows of an OPEN request. */
export type UploadPageView = {
  orgId: string;
  request: DocumentRequestRow;
  organisationName: string;
  entityName: string;
  /** Per requested type, in the order requested: its name and whether a document has arrived. */
  items: Array<{ code: string; name: string; received: boolean }>;
  documentCount: number;
};

export function createDocumentRequestsService(deps: {
  database: DataAccess;
  publicBaseUrl: string;
  clock: Clock;
  requests: DocumentRequestsRepository;
  customers: CustomersRepository;
  organisations: OrganisationsRepository;
  emails: EmailsRepository;
  documents: Pick<DocumentsService, 'store'>;
  audit: AuditWriter;
  outbox: OutboxRepository;
  charge: CreditCharger;
  payerFor: PayerResolver;
}) {
  const { database, clock, requests, customers, organisations, emails, documents, audit, outbox, charge, payerFor } = deps;
  const rotation = createOrgRotation();

  async function announce(dto: DocumentRequestDto, orgId: string, tx: Executor): Promise<void> {
    // customer_id is the entity: the feed's customer_id filter finds the entity's requests.
    await outbox.record(
      { orgId, type: DOCUMENT_REQUEST_EVENT, customerId: dto.entity_id, customer: null, data: { document_request: dto } },
      tx,
    );
  }

  /**
   * Closes an OPEN request in the caller's transaction: the status, the spent link's directory row, the
   * audit row and the event together. False when another transaction closed it first.
   */
  async function close(row: DocumentRequestRow, outcome: 'FULFILLED' | 'EXPIRED', actor: Actor, tx: Executor): Promise<boolean> {
    const now = clock.now();
    const closed = await requests.close(
      row.orgId,
      row.id,
      outcome === 'FULFILLED' ? { status: outcome, fulfilledAt: now } : { status: outcome, expiredAt: now },
      tx,
    );
    if (!closed) return false;
    await requests.deleteTokens(row.orgId, row.id, tx);
    const documents = await requests.documentsOf(row.orgId, row.entityId, [row.id], tx);
    const after = toDocumentRequestDto(closed, documents);
    await audit.record(
      {
        orgId: row.orgId,
        actor,
        action: outcome === 'FULFILLED' ? 'document_request.fulfilled' : 'document_request.expired',
        subjectType: 'document_request',
        subjectId: row.id,
        before: toDocumentRequestDto(row, documents),
        after,
      },
      tx,
    );
    await announce(after, row.orgId, tx);
    return true;
  }

  /**
   * The OPEN request a token opens, read in `tx` (locked when asked), or why not: `invalid` for an
   * unknown, spent or malformed token, `expired` when its due time has passed (the caller expires it).
   */
  async function resolve(token: string, tx: Executor, lock: { forUpdate?: boolean } = {}) {
    if (!LINK_TOKEN_PATTERN.test(token)) return { kind: 'invalid' as const };
    const entry = await requests.findToken(linkTokenHash(token), tx);
    if (!entry) return { kind: 'invalid' as const };
    const row = await requests.findById(entry.orgId, entry.documentRequestId, tx, lock);
    if (!row || row.status !== 'OPEN') return { kind: 'invalid' as const };
    if (row.dueAt.getTime() <= clock.now().getTime()) return { kind: 'expired' as const, row };
    return { kind: 'open' as const, row };
  }

  /** Expires a request seen past its due time, in a transaction of its own (it must commit whatever the caller answers). */
  async function expireNow(orgId: string, id: string): Promise<void> {
    await database.transaction(async (tx) => {
      const row = await requests.findById(orgId, id, tx, { forUpdate: true });
      if (row && row.status === 'OPEN' && row.dueAt.getTime() <= clock.now().getTime()) await close(row, 'EXPIRED', SYSTEM, tx);
    });
  }

  return {
    /** POST /entities/{id}/document-requests. */
    async create(ctx: RequestContext, ref: string, body: CreateDocumentRequestBody): Promise<DocumentRequestDto & { upload_url: string }> {
      return ctx.transaction(async (tx) => {
        const entity = await customers.findByRef(ctx.orgId, 'entity', ref, tx);
        if (!entity) throw AppError.notFound('Entity');
        const now = clock.now();
        const types = [...new Set(body.types)];
        const dueAt = body.dueAt ?? new Date(now.getTime() + DEFAULT_DUE_DAYS * DAY_MS);
        const issues = new Issues();
        if (dueAt.getTime() <= now.getTime()) issues.add('dueAt', 'Must be in the future.');
        else if (dueAt.getTime() > now.getTime() + MAX_DUE_DAYS * DAY_MS)
          issues.add('dueAt', `Must be at most ${MAX_DUE_DAYS} days ahead.`);
        const contact = entity.contactCustomerId ? await customers.findById(ctx.orgId, entity.contactCustomerId, tx) : undefined;
        if (!contact?.email) issues.add('contact', 'The request emails the contact person: set a contact with an email first.');
        const payer = await payerFor(ctx.orgId, entity, body.payer, tx);
        // The KYB payer rules send a customer a pay link before anything else; documents have no such
        // lane yet, so a customer-paid request would let the contact upload without paying.
        if (payer === 'customer') {
          issues.add(
            'payer',
            body.payer === 'customer'
              ? 'Document requests cannot be paid by the customer yet: send payer "organization".'
              : 'The billing default for this entity is the customer, and document requests cannot be paid by the customer yet: send payer "organization".',
          );
        }
        issues.throwIfAny();

        const cost = DOCUMENT_PRICE;
        const row = await requests.insert(
          {
            orgId: ctx.orgId,
            entityId: entity.id,
            types,
            message: body.message ?? null,
            dueAt,
            payer,
            cost,
            recipientEmail: contact!.email!,
            apiKeyId: ctx.actor.type === 'api_key' ? ctx.actor.id : null,
          },
          tx,
        );
        const token = newLinkToken();
        await requests.insertToken({ tokenHash: linkTokenHash(token), orgId: ctx.orgId, documentRequestId: row.id }, tx);
        // The contact's uploads through the link are covered by this charge.
        await charge(
          ctx,
          { cost, reason: 'document_request', customerId: entity.id, documentRequestId: row.id, what: 'This document request' },
          tx,
        );

        const link = `${deps.publicBaseUrl}/documents/${token}`;
        const organisation = await organisations.findById(ctx.orgId, tx);
        await emails.queue(
          {
            orgId: ctx.orgId,
            recipient: contact!.email!,
            subject: `Documents requested for ${entity.name}`,
            body: [
              `Hello ${contact!.name},`,
              '',
              `${organisation?.name ?? 'We'} ask${organisation ? 's' : ''} you to upload these documents for ${entity.name}:`,
              ...types.map((type) => `- ${documentTypeName(type)}`),
              ...(body.message ? ['', body.message] : []),
              '',
              `Upload them here by ${dueAt.toUTCString()}: ${link}`,
              '',
              'This link is personal; do not forward it.',
            ].join('\n'),
            link,
          },
          tx,
        );
        const dto = toDocumentRequestDto(row, []);
        await audit.record(
          {
            orgId: ctx.orgId,
            actor: ctx.actor,
            action: 'entity.documents_requested',
            subjectType: 'entity',
            subjectId: entity.id,
            before: null,
            after: dto,
          },
          tx,
        );
        await announce(dto, ctx.orgId, tx);
        return { ...dto, upload_url: link };
      });
    },

    /** GET /entities/{id}/document-requests: oldest first, without links. */
    async list(ctx: RequestContext, ref: string): Promise<{ object: 'list'; data: DocumentRequestDto[] }> {
      const entity = await customers.findByRef(ctx.orgId, 'entity', ref, database.db);
      if (!entity) throw AppError.notFound('Entity');
      const rows = await requests.listForEntity(ctx.orgId, entity.id, database.db);
      const documents = await requests.documentsOf(
        ctx.orgId,
        entity.id,
        rows.map((row) => row.id),
        database.db,
      );
      return { object: 'list', data: rows.map((row) => toDocumentRequestDto(row, documents)) };
    },

    /**
     * What the upload page shows for a token, or undefined when the link is not (or no longer) valid.
     * A request seen past its due time is expired at once.
     */
    async openPage(token: string): Promise<UploadPageView | undefined> {
      const found = await resolve(token, database.db);
      if (found.kind === 'expired') await expireNow(found.row.orgId, found.row.id);
      if (found.kind !== 'open') return undefined;
      return viewOf(found.row, database.db);
    },

    /**
     * Stores the contact's files (each spooled file's field is the type it answers) for the request a
     * token opens, in one transaction (the request row locked, so two uploads cannot both miss fulfilling
     * it): each file as a free document of the request, uploaded by the contact, then, when
     * every requested type has a document, the request is FULFILLED and its link spent. `invalid`
     * when the link is not valid (a request past due is expired first).
     */
    async receive(
      token: string,
      files: readonly SpooledFile[],
      limits: { maxDocuments: number },
    ): Promise<{ kind: 'invalid' } | { kind: 'received'; fulfilled: boolean }> {
      return database.transaction(async (tx) => {
        const found = await resolve(token, tx, { forUpdate: true });
        if (found.kind === 'expired') {
          await close(found.row, 'EXPIRED', SYSTEM, tx);
          return { kind: 'invalid' as const };
        }
        if (found.kind !== 'open') return { kind: 'invalid' as const };
        const { row } = found;
        if (files.length === 0) throw AppError.field('files', 'Choose at least one file to upload.');
        // The intake refused these already, by the form's headers, from what the page showed; under the
        // row lock they are checked again against what has arrived since.
        const before = await requests.documentsOf(row.orgId, row.entityId, [row.id], tx);
        const receivedBefore = new Set(before.map((document) => document.type));
        const refused = files.find((file) => !row.types.includes(file.field) || receivedBefore.has(file.field));
        if (refused) {
          throw AppError.field(refused.field, notOutstandingMessage(row.types, receivedBefore, refused.field));
        }
        if (before.length + files.length > limits.maxDocuments) {
          throw AppError.field('files', allowanceMessage(limits.maxDocuments, before.length));
        }
        const contact: Actor = { type: 'contact', id: row.id };
        for (const file of files) {
          await documents.store(tx, {
            orgId: row.orgId,
            actor: contact,
            entityId: row.entityId,
            // Admitted above: one of the request's types, which are catalogue codes.
            type: file.field as DocumentTypeCode,
            file,
            uploadedBy: 'contact',
            documentRequestId: row.id,
          });
        }
        const received = new Set([...before.map((document) => document.type), ...files.map((file) => file.field)]);
        if (row.types.every((type) => received.has(type))) {
          await close(row, 'FULFILLED', contact, tx);
          return { kind: 'received' as const, fulfilled: true };
        }
        // received_types and document_ids moved: updated_at says so (the event fires on status changes only).
        await requests.touch(row.orgId, row.id, tx);
        return { kind: 'received' as const, fulfilled: false };
      });
    },

    /**
     * One pass of the expiry job: OPEN requests past their due time become EXPIRED, organisation by
     * organisation (a rotating start, so none is always first), each organisation's batch a
     * transaction of its own with SKIP LOCKED, so several instances share the work. Returns how many expired.
     */
    async expireDue(options: { batchSize?: number; maxOrganisations?: number } = {}): Promise<number> {
      const batchSize = options.batchSize ?? 100;
      const now = clock.now();
      const orgIds = await dueOrganisations(rotation, options.maxOrganisations ?? 50, (after, limit) =>
        requests.organisationsWithDueRequests(after, limit, now, database.db),
      );
      let expired = 0;
      for (const orgId of orgIds) {
        // A full batch may have more behind it: the organisation is served until its due requests are gone.
        for (let full = true; full;) {
          const claimed = await database.transaction(async (tx) => {
            const due = await requests.claimDue(orgId, batchSize, now, tx);
            let closed = 0;
            for (const row of due) if (await close(row, 'EXPIRED', SYSTEM, tx)) closed += 1;
            return { due: due.length, closed };
          });
          expired += claimed.closed;
          full = claimed.due === batchSize;
        }
      }
      return expired;
    },
  };

  async function viewOf(row: DocumentRequestRow, tx: Executor): Promise<UploadPageView> {
    const [organisation, entity, documents] = await Promise.all([
      organisations.findById(row.orgId, tx),
      customers.findById(row.orgId, row.entityId, tx),
      requests.documentsOf(row.orgId, row.entityId, [row.id], tx),
    ]);
    const received = new Set(documents.map((document) => document.type));
    return {
      orgId: row.orgId,
      request: row,
      organisationName: organisation?.name ?? '',
      entityName: entity?.name ?? '',
      items: row.types.map((code) => ({ code, name: documentTypeName(code), received: received.has(code) })),
      documentCount: documents.length,
    };
  }
}

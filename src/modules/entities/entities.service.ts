import { randomUUID } from 'node:crypto';
import type { DataAccess, Executor } from '../../db/client.js';
import type { PageReads } from '../../db/page-reads.js';
import type { BeneficialOwnerRow, CustomerRow, NewCustomerRow } from '../../db/schema.js';
import { AppError, isAppError } from '../../shared/app-error.js';
import type { Clock } from '../../shared/clock.js';
import { Issues } from '../../shared/issues.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import { changedColumns, type CustomerChangeRecorder } from '../customers/customer-changes.js';
import { toAmlBlock, toIndividualDto } from '../customers/customer-dto.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import { type CursorKey } from '../../shared/list-cursor.js';
import {
  bulkResults,
  checkDueDiligenceInputs,
  listCustomerRecords,
  nameAndEmailKey,
  type BulkUpsertResult,
  servicesUpdate,
  type ListQuery,
  type ListRead,
  type UpsertOptions,
  writeLockedChanges,
} from '../customers/customers.service.js';
import type { RequestContext } from '../../shared/request-context.js';
import { timeSlicer } from '../../shared/time-slice.js';
import type { ReviewColumnsWriter } from '../customers/review-columns.js';
import type { RiskAnswers } from '../customers/risk-model.js';
import type { EntitiesRepository } from './entities.repository.js';
import type { AddOwnersBody, ContactInput, EntityDto, PatchEntityBody, UpsertEntityBody } from './entities.schemas.js';
import { toBeneficialOwnerDto, toEntityDto } from './entity-dto.js';

const UPSERT_ATTEMPTS = 5;
type AddedVia = NonNullable<UpsertOptions['addedVia']>;
const FROZEN_MESSAGE = 'Frozen after KYB verification.';
const UNIQUE_CONFLICT_MESSAGE = 'Another entity already has this ABN, ACN or legal name and type.';

/** The case-insensitive key of a legal name + type (the entities' unique index's expression, as far as JavaScript lowercases alike). */
const nameTypeKey = (name: string, type: string) => `${name.toLowerCase()}\u0000${type}`;

/** An inline contact person of an upsert's body, with the key of its name and email. */
type InlineContact = { key: string; fullName: string; email: string; kycRequired: boolean };

/** A row of an import's batch of entities. */
export type EntityBulkUpsertItem = { body: UpsertEntityBody };

function isUniqueViolation(error: unknown): boolean {
  const { code, cause } = error as { code?: string; cause?: { code?: string } };
  return code === '23505' || cause?.code === '23505';
}

export function createEntitiesService(deps: {
  database: DataAccess;
  pageReads: PageReads;
  clock: Clock;
  cursorKey: CursorKey;
  customers: CustomersRepository;
  entities: EntitiesRepository;
  changes: CustomerChangeRecorder;
  audit: AuditWriter;
  reviewColumns: ReviewColumnsWriter;
}) {
  const { database, pageReads, clock, cursorKey, customers, entities, changes, audit, reviewColumns } = deps;

  /** Whether saving an owner added it or changed what is held of it. */
  function ownerChanged(previous: BeneficialOwnerRow | undefined, saved: BeneficialOwnerRow): boolean {
    if (!previous) return true;
    return (
      previous.holderType !== saved.holderType ||
      previous.roleTypes.join() !== saved.roleTypes.join() ||
      Number(previous.percentageHeld) !== Number(saved.percentageHeld) ||
      previous.kycRequired !== saved.kycRequired
    );
  }

  async function dtoOf(row: CustomerRow, tx: Executor): Promise<EntityDto> {
    const contact = row.contactCustomerId ? await customers.findById(row.orgId, row.contactCustomerId, tx) : undefined;
    return toEntityDto(row, contact);
  }

  async function requireEntity(ctx: RequestContext, ref: string, tx: Executor, forUpdate = false): Promise<CustomerRow> {
    const row = await customers.findByRef(ctx.orgId, 'entity', ref, tx, { forUpdate });
    if (!row) throw AppError.notFound('Entity');
    return row;
  }

  /** A new individual for a role (contact person or beneficial owner): its own KYC intended (kycRequired) but nothing started or charged. */
  function contactPersonColumns(
    ctx: RequestContext,
    person: { fullName: string; email: string; kycRequired: boolean },
    addedVia: AddedVia,
  ): NewCustomerRow {
    return {
      orgId: ctx.orgId,
      kind: 'individual',
      type: 'INDIVIDUAL',
      name: person.fullName,
      email: person.email,
      isContactOnly: true,
      addedVia,
      kycStatus: person.kycRequired ? 'NOT_STARTED' : 'NOT_REQUIRED',
    };
  }

  /**
   * An individual by exact (case-insensitive) name + email, or a new one created for the role
   * (contact person or beneficial owner). Concurrency-safe through the name+email unique index.
   */
  async function findOrCreatePerson(
    ctx: RequestContext,
    person: { fullName: string; email: string; kycRequired: boolean },
    tx: Executor,
    addedVia: AddedVia = 'INTEGRATION',
  ) {
    for (let attempt = 0; attempt < UPSERT_ATTEMPTS; attempt += 1) {
      const existing = await customers.findIndividualByNameAndEmail(ctx.orgId, person.fullName, person.email, tx);
      if (existing) return existing;
      const created = await customers.insertIfAbsent(contactPersonColumns(ctx, person, addedVia), tx);
      if (created) {
        await changes.record(
          { actor: ctx.actor, action: 'customer.created', before: undefined, after: created, dto: toIndividualDto(created) },
          tx,
        );
        return created;
      }
    }
    throw AppError.conflict('The person changed concurrently; retry the request.');
  }

  async function resolveContact(ctx: RequestContext, contact: ContactInput, tx: Executor, addedVia: AddedVia = 'INTEGRATION') {
    const issues = new Issues();
    const inline = contact.fullName !== undefined || contact.email !== undefined;
    if (contact.customerId !== undefined && inline) issues.add('contact', 'Send either customerId or fullName plus email, not both.');
    if (contact.customerId === undefined && !inline) issues.add('contact', 'Send customerId, or fullName plus email.');
    if (contact.customerId === undefined && inline) {
      if (contact.fullName === undefined) issues.add('contact.fullName', 'Required with contact.email.');
      if (contact.email === undefined) issues.add('contact.email', 'Required with contact.fullName.');
    }
    issues.throwIfAny();
    const kycRequired = contact.kycRequired ?? true;
    if (contact.customerId !== undefined) {
      const person = await customers.findByRef(ctx.orgId, 'individual', contact.customerId, tx);
      if (!person) throw AppError.field('contact.customerId', 'No individual customer with this id or external_id.');
      return { contactCustomerId: person.id, contactKycRequired: kycRequired };
    }
    const person = await findOrCreatePerson(ctx, { fullName: contact.fullName!, email: contact.email!, kycRequired }, tx, addedVia);
    return { contactCustomerId: person.id, contactKycRequired: kycRequired };
  }

  /** The spec's matching order: externalId, then ABN, then ACN, then legal name + type. */
  async function matchForUpsert(ctx: RequestContext, body: UpsertEntityBody, tx: Executor): Promise<CustomerRow | undefined> {
    let match: CustomerRow | undefined;
    if (body.externalId) {
      const byExternalId = await customers.findByExternalId(ctx.orgId, body.externalId, tx, { forUpdate: true });
      if (byExternalId && byExternalId.kind !== 'entity') {
        throw AppError.conflict('This externalId belongs to an individual customer; use POST /v1/customers for it.', {
          field: 'externalId',
        });
      }
      match = byExternalId;
    }
    if (!match) {
      const candidate =
        (body.abn ? await entities.findByAbn(ctx.orgId, body.abn, tx) : undefined) ??
        (body.acn ? await entities.findByAcn(ctx.orgId, body.acn, tx) : undefined) ??
        (body.name && body.type ? await entities.findByNameAndType(ctx.orgId, body.name, body.type, tx) : undefined);
      if (candidate && body.externalId && candidate.externalId !== null && candidate.externalId !== body.externalId) {
        throw AppError.conflict('A matching entity already exists under another externalId.', { field: 'externalId', match: candidate.id });
      }
      match = candidate;
    }
    if (match) {
      if (body.type !== undefined && body.type !== match.type) {
        throw AppError.conflict(`The stored type is ${match.type}; type is immutable (create a new record for another type).`, {
          field: 'type',
        });
      }
      if (body.origin !== undefined && body.origin !== match.origin) {
        throw AppError.conflict(`The stored origin is ${match.origin}; origin is immutable.`, { field: 'origin' });
      }
    }
    return match;
  }

  function identityRules(
    origin: string,
    fields: { abn?: unknown; acn?: unknown; countryOfFormation?: unknown; registrationNumber?: unknown },
    issues: Issues,
  ) {
    if (origin === 'INTERNATIONAL') {
      if (fields.abn !== undefined && fields.abn !== null) issues.add('abn', 'Only for AUSTRALIAN entities.');
      if (fields.acn !== undefined && fields.acn !== null) issues.add('acn', 'Only for AUSTRALIAN entities.');
    } else {
      if (fields.countryOfFormation !== undefined)
        issues.add('countryOfFormation', 'Only for INTERNATIONAL entities (Australian ones are AUS).');
      if (fields.registrationNumber !== undefined && fields.registrationNumber !== null)
        issues.add('registrationNumber', 'Only for INTERNATIONAL entities.');
    }
  }

  /** The columns an upsert writes, its contact aside (upsertColumns adds it); throws the body's 422. */
  function columnsOf(
    ctx: RequestContext,
    existing: CustomerRow | undefined,
    body: UpsertEntityBody,
    addedVia: AddedVia = 'INTEGRATION',
  ): Partial<NewCustomerRow> {
    const issues = new Issues();
    const origin = body.origin ?? existing?.origin ?? 'AUSTRALIAN';
    const answers: RiskAnswers = { ...((existing?.riskAnswers as RiskAnswers | undefined) ?? {}), ...(body.risk ?? {}) };
    if (!existing) {
      if (!body.type) issues.add('type', 'Required when creating an entity.');
      if (!body.name) issues.add('name', 'Required when creating an entity.');
      if (origin === 'INTERNATIONAL' && !body.countryOfFormation) issues.add('countryOfFormation', 'Required for INTERNATIONAL entities.');
    }
    identityRules(origin, body, issues);
    if (existing?.kycStatus === 'VERIFIED') {
      if (body.name !== undefined && body.name !== existing.name) issues.add('name', FROZEN_MESSAGE);
      if (body.abn !== undefined && body.abn !== existing.abn) issues.add('abn', FROZEN_MESSAGE);
      if (body.acn !== undefined && body.acn !== existing.acn) issues.add('acn', FROZEN_MESSAGE);
      if (body.countryOfFormation !== undefined && body.countryOfFormation !== existing.countryOfFormation) {
        issues.add('countryOfFormation', FROZEN_MESSAGE);
      }
      // PATCH freezes registrationNumber; the upsert must not be a way around that.
      if (body.registrationNumber !== undefined && body.registrationNumber !== existing.registrationNumber) {
        issues.add('registrationNumber', FROZEN_MESSAGE);
      }
    }
    checkDueDiligenceInputs(body, answers, clock.now(), issues, existing?.designatedServices);
    issues.throwIfAny();

    const values: Partial<NewCustomerRow> = {
      name: body.name,
      abn: body.abn,
      acn: body.acn,
      address: body.address,
      countryOfFormation: origin === 'AUSTRALIAN' ? 'AUS' : body.countryOfFormation,
      registrationNumber: body.registrationNumber,
      riskAnswers: answers,
      clientSinceDate: body.clientSinceDate,
      preExistingServiceSince: body.preExistingServiceSince,
      // The assessment only decides the status of a new record.
      preCommencementAssessment: existing ? undefined : body.preCommencementAssessment,
      ...servicesUpdate(existing, existing ? { ...body, preCommencementAssessment: undefined } : body, answers),
    };
    if (!existing) {
      Object.assign(values, {
        orgId: ctx.orgId,
        kind: 'entity',
        type: body.type,
        origin,
        externalId: body.externalId ?? null,
        addedVia,
      });
    } else if (body.externalId && existing.externalId === null) {
      values.externalId = body.externalId;
    }
    return values;
  }

  /** A payload that contradicts itself (e.g. INTERNATIONAL with an ABN) is invalid whatever is stored: the upsert's first check. */
  function checkOwnIdentity(body: UpsertEntityBody): void {
    if (body.origin === undefined) return;
    const issues = new Issues();
    identityRules(body.origin, body, issues);
    issues.throwIfAny();
  }

  /**
   * A new entity's columns, its contact aside, or the 422 its single upsert would answer: for a body
   * that matches no stored record, that upsert's checks come in this order and read nothing.
   */
  function newEntityColumns(
    ctx: RequestContext,
    body: UpsertEntityBody,
    addedVia: AddedVia,
  ): { values: NewCustomerRow } | { refusal: AppError } {
    try {
      checkOwnIdentity(body);
      return { values: columnsOf(ctx, undefined, body, addedVia) as NewCustomerRow };
    } catch (error) {
      if (isAppError(error)) return { refusal: error };
      throw error;
    }
  }

  /**
   * What the single upsert of `body` onto `matched` (the entity its externalId names, locked) would
   * write when it needs no record but that one: the columns it changes (none: it changes nothing). An
   * inline contact counts only when its person is stored (`person`). Undefined when the single upsert
   * must decide the row: a refusal, a type or origin conflict, a person to create, a contact by id.
   */
  function changeOf(
    ctx: RequestContext,
    matched: CustomerRow,
    body: UpsertEntityBody,
    person: CustomerRow | undefined,
    addedVia: AddedVia,
  ): Partial<NewCustomerRow> | undefined {
    if ((body.type !== undefined && body.type !== matched.type) || (body.origin !== undefined && body.origin !== matched.origin))
      return undefined;
    if (body.contact && !person) return undefined;
    let values: Partial<NewCustomerRow>;
    try {
      values = columnsOf(ctx, matched, body, addedVia);
    } catch (error) {
      if (isAppError(error)) return undefined;
      throw error;
    }
    const contact = person && { contactCustomerId: person.id, contactKycRequired: body.contact?.kycRequired ?? true };
    return changedColumns(matched, { ...values, ...contact });
  }

  async function upsertColumns(
    ctx: RequestContext,
    existing: CustomerRow | undefined,
    body: UpsertEntityBody,
    tx: Executor,
    addedVia: AddedVia = 'INTEGRATION',
  ): Promise<Partial<NewCustomerRow>> {
    const values = columnsOf(ctx, existing, body, addedVia);
    return body.contact ? { ...values, ...(await resolveContact(ctx, body.contact, tx, addedVia)) } : values;
  }

  /** Writes what changed of `values` and records the change; `changed` false when nothing did. */
  async function saveChange(
    ctx: RequestContext,
    action: string,
    row: CustomerRow,
    values: Partial<NewCustomerRow>,
    tx: Executor,
    ownersChanged = false,
  ): Promise<{ dto: EntityDto; changed: boolean }> {
    const changed = changedColumns(row, values);
    const diff = await reviewColumns.withReview(row, changed, tx, { ownersChanged });
    if (Object.keys(diff).length === 0) return { dto: await dtoOf(row, tx), changed: false };
    const updated = await customers.update(ctx.orgId, row.id, diff, tx);
    const dto = await dtoOf(updated, tx);
    await changes.record({ actor: ctx.actor, action, before: row, after: updated, dto }, tx);
    return { dto, changed: true };
  }

  async function save(
    ctx: RequestContext,
    action: string,
    row: CustomerRow,
    values: Partial<NewCustomerRow>,
    tx: Executor,
    ownersChanged = false,
  ): Promise<EntityDto> {
    return (await saveChange(ctx, action, row, values, tx, ownersChanged)).dto;
  }

  /** An inline contact person of an upsert's body (full name and email), keyed as the name + email index is. */
  function inlineContact(body: UpsertEntityBody): InlineContact | undefined {
    const contact = body.contact;
    if (!contact || contact.customerId !== undefined || contact.fullName === undefined || contact.email === undefined) return undefined;
    const kycRequired = contact.kycRequired ?? true;
    return { key: nameAndEmailKey(contact.fullName, contact.email), fullName: contact.fullName, email: contact.email, kycRequired };
  }

  /**
   * A batch's changes to the entities it locked, written together (writeLockedChanges) in a savepoint
   * (rolled back in a dry run). `persons` are the contact persons the batch read. False, with nothing
   * written, when a key another request took since the batch read them refused the statement.
   */
  async function writeBatchUpdates(
    ctx: RequestContext,
    updates: Array<{ row: CustomerRow; changed: Partial<NewCustomerRow> }>,
    persons: Map<string, CustomerRow>,
    tx: Executor,
  ): Promise<boolean> {
    // Their events' DTOs name each entity's contact person: the stored ones not read yet, in one read.
    const contacts = new Map([...persons.values()].map((row) => [row.id, row]));
    const unread = new Set<string>();
    for (const { row, changed } of updates) {
      const contactId = 'contactCustomerId' in changed ? changed.contactCustomerId : row.contactCustomerId;
      if (contactId && !contacts.has(contactId)) unread.add(contactId);
    }
    for (const row of await customers.findManyByIds(ctx.orgId, [...unread], tx)) contacts.set(row.id, row);
    try {
      await ctx.transaction((savepoint) =>
        writeLockedChanges(
          { customers, changes, reviewColumns },
          ctx,
          {
            action: 'entity.upserted',
            toDto: (row) => toEntityDto(row, row.contactCustomerId ? contacts.get(row.contactCustomerId) : undefined),
          },
          updates,
          savepoint,
        ),
      );
      return true;
    } catch (error) {
      if (!isUniqueViolation(error)) throw error;
      return false;
    }
  }

  /**
   * A batch's new entities inserted together, with the new contact persons they bring (found or created
   * as findOrCreatePerson does: the first row naming one decides its KYC intent) and their audit rows;
   * `persons` (the stored ones, by key) gains the new. Returns the id of each created entity by row
   * index, and the rows whose key or person another request took since the batch read them.
   */
  async function insertNewEntities(
    ctx: RequestContext,
    creates: Array<{ index: number; values: NewCustomerRow; person: InlineContact | undefined }>,
    persons: Map<string, CustomerRow>,
    addedVia: AddedVia,
    tx: Executor,
  ): Promise<{ created: Array<[index: number, id: string]>; taken: number[] }> {
    const newPersons = new Map<string, NewCustomerRow>();
    for (const { person } of creates) {
      if (!person || persons.has(person.key) || newPersons.has(person.key)) continue;
      newPersons.set(person.key, { ...contactPersonColumns(ctx, person, addedVia), id: randomUUID() });
    }
    if (newPersons.size > 0) {
      const inserted = new Map((await customers.insertManyIfAbsent(ctx.orgId, [...newPersons.values()], tx)).map((row) => [row.id, row]));
      const created: CustomerRow[] = [];
      for (const [key, values] of newPersons) {
        const row = inserted.get(values.id!);
        if (row) {
          persons.set(key, row);
          created.push(row);
        }
      }
      await changes.recordCreated(
        created.map((after) => ({ actor: ctx.actor, action: 'customer.created', after })),
        toIndividualDto,
        tx,
      );
    }
    const taken: number[] = [];
    const ready: typeof creates = [];
    for (const create of creates) {
      if (create.person && !persons.has(create.person.key)) taken.push(create.index);
      else ready.push(create);
    }
    const rows = await reviewColumns.forNewRecords(
      ready.map(({ values, person }) => {
        const contact = person && { contactCustomerId: persons.get(person.key)!.id, contactKycRequired: person.kycRequired };
        return { ...values, ...contact, id: randomUUID() };
      }),
      tx,
    );
    const inserted = new Map((await customers.insertManyIfAbsent(ctx.orgId, rows, tx)).map((row) => [row.id, row]));
    const contacts = new Map([...persons.values()].map((row) => [row.id, row]));
    const recorded: Array<{ actor: RequestContext['actor']; action: string; after: CustomerRow }> = [];
    const created: Array<[index: number, id: string]> = [];
    ready.forEach(({ index }, position) => {
      const row = inserted.get(rows[position]!.id!);
      if (!row) return void taken.push(index);
      recorded.push({ actor: ctx.actor, action: 'entity.created', after: row });
      created.push([index, row.id]);
    });
    await changes.recordCreated(
      recorded,
      (row) => toEntityDto(row, row.contactCustomerId ? contacts.get(row.contactCustomerId) : undefined),
      tx,
    );
    return { created, taken };
  }

  const service = {
    /**
     * POST /entities: create or update per the matching order; never starts KYB, emails or charges.
     * `changed` tells an update from a match that changed nothing; `options.addedVia` marks what it creates.
     */
    async upsert(
      ctx: RequestContext,
      body: UpsertEntityBody,
      options: Pick<UpsertOptions, 'addedVia'> = {},
    ): Promise<{ created: boolean; changed: boolean; entity: EntityDto }> {
      checkOwnIdentity(body);
      try {
        return await ctx.transaction(async (tx) => {
          for (let attempt = 0; attempt < UPSERT_ATTEMPTS; attempt += 1) {
            const match = await matchForUpsert(ctx, body, tx);
            if (match) {
              const values = await upsertColumns(ctx, match, body, tx, options.addedVia);
              const { dto, changed } = await saveChange(ctx, 'entity.upserted', match, values, tx);
              return { created: false, changed, entity: dto };
            }
            const values = await reviewColumns.forNewRecord(
              (await upsertColumns(ctx, undefined, body, tx, options.addedVia)) as NewCustomerRow,
              tx,
            );
            const inserted = await customers.insertIfAbsent(values, tx);
            if (inserted) {
              const dto = await dtoOf(inserted, tx);
              await changes.record({ actor: ctx.actor, action: 'entity.created', before: undefined, after: inserted, dto }, tx);
              return { created: true, changed: true, entity: dto };
            }
            // A concurrent request created a matching entity first; match again.
          }
          throw AppError.conflict('The entity changed concurrently; retry the request.');
        });
      } catch (error) {
        // The matched record would take an ABN, ACN or name+type that another entity holds.
        if (isUniqueViolation(error)) throw AppError.conflict(UNIQUE_CONFLICT_MESSAGE);
        throw error;
      }
    },

    /**
     * An import's batch of entity upserts, in `tx`: each row ends as its POST /v1/entities would have,
     * sent one after another in the batch's order. A row that creates an entity (no stored entity and no
     * earlier row holds one of its keys) with at most an inline contact person is written with the others
     * like it: the new contact persons in one statement, the entities in another, their audit rows in one
     * each; such a row whose body is refused gets its 422 without a statement. A row its externalId
     * matches that needs no record but that entity (no key of another record, no person to create) is
     * UNCHANGED without a write when it would change nothing, and otherwise written with the others like
     * it, one statement per set of changed columns. Every other row (a key or record an earlier row
     * holds, a refusal of a change, a contact by id) goes through the single upsert afterwards, in
     * order; so does a row whose key a concurrent request took meanwhile. A dry run writes none of the
     * new entities and rolls the changes' savepoints back.
     */
    async upsertMany(
      ctx: RequestContext,
      items: EntityBulkUpsertItem[],
      options: { addedVia: 'BULK_IMPORT'; dryRun: boolean },
      tx: Executor,
    ): Promise<BulkUpsertResult[]> {
      const results = bulkResults(items.length);
      const abns = [...new Set(items.flatMap(({ body }) => (body.abn ? [body.abn] : [])))];
      const acns = [...new Set(items.flatMap(({ body }) => (body.acn ? [body.acn] : [])))];
      const nameTypes = items.flatMap(({ body }) => (body.name && body.type ? [{ name: body.name, type: body.type }] : []));
      // The stored entity holding each of those keys, by key (as the rows' keys are written below).
      const holders = new Map<string, string>();
      for (const { key, position, id } of await entities.holdersOfKeys(ctx.orgId, { abns, acns, nameTypes }, tx)) {
        const pair = nameTypes[position];
        holders.set(
          key === 'abn'
            ? `abn:${abns[position]}`
            : key === 'acn'
              ? `acn:${acns[position]}`
              : `name+type:${nameTypeKey(pair!.name, pair!.type)}`,
          id,
        );
      }
      const candidates = await customers.lockUpsertCandidates(
        ctx.orgId,
        [...new Set(items.flatMap(({ body }) => (body.externalId ? [body.externalId] : [])))],
        items.flatMap(({ body }) => {
          const person = inlineContact(body);
          return person ? [{ name: person.fullName, email: person.email }] : [];
        }),
        tx,
      );
      const byExternalId = new Map<string, CustomerRow>();
      const persons = new Map<string, CustomerRow>();
      for (const row of candidates) {
        if (row.externalId !== null) byExternalId.set(row.externalId, row);
        if (row.kind === 'individual' && row.email !== null) persons.set(nameAndEmailKey(row.name, row.email), row);
      }

      const single: number[] = [];
      // Keys of earlier rows, and the contact persons of rows left to the single upsert: a later row
      // naming one must run after them, as its request would have.
      const seen = new Set<string>();
      const personsOfSingle = new Set<string>();
      const creates: Array<{ index: number; values: NewCustomerRow; person: InlineContact | undefined }> = [];
      const updates: Array<{ index: number; row: CustomerRow; changed: Partial<NewCustomerRow> }> = [];
      const slice = timeSlicer();
      for (const [index, { body }] of items.entries()) {
        // The batch is judged in slices, so requests served by this process are not held behind it.
        await slice();
        const matched = body.externalId ? byExternalId.get(body.externalId) : undefined;
        const type = body.type ?? matched?.type;
        const bodyKeys = [
          body.externalId === undefined ? undefined : `externalId:${body.externalId}`,
          body.abn ? `abn:${body.abn}` : undefined,
          body.acn ? `acn:${body.acn}` : undefined,
          body.name && type ? `name+type:${nameTypeKey(body.name, type)}` : undefined,
        ].filter((key): key is string => key !== undefined);
        // Every stored record the row may match or collide with: an earlier row touching one goes first.
        const records = new Set([matched?.id, ...bodyKeys.map((key) => holders.get(key))].filter((id): id is string => id !== undefined));
        const keys = [...bodyKeys, ...[...records].map((id) => `record:${id}`)];
        const shared = keys.some((key) => seen.has(key));
        for (const key of keys) seen.add(key);
        const person = inlineContact(body);
        // A change to the one stored entity its externalId names, holding no key of another record.
        const changed =
          !shared && matched?.kind === 'entity' && records.size === 1
            ? changeOf(ctx, matched, body, person && persons.get(person.key), options.addedVia)
            : undefined;
        if (changed && Object.keys(changed).length === 0) {
          results.set(index, { created: false, changed: false, id: matched!.id });
          continue;
        }
        if (changed) {
          updates.push({ index, row: matched!, changed });
          continue;
        }
        const stored = records.size > 0;
        const judged =
          shared || stored || (body.contact && !person) || (person && personsOfSingle.has(person.key))
            ? undefined
            : newEntityColumns(ctx, body, options.addedVia);
        if (judged && 'refusal' in judged) {
          results.refuse(index, judged.refusal);
        } else if (judged) {
          creates.push({ index, values: judged.values, person });
        } else {
          single.push(index);
          if (person) personsOfSingle.add(person.key);
        }
      }

      if (updates.length > 0) {
        if (await writeBatchUpdates(ctx, updates, persons, tx)) {
          for (const { index, row } of updates) results.set(index, { created: false, changed: true, id: row.id });
        } else {
          single.push(...updates.map(({ index }) => index));
        }
      }

      if (options.dryRun) {
        for (const { index } of creates) results.set(index, { created: true, changed: true, id: null });
      } else if (creates.length > 0) {
        const { created, taken } = await insertNewEntities(ctx, creates, persons, options.addedVia, tx);
        for (const [index, id] of created) results.set(index, { created: true, changed: true, id });
        single.push(...taken);
      }

      await results.upsertEach(single, options.dryRun, async (index) => {
        const upserted = await service.upsert(ctx, items[index]!.body, { addedVia: options.addedVia });
        return { ...upserted, id: upserted.entity.id };
      });
      return results.all();
    },

    async get(ctx: RequestContext, ref: string): Promise<EntityDto> {
      const tx = database.db;
      return dtoOf(await requireEntity(ctx, ref, tx), tx);
    },

    async getAml(ctx: RequestContext, ref: string) {
      return toAmlBlock(await requireEntity(ctx, ref, database.db));
    },

    async patch(ctx: RequestContext, ref: string, body: PatchEntityBody): Promise<EntityDto> {
      return ctx.transaction(async (tx) => {
        const row = await requireEntity(ctx, ref, tx, true);
        const issues = new Issues();
        identityRules(row.origin ?? 'AUSTRALIAN', body, issues);
        if (row.kycStatus === 'VERIFIED') {
          for (const [field, column] of [
            ['name', 'name'],
            ['abn', 'abn'],
            ['acn', 'acn'],
            ['registrationNumber', 'registrationNumber'],
          ] as const) {
            if (body[field] !== undefined && body[field] !== row[column]) issues.add(field, FROZEN_MESSAGE);
          }
        }
        if (body.risk?.isDesignatedService === false && row.designatedServices.length > 0) {
          issues.add(
            'risk.isDesignatedService',
            'Disagrees with the designated services on record; replace them with an empty set instead.',
          );
        }
        issues.throwIfAny();
        const answers: RiskAnswers = { ...(row.riskAnswers as RiskAnswers), ...(body.risk ?? {}) };
        const values: Partial<NewCustomerRow> = {
          name: body.name,
          abn: body.abn,
          acn: body.acn,
          address: body.address,
          registrationNumber: body.registrationNumber,
          riskAnswers: answers,
          ...(body.risk ? servicesUpdate(row, { risk: body.risk }, answers) : {}),
          ...(body.contact ? await resolveContact(ctx, body.contact, tx) : {}),
        };
        try {
          return await save(ctx, 'entity.patched', row, values, tx);
        } catch (error) {
          if (isUniqueViolation(error)) throw AppError.conflict(UNIQUE_CONFLICT_MESSAGE);
          throw error;
        }
      });
    },

    async list(ctx: RequestContext, query: ListQuery): Promise<ListRead<EntityDto>> {
      return listCustomerRecords(customers, pageReads, cursorKey, ctx.orgId, 'entity', query, async (rows, tx) => {
        const contactIds = [...new Set(rows.map((row) => row.contactCustomerId).filter((id): id is string => id !== null))];
        const contacts = new Map((await customers.findManyByIds(ctx.orgId, contactIds, tx)).map((row) => [row.id, row]));
        return rows.map((row) => toEntityDto(row, row.contactCustomerId ? contacts.get(row.contactCustomerId) : undefined));
      });
    },

    async listOwners(ctx: RequestContext, ref: string) {
      const tx = database.db;
      const entity = await requireEntity(ctx, ref, tx);
      return { ubos: (await entities.listOwners(ctx.orgId, entity.id, tx)).map(toBeneficialOwnerDto) };
    },

    /** POST /entities/{id}/ubos: links or creates each person; nothing is emailed or charged. */
    async addOwners(ctx: RequestContext, ref: string, body: AddOwnersBody) {
      return ctx.transaction(async (tx) => {
        const entity = await requireEntity(ctx, ref, tx, true);
        // People are found or created in one canonical order, so two requests naming the same new
        // people in different orders cannot deadlock on the name+email unique index.
        const personKey = (owner: { fullName: string; email: string }) =>
          `${owner.email.toLowerCase()}\u0000${owner.fullName.toLowerCase()}`;
        const people = new Map<string, CustomerRow>();
        for (const owner of [...body.owners].sort((a, b) => (personKey(a) < personKey(b) ? -1 : personKey(a) > personKey(b) ? 1 : 0))) {
          if (!people.has(personKey(owner))) people.set(personKey(owner), await findOrCreatePerson(ctx, owner, tx));
        }
        let ownersChanged = false;
        for (const owner of body.owners) {
          const person = people.get(personKey(owner))!;
          const previous = await entities.findOwnerByPerson(ctx.orgId, entity.id, person.id, tx);
          const saved = await entities.upsertOwner(
            {
              orgId: ctx.orgId,
              entityId: entity.id,
              customerId: person.id,
              holderType: owner.holderType,
              roleTypes: [...new Set(owner.roleTypes)],
              percentageHeld: owner.percentageHeld,
              kycRequired: owner.kycRequired,
              addedVia: 'INTEGRATION',
            },
            tx,
          );
          ownersChanged ||= ownerChanged(previous, saved);
          await audit.record(
            {
              orgId: ctx.orgId,
              actor: ctx.actor,
              action: 'entity.beneficial_owner_saved',
              subjectType: 'beneficial_owner',
              subjectId: saved.id,
              before: previous ?? null,
              after: saved,
            },
            tx,
          );
        }
        // A change to the owners brings the entity's scheduled review forward (OWNERS_CHANGED).
        if (ownersChanged) await save(ctx, 'entity.beneficial_owners_changed', entity, {}, tx, true);
        return { ubos: (await entities.listOwners(ctx.orgId, entity.id, tx)).map(toBeneficialOwnerDto) };
      });
    },

    dtoOf,
  };
  return service;
}
export type EntitiesService = ReturnType<typeof createEntitiesService>;

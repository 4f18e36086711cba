import type { DataAccess } from '../../db/client.js';
import type { OrganisationRow } from '../../db/schema.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import type { OrganisationsRepository } from './organisations.repository.js';
import {
  FEATURES,
  organisationInputSchema,
  type Feature,
  type OrganisationDto,
  type OrganisationInput,
  type Payer,
} from './organisations.schemas.js';

function toOrganisationDto(row: OrganisationRow): OrganisationDto {
  return {
    id: row.id,
    name: row.name,
    features: row.features,
    credits: row.credits,
    default_payer: row.defaultPayer,
    is_sandbox: row.isSandbox,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

const SYSTEM_ACTOR: Actor = { type: 'system', id: null };

export function createOrganisationsService(deps: { database: DataAccess; organisations: OrganisationsRepository; audit: AuditWriter }) {
  const { database, organisations: repository, audit } = deps;

  async function require(id: string): Promise<OrganisationRow> {
    const row = isUuid(id) ? await repository.findById(id, database.db) : undefined;
    if (!row) throw AppError.notFound('Organisation');
    return row;
  }

  return {
    async create(input: OrganisationInput, actor: Actor = SYSTEM_ACTOR): Promise<OrganisationDto> {
      const parsed = organisationInputSchema.safeParse(input);
      if (!parsed.success) {
        throw AppError.validation(
          Object.fromEntries(parsed.error.issues.map((issue) => [issue.path.join('.') || 'organisation', [issue.message]])),
        );
      }
      return database.transaction(async (tx) => {
        const row = await repository.insert(
          {
            name: parsed.data.name,
            features: [...new Set(parsed.data.features)],
            credits: 0,
            defaultPayer: parsed.data.defaultPayer,
            isSandbox: parsed.data.isSandbox,
          },
          tx,
        );
        const funded =
          parsed.data.credits > 0 ? await repository.adjustCredits(row.id, parsed.data.credits, { reason: 'initial_credits' }, tx) : row;
        const dto = toOrganisationDto(funded!);
        await audit.record(
          {
            orgId: dto.id,
            actor,
            action: 'organisation.created',
            subjectType: 'organisation',
            subjectId: dto.id,
            before: null,
            after: dto,
          },
          tx,
        );
        return dto;
      });
    },

    async list(): Promise<OrganisationDto[]> {
      return (await repository.list(database.db)).map(toOrganisationDto);
    },

    async show(id: string): Promise<OrganisationDto> {
      return toOrganisationDto(await require(id));
    },

    async update(
      id: string,
      changes: { name?: string; features?: Feature[]; defaultPayer?: Payer; addCredits?: number },
      actor: Actor = SYSTEM_ACTOR,
    ): Promise<OrganisationDto> {
      if (changes.features) {
        const unknown = changes.features.filter((feature) => !FEATURES.includes(feature));
        if (unknown.length) throw AppError.field('features', `Unknown feature(s): ${unknown.join(', ')}.`);
      }
      return database.transaction(async (tx) => {
        const before = toOrganisationDto(await require(id));
        let row: OrganisationRow | undefined;
        if (changes.name !== undefined || changes.features !== undefined || changes.defaultPayer !== undefined) {
          row = await repository.update(
            id,
            {
              ...(changes.name !== undefined ? { name: changes.name } : {}),
              ...(changes.features !== undefined ? { features: [...new Set(changes.features)] } : {}),
              ...(changes.defaultPayer !== undefined ? { defaultPayer: changes.defaultPayer } : {}),
            },
            tx,
          );
        }
        if (changes.addCredits !== undefined && changes.addCredits !== 0) {
          row = await repository.adjustCredits(id, changes.addCredits, { reason: 'operator_adjustment' }, tx);
          if (!row) throw AppError.field('addCredits', 'The balance cannot go below zero.');
        }
        if (!row) return before; // nothing asked to change: no write, no audit row
        const after = toOrganisationDto(row);
        await audit.record(
          { orgId: id, actor, action: 'organisation.updated', subjectType: 'organisation', subjectId: id, before, after },
          tx,
        );
        return after;
      });
    },
  };
}

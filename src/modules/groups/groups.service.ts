import type { z } from 'zod';
import type { DataAccess, Executor } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import type { OpenTransaction } from '../../shared/request-context.js';
import type { OrganisationsRepository } from '../organisations/organisations.repository.js';
import { CURATED_TEMPLATES, type CheckTrigger, type CuratedTemplate, type PartyType } from './curated-templates.js';
import type { GroupPartyRow, GroupRow, GroupsRepository, GroupTemplateRow, NewGroupParty } from './groups.repository.js';
import {
  customTemplateFileSchema,
  type CreateGroupInput,
  type GroupDto,
  type GroupPartyInput,
  type GroupTemplateDto,
} from './groups.schemas.js';

const GROUPS_FEATURE = 'groups';

/** Who is asking: the organisation, its enabled features, the actor recorded in the audit log, and how its writes open their transaction. */
export type GroupsCaller = { orgId: string; features: ReadonlySet<string>; actor: Actor; transaction: OpenTransaction };

function toGroupTemplateDto(row: GroupTemplateRow): GroupTemplateDto {
  return {
    id: row.id,
    code: row.code,
    name: row.name,
    description: row.description,
    industry: row.industry,
    source: row.source,
    is_verified: row.isVerified,
    roles: row.roles.map((role) => ({
      role_label: role.role_label,
      party_type: role.party_type as PartyType,
      required: role.required,
      check_trigger: role.check_trigger as CheckTrigger,
    })),
  };
}

function toGroupDto(row: GroupRow, parties: GroupPartyRow[], publicBaseUrl: string): GroupDto {
  return {
    id: row.id,
    name: row.name,
    reference: row.reference,
    status: row.status,
    template_id: row.templateId,
    industry: row.industry,
    parties: parties.map((party) => ({
      id: party.id,
      role_label: party.roleLabel,
      party_type: party.partyType as PartyType,
      required: party.required,
      customer_id: party.customerId,
    })),
    url: `${publicBaseUrl}/groups/${row.id}`,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

/** zod issues keyed like the API's `details.issues`: `roles[1].partyType`. */
function issuesOf(error: z.ZodError, root: string): Record<string, string[]> {
  const issues: Record<string, string[]> = {};
  const format = (segments: ReadonlyArray<PropertyKey>) =>
    segments
      .map((segment, index) => (typeof segment === 'number' ? `[${segment}]` : index === 0 ? String(segment) : `.${String(segment)}`))
      .join('');
  for (const issue of error.issues) {
    if (issue.code === 'unrecognized_keys') {
      for (const key of issue.keys) (issues[format([...issue.path, key])] ??= []).push('Unknown property.');
      continue;
    }
    (issues[format(issue.path) || root] ??= []).push(issue.message);
  }
  return issues;
}

export function createGroupsService(deps: {
  database: DataAccess;
  publicBaseUrl: string;
  /** The pre-built set to sync; defaults to CURATED_TEMPLATES (tests pass an edited set to simulate a deploy). */
  curatedTemplates?: readonly CuratedTemplate[];
  groups: GroupsRepository;
  organisations: OrganisationsRepository;
  audit: AuditWriter;
}) {
  const { database, publicBaseUrl, groups: repository, organisations, audit } = deps;
  const curated = deps.curatedTemplates ?? CURATED_TEMPLATES;
  const curatedCodes = curated.map((template) => template.code);

  // Organisations whose curated copies are known to be current in this process: a sync costs one
  // statement, and skipping it makes every later request free.
  const synced = new Set<string>();
  const syncing = new Map<string, Promise<void>>();

  function assertEnabled(caller: GroupsCaller): void {
    if (!caller.features.has(GROUPS_FEATURE)) throw AppError.featureDisabled(GROUPS_FEATURE);
  }

  /**
   * Gives the organisation its own current copies of the curated templates. Runs on its own pooled
   * connection and commits at once, so a caller's transaction rolling back later cannot undo it behind
   * the memo's back.
   */
  async function ensureCuratedTemplates(orgId: string): Promise<void> {
    if (synced.has(orgId)) return;
    let pending = syncing.get(orgId);
    if (!pending) {
      pending = repository
        .upsertCuratedTemplates(orgId, curated, database.db)
        .then(() => {
          synced.add(orgId);
        })
        .finally(() => syncing.delete(orgId));
      syncing.set(orgId, pending);
    }
    await pending;
  }

  async function resolveParties(orgId: string, parties: GroupPartyInput[], tx: Executor): Promise<NewGroupParty[]> {
    const ids = parties.flatMap((party) => (party.customerId !== undefined ? [party.customerId] : []));
    const externalIds = parties.flatMap((party) => (party.customerExternalId !== undefined ? [party.customerExternalId] : []));
    const found = await repository.findCustomers(orgId, { ids, externalIds }, tx);
    const byId = new Map(found.map((customer) => [customer.id, customer]));
    const byExternalId = new Map(found.flatMap((customer) => (customer.externalId !== null ? [[customer.externalId, customer]] : [])));

    const issues: Record<string, string[]> = {};
    const slots = parties.map((party, index): NewGroupParty => {
      let customerId: string | null = null;
      const field =
        party.customerId !== undefined ? 'customerId' : party.customerExternalId !== undefined ? 'customerExternalId' : undefined;
      if (field) {
        const path = `parties[${index}].${field}`;
        const customer = field === 'customerId' ? byId.get(party.customerId!) : byExternalId.get(party.customerExternalId!);
        if (!customer) {
          const value = field === 'customerId' ? party.customerId : party.customerExternalId;
          (issues[path] ??= []).push(
            `No customer or entity with ${field === 'customerId' ? 'id' : 'external id'} "${value}" in this organisation.`,
          );
        } else if (party.partyType === 'INDIVIDUAL' && customer.kind !== 'individual') {
          (issues[path] ??= []).push(`The customer is an entity, but parties[${index}].partyType is INDIVIDUAL.`);
        } else if (party.partyType === 'ENTITY' && customer.kind !== 'entity') {
          (issues[path] ??= []).push(`The customer is an individual, but parties[${index}].partyType is ENTITY.`);
        } else {
          customerId = customer.id;
        }
      }
      return { roleLabel: party.roleLabel, partyType: party.partyType, required: party.required, checkTrigger: null, customerId };
    });
    if (Object.keys(issues).length) throw AppError.validation(issues, 'Some parties could not be attached to a customer.');
    return slots;
  }

  return {
    assertEnabled,

    /** The feature gate plus the lazy curated-template sync; routes run it before opening any transaction. */
    async prepare(caller: GroupsCaller): Promise<void> {
      assertEnabled(caller);
      await ensureCuratedTemplates(caller.orgId);
    },

    async listTemplates(caller: GroupsCaller): Promise<GroupTemplateDto[]> {
      assertEnabled(caller);
      await ensureCuratedTemplates(caller.orgId);
      const rows = await repository.listTemplates(caller.orgId, curatedCodes, database.db);
      return rows.map(toGroupTemplateDto);
    },

    /**
     * Creates a group, or returns the ACTIVE group already holding `reference` unchanged
     * (`created: false`). The request is validated in full first, so the same body always gets the
     * same validation answer whether or not the reference is taken.
     */
    async createGroup(caller: GroupsCaller, input: CreateGroupInput): Promise<{ group: GroupDto; created: boolean }> {
      assertEnabled(caller);
      if (input.templateId !== undefined && input.parties !== undefined) {
        throw AppError.field('parties', 'templateId and parties are mutually exclusive: give one or the other.');
      }
      await ensureCuratedTemplates(caller.orgId);
      const { orgId } = caller;

      return caller.transaction(async (tx) => {
        let slots: NewGroupParty[] = [];
        let templateId: string | null = null;
        let industry: string | null = null;
        if (input.templateId !== undefined) {
          const template = await repository.findTemplate(orgId, input.templateId, curatedCodes, tx);
          if (!template) throw AppError.notFound('Group template');
          templateId = template.id;
          industry = template.industry;
          slots = template.roles.map((role) => ({
            roleLabel: role.role_label,
            partyType: role.party_type,
            required: role.required,
            checkTrigger: role.check_trigger,
            customerId: null,
          }));
        } else if (input.parties !== undefined) {
          slots = await resolveParties(orgId, input.parties, tx);
        }

        const reference = input.reference ?? null;
        // An ACTIVE holder of the reference may be archived between our insert and our read; then the
        // reference is free again and the next insert wins.
        for (let attempt = 0; attempt < 5; attempt += 1) {
          const row = await repository.insertGroupUnlessReferenced({ orgId, name: input.name, reference, templateId, industry }, tx);
          if (row) {
            const parties = await repository.insertParties(orgId, row.id, slots, tx);
            const group = toGroupDto(row, parties, publicBaseUrl);
            await audit.record(
              { orgId, actor: caller.actor, action: 'group.created', subjectType: 'group', subjectId: row.id, before: null, after: group },
              tx,
            );
            return { group, created: true };
          }
          const existing = await repository.findActiveGroupByReference(orgId, reference!, tx);
          if (existing) {
            const parties = await repository.listParties(orgId, existing.id, tx);
            return { group: toGroupDto(existing, parties, publicBaseUrl), created: false };
          }
        }
        throw new Error(`The reference of a group in organisation ${orgId} kept changing status; giving up.`);
      });
    },

    /** Adds a CUSTOM template from an operator's file (already parsed JSON). */
    async createCustomTemplate(orgId: string, file: unknown, actor: Actor): Promise<GroupTemplateDto> {
      const parsed = customTemplateFileSchema.safeParse(file);
      if (!parsed.success) throw AppError.validation(issuesOf(parsed.error, 'template'), 'The template file is invalid.');
      const organisation = isUuid(orgId) ? await organisations.findById(orgId, database.db) : undefined;
      if (!organisation) throw AppError.notFound('Organisation');
      // Curated copies first, so a custom code can never take a curated one's place in this organisation.
      await ensureCuratedTemplates(orgId);

      const content = parsed.data;
      return database.transaction(async (tx) => {
        const row = await repository.insertCustomTemplate(
          orgId,
          {
            code: content.code,
            name: content.name,
            description: content.description,
            industry: content.industry,
            roles: content.roles.map((role) => ({
              role_label: role.roleLabel,
              party_type: role.partyType,
              required: role.required,
              check_trigger: role.checkTrigger,
            })),
          },
          tx,
        );
        if (!row) throw AppError.field('code', `A template with code "${content.code}" already exists in this organisation.`);
        const template = toGroupTemplateDto(row);
        await audit.record(
          {
            orgId,
            actor,
            action: 'group_template.created',
            subjectType: 'group_template',
            subjectId: row.id,
            before: null,
            after: template,
          },
          tx,
        );
        return template;
      });
    },
  };
}

import ipaddr from 'ipaddr.js';
import type { DataAccess } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import { SCOPES, type Scope } from '../../shared/scopes.js';
import type { OrganisationsRepository } from '../organisations/organisations.repository.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import { displayPrefix, generateApiKey, hashApiKey } from './api-key-secret.js';
import type { ApiKeyRecord, ApiKeysRepository } from './api-keys.repository.js';

export type ApiKeyDto = {
  id: string;
  org_id: string;
  label: string | null;
  prefix: string;
  scopes: string[];
  allowed_ips: string[];
  burst_limit: number | null;
  daily_limit: number | null;
  expires_at: string | null;
  revoked_at: string | null;
  last_used_at: string | null;
  created_at: string;
};

export type CreateApiKeyInput = {
  orgId: string;
  scopes: string[];
  label?: string;
  expiresAt?: Date;
  allowIps?: string[];
  burstLimit?: number;
  dailyLimit?: number;
};

function toApiKeyDto(row: ApiKeyRecord): ApiKeyDto {
  return {
    id: row.id,
    org_id: row.orgId,
    label: row.label,
    prefix: row.displayPrefix,
    scopes: row.scopes,
    allowed_ips: row.allowedIps,
    burst_limit: row.burstLimit,
    daily_limit: row.dailyLimit,
    expires_at: row.expiresAt?.toISOString() ?? null,
    revoked_at: row.revokedAt?.toISOString() ?? null,
    last_used_at: row.lastUsedAt?.toISOString() ?? null,
    created_at: row.createdAt.toISOString(),
  };
}

/** Normalizes an address or CIDR range ("10.0.0.0/8", "2001:db8::/32", "192.0.2.7") to CIDR form. */
function normalizeCidr(value: string): string {
  const trimmed = value.trim();
  try {
    if (trimmed.includes('/')) {
      const [address, bits] = ipaddr.parseCIDR(trimmed);
      return `${address.toString()}/${bits}`;
    }
    const address = ipaddr.process(trimmed);
    return `${address.toString()}/${address.kind() === 'ipv4' ? 32 : 128}`;
  } catch {
    throw AppError.field('allowIps', `"${trimmed}" is not an IPv4/IPv6 address or CIDR range.`);
  }
}

const SYSTEM_ACTOR: Actor = { type: 'system', id: null };

export function createApiKeysService(deps: {
  database: DataAccess;
  keys: ApiKeysRepository;
  organisations: OrganisationsRepository;
  audit: AuditWriter;
}) {
  const { database, keys, organisations, audit } = deps;

  return {
    /** Issues a key; the plaintext is returned here and never again. */
    async create(input: CreateApiKeyInput, actor: Actor = SYSTEM_ACTOR): Promise<ApiKeyDto & { key: string }> {
      const scopes = [...new Set(input.scopes.map((scope) => scope.trim()).filter(Boolean))];
      const unknown = scopes.filter((scope) => !SCOPES.includes(scope as Scope));
      if (scopes.length === 0) throw AppError.field('scopes', `At least one scope is required (${SCOPES.join(', ')}).`);
      if (unknown.length) throw AppError.field('scopes', `Unknown scope(s): ${unknown.join(', ')}. Valid: ${SCOPES.join(', ')}.`);
      for (const [field, value] of [
        ['burstLimit', input.burstLimit],
        ['dailyLimit', input.dailyLimit],
      ] as const) {
        if (value !== undefined && (!Number.isInteger(value) || value < 1)) {
          throw AppError.field(field, 'Must be a whole number greater than zero.');
        }
      }
      if (input.expiresAt && Number.isNaN(input.expiresAt.getTime())) {
        throw AppError.field('expiresAt', 'Must be an ISO 8601 date-time.');
      }
      const allowedIps = [...new Set((input.allowIps ?? []).filter((ip) => ip.trim() !== '').map(normalizeCidr))];
      return database.transaction(async (tx) => {
        if (!isUuid(input.orgId) || !(await organisations.findById(input.orgId, tx))) throw AppError.notFound('Organisation');
        const plaintext = generateApiKey();
        const row = await keys.insert(
          {
            orgId: input.orgId,
            label: input.label ?? null,
            displayPrefix: displayPrefix(plaintext),
            keyHash: hashApiKey(plaintext),
            scopes,
            allowedIps,
            burstLimit: input.burstLimit ?? null,
            dailyLimit: input.dailyLimit ?? null,
            expiresAt: input.expiresAt ?? null,
          },
          tx,
        );
        const dto = toApiKeyDto(row);
        await audit.record(
          { orgId: dto.org_id, actor, action: 'api_key.created', subjectType: 'api_key', subjectId: dto.id, before: null, after: dto },
          tx,
        );
        return { ...dto, key: plaintext };
      });
    },

    async list(orgId: string): Promise<ApiKeyDto[]> {
      if (!isUuid(orgId) || !(await organisations.findById(orgId, database.db))) throw AppError.notFound('Organisation');
      return (await keys.listByOrg(orgId, database.db)).map(toApiKeyDto);
    },

    /** Revokes a key; revoking it again keeps the first revocation time and writes no second audit row. */
    async revoke(id: string, actor: Actor = SYSTEM_ACTOR): Promise<ApiKeyDto> {
      if (!isUuid(id)) throw AppError.notFound('API key');
      return database.transaction(async (tx) => {
        const existing = await keys.findById(id, tx);
        if (!existing) throw AppError.notFound('API key');
        if (existing.revokedAt) return toApiKeyDto(existing);
        const row = await keys.revoke(existing.orgId, id, tx);
        const after = toApiKeyDto(row!);
        await audit.record(
          {
            orgId: after.org_id,
            actor,
            action: 'api_key.revoked',
            subjectType: 'api_key',
            subjectId: id,
            before: toApiKeyDto(existing),
            after,
          },
          tx,
        );
        return after;
      });
    },
  };
}

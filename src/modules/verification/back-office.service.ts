import type { DataAccess, Executor } from '../../db/client.js';
import type { CustomerRow, NewCustomerRow } from '../../db/schema.js';
import { AppError } from '../../shared/app-error.js';
import type { Actor } from '../../shared/actor.js';
import type { ReviewColumnsWriter } from '../customers/review-columns.js';
import type { CustomerChangeRecorder } from '../customers/customer-changes.js';
import { toAmlBlock, toIndividualDto } from '../customers/customer-dto.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import { AML_STATUSES, type AmlStatus } from '../customers/customers.schemas.js';
import { NAME_PROVENANCE } from '../customers/customers.service.js';
import { countryCode } from '../../shared/country-code.js';
import type { EntitiesService } from '../entities/entities.service.js';
import type { OutboxRepository } from '../../shared/outbox.js';
import type { VerificationRepository } from './verification.repository.js';

export const VERDICTS = ['VERIFIED', 'FAILED', 'RESUBMIT'] as const;
export type Verdict = (typeof VERDICTS)[number];
/** Statuses an operator may set by screening; RESOLVED is reached only through a completed review. */
export const SCREENING_STATUSES = AML_STATUSES.filter((status) => status !== 'RESOLVED');

/**
 * What back-office staff do in the app, as domain operations (the operator CLI drives them):
 * portal submission, verification verdicts, AML screening results and review completion. Each
 * writes its audit row and events in its transaction.
 */
export function createBackOfficeService(deps: {
  database: DataAccess;
  customers: CustomersRepository;
  entities: Pick<EntitiesService, 'dtoOf'>;
  verifications: VerificationRepository;
  changes: CustomerChangeRecorder;
  outbox: OutboxRepository;
  reviewColumns: ReviewColumnsWriter;
}) {
  const { database, customers, entities, verifications, changes, outbox, reviewColumns } = deps;

  async function requireRecord(orgId: string, ref: string, tx: Executor): Promise<CustomerRow> {
    const row =
      (await customers.findByRef(orgId, 'individual', ref, tx, { forUpdate: true })) ??
      (await customers.findByRef(orgId, 'entity', ref, tx, { forUpdate: true }));
    if (!row) throw AppError.notFound('Customer or entity');
    return row;
  }

  const dtoOf = async (row: CustomerRow, tx: Executor) => (row.kind === 'entity' ? entities.dtoOf(row, tx) : toIndividualDto(row));

  async function apply(orgId: string, actor: Actor, action: string, row: CustomerRow, values: Partial<NewCustomerRow>, tx: Executor) {
    const updated = await customers.update(orgId, row.id, await reviewColumns.withReview(row, values, tx), tx);
    const dto = await dtoOf(updated, tx);
    await changes.record({ actor, action, before: row, after: updated, dto }, tx);
    return { updated, dto };
  }

  return {
    /** The person or contact completed the portal step: PENDING or AWAITING_RESUBMISSION → IN_PROGRESS. */
    async submit(orgId: string, ref: string, actor: Actor) {
      return database.transaction(async (tx) => {
        const row = await requireRecord(orgId, ref, tx);
        if (row.kycStatus !== 'PENDING' && row.kycStatus !== 'AWAITING_RESUBMISSION') {
          throw AppError.conflict(`Nothing to submit: the status is ${row.kycStatus} (expected PENDING or AWAITING_RESUBMISSION).`);
        }
        const verification = await verifications.latestFor(orgId, row.id, tx);
        if (verification) await verifications.complete(orgId, verification.id, 'IN_PROGRESS', null, tx);
        return (await apply(orgId, actor, 'verification.submitted', row, { kycStatus: 'IN_PROGRESS' }, tx)).dto;
      });
    },

    /** A reviewer's verdict on an IN_PROGRESS check; VERIFIED and FAILED are terminal and fire customer.kyc_completed. */
    async verdict(orgId: string, ref: string, input: { result: Verdict; legalName?: string; country?: string }, actor: Actor) {
      return database.transaction(async (tx) => {
        const row = await requireRecord(orgId, ref, tx);
        if (row.kycStatus !== 'IN_PROGRESS') {
          throw AppError.conflict(`A verdict needs a check in progress; the status is ${row.kycStatus}.`);
        }
        const now = new Date();
        const verification = await verifications.latestFor(orgId, row.id, tx);
        if (input.result === 'RESUBMIT') {
          if (verification) await verifications.complete(orgId, verification.id, 'AWAITING_RESUBMISSION', null, tx);
          return (await apply(orgId, actor, 'verification.resubmission_requested', row, { kycStatus: 'AWAITING_RESUBMISSION' }, tx)).dto;
        }
        const values: Partial<NewCustomerRow> = { kycStatus: input.result, kycCompletedAt: now };
        if (input.result === 'VERIFIED' && row.kind === 'individual') {
          const country = countryCode.safeParse(input.country ?? 'AUS');
          if (!country.success) throw AppError.field('country', 'Must be an ISO 3166-1 alpha-3 country code.');
          Object.assign(values, {
            verifiedLegalName: input.legalName ?? row.name,
            verifiedCountry: country.data,
            nameProvenanceRank: Math.max(row.nameProvenanceRank ?? 0, NAME_PROVENANCE.VERIFICATION_PROVIDER),
          });
        }
        if (verification) await verifications.complete(orgId, verification.id, input.result, now, tx);
        const { updated, dto } = await apply(orgId, actor, `verification.${input.result.toLowerCase()}`, row, values, tx);
        await outbox.record({ orgId, type: 'customer.kyc_completed', customerId: updated.id, customer: dto }, tx);
        return dto;
      });
    },

    /** AML screening results: status, the four flags and screened_at. */
    async setAml(
      orgId: string,
      ref: string,
      input: { status: AmlStatus; pep?: boolean; sanctions?: boolean; adverseMedia?: boolean; terrorism?: boolean },
      actor: Actor,
    ) {
      if (!(SCREENING_STATUSES as readonly string[]).includes(input.status)) {
        throw AppError.field('status', `Must be one of ${SCREENING_STATUSES.join(', ')}; RESOLVED is reached with aml resolve.`);
      }
      return database.transaction(async (tx) => {
        const row = await requireRecord(orgId, ref, tx);
        const { updated } = await apply(
          orgId,
          actor,
          'aml.screened',
          row,
          {
            amlStatus: input.status,
            amlScreenedAt: new Date(),
            amlPep: input.pep ?? false,
            amlSanctions: input.sanctions ?? false,
            amlAdverseMedia: input.adverseMedia ?? false,
            amlTerrorism: input.terrorism ?? false,
          },
          tx,
        );
        return toAmlBlock(updated);
      });
    },

    /** The compliance team finished reviewing the matches: NEEDS_REVIEW → RESOLVED, fires aml.review_completed. */
    async resolveAml(orgId: string, ref: string, actor: Actor) {
      return database.transaction(async (tx) => {
        const row = await requireRecord(orgId, ref, tx);
        if (row.amlStatus !== 'NEEDS_REVIEW')
          throw AppError.conflict(`Only a NEEDS_REVIEW screening can be resolved; the status is ${row.amlStatus}.`);
        const { updated, dto } = await apply(
          orgId,
          actor,
          'aml.review_completed',
          row,
          { amlStatus: 'RESOLVED', amlLastReviewedAt: new Date() },
          tx,
        );
        await outbox.record({ orgId, type: 'aml.review_completed', customerId: updated.id, customer: dto }, tx);
        return toAmlBlock(updated);
      });
    },
  };
}

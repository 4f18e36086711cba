import type { Executor } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { createAuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import { createOrganisationsRepository } from './organisations.repository.js';

/** What a charge pays for: the ledger row's reason and the record it points at. */
export type Charge = {
  cost: number;
  /** kyc_start, kyb_start, document_upload, document_request. */
  reason: string;
  /** The customer or entity the charge concerns (shown in the audit row). */
  customerId: string;
  verificationId?: string;
  documentId?: string;
  documentRequestId?: string;
  /** The 402 message's noun: "This check costs …", "This upload costs …". */
  what: string;
};

/**
 * Takes `cost` credits from the organisation in the caller's transaction: the balance, its ledger row
 * and the `organisation.credits_charged` audit row together. Too few credits: 402
 * `insufficient_credits` (details required/available), and the caller's transaction rolls back whatever
 * it had done, so nothing is started, stored or charged.
 */
export function createCreditCharger() {
  const organisations = createOrganisationsRepository();
  const audit = createAuditWriter();
  return async function charge(ctx: { orgId: string; actor: Actor }, charge: Charge, tx: Executor): Promise<void> {
    if (charge.cost <= 0) return;
    const { cost, reason } = charge;
    const charged = await organisations.adjustCredits(
      ctx.orgId,
      -cost,
      { reason, verificationId: charge.verificationId, documentId: charge.documentId, documentRequestId: charge.documentRequestId },
      tx,
    );
    if (!charged) {
      const org = await organisations.findById(ctx.orgId, tx);
      throw new AppError(
        'insufficient_credits',
        402,
        `${charge.what} costs ${cost} credit(s); the organisation has ${org?.credits ?? 0}. Nothing was started or charged.`,
        {
          required: cost,
          available: org?.credits ?? 0,
        },
      );
    }
    // A balance change is a change of the organisation's record: the trail shows it beside the ledger row.
    await audit.record(
      {
        orgId: ctx.orgId,
        actor: ctx.actor,
        action: 'organisation.credits_charged',
        subjectType: 'organisation',
        subjectId: ctx.orgId,
        before: { credits: charged.credits + cost },
        after: {
          credits: charged.credits,
          reason,
          ...(charge.verificationId ? { verification_id: charge.verificationId } : {}),
          ...(charge.documentId ? { document_id: charge.documentId } : {}),
          ...(charge.documentRequestId ? { document_request_id: charge.documentRequestId } : {}),
          customer_id: charge.customerId,
        },
      },
      tx,
    );
  };
}
export type CreditCharger = ReturnType<typeof createCreditCharger>;

export type Payer = 'organization' | 'customer';

/**
 * Who pays an emailing check or request: the one the caller asked for,
 * else the record's own default, else the organisation's (`organization` when none is set).
 */
export function createPayerResolver() {
  const organisations = createOrganisationsRepository();
  return async function payerFor(
    orgId: string,
    record: { defaultPayer: Payer | null },
    requested: Payer | undefined,
    tx: Executor,
  ): Promise<Payer> {
    if (requested) return requested;
    if (record.defaultPayer) return record.defaultPayer;
    return (await organisations.findById(orgId, tx))?.defaultPayer ?? 'organization';
  };
}
export type PayerResolver = ReturnType<typeof createPayerResolver>;

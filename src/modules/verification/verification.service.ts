import type { Executor } from '../../db/client.js';
import type { CustomerRow } from '../../db/schema.js';
import { AppError } from '../../shared/app-error.js';
import { Issues } from '../../shared/issues.js';
import { linkTokenHash, newLinkToken } from '../../shared/link-tokens.js';
import type { ReviewColumnsWriter } from '../customers/review-columns.js';
import type { CustomerChangeRecorder } from '../customers/customer-changes.js';
import { toIndividualDto } from '../customers/customer-dto.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import type { RequestContext } from '../../shared/request-context.js';
import type { EntitiesRepository } from '../entities/entities.repository.js';
import type { EntitiesService } from '../entities/entities.service.js';
import { toBeneficialOwnerDto } from '../entities/entity-dto.js';
import type { EmailsRepository } from '../emails/emails.repository.js';
import type { CreditCharger, PayerResolver } from '../organisations/credits.service.js';
import { priceOf, type KybMethod } from './pricing.js';
import type { StartKybBody, StartKycBody } from './verification.schemas.js';
import type { VerificationRepository } from './verification.repository.js';

/** Statuses from which a verification may be started (again). */
const STARTABLE = new Set(['NOT_STARTED', 'NOT_REQUIRED', 'FAILED']);
/** Entity types verified by hand only; SMSF is treated as a trust. */
const MANUAL_ONLY_TYPES = new Set(['TRUST', 'PARTNERSHIP', 'SMSF']);

type Lane = { kind: 'KYC' } | { kind: 'KYB'; method: KybMethod };

export function createVerificationService(deps: {
  publicBaseUrl: string;
  customers: CustomersRepository;
  entityOwners: EntitiesRepository;
  entities: Pick<EntitiesService, 'dtoOf'>;
  verifications: VerificationRepository;
  emails: EmailsRepository;
  changes: CustomerChangeRecorder;
  charge: CreditCharger;
  payerFor: PayerResolver;
  reviewColumns: ReviewColumnsWriter;
}) {
  const { customers, entityOwners, entities, verifications, emails, changes, charge, payerFor, reviewColumns } = deps;

  /**
   * Arms a check on `subject` in the caller's transaction: conflict check, billing (ledger row and
   * balance together), the verification record, the status change with its audit row and event,
   * and the queued email. Any error rolls all of it back: nothing armed, charged or emailed.
   */
  async function arm(
    ctx: RequestContext,
    tx: Executor,
    input: {
      subject: CustomerRow;
      lane: Lane;
      payer: 'organization' | 'customer';
      recipient: string | undefined;
      recipientName: string;
      customMessage?: string;
      eddCheckTypes: string[];
      beneficialOwnerId?: string;
      action: string;
    },
  ): Promise<{ updated: CustomerRow; link: string | undefined }> {
    const { subject, lane } = input;
    if (!STARTABLE.has(subject.kycStatus)) {
      throw AppError.conflict(`A verification was already started (status ${subject.kycStatus}).`, { status: subject.kycStatus });
    }
    const emailing = !(lane.kind === 'KYB' && lane.method === 'manual');
    const issues = new Issues();
    if (emailing && !input.recipient) {
      issues.add(
        lane.kind === 'KYB' ? 'contact' : 'email',
        lane.kind === 'KYB'
          ? 'This lane emails the contact person: set a contact with an email first.'
          : 'The person has no email address.',
      );
    }
    if (!emailing && input.eddCheckTypes.length > 0) issues.add('eddCheckTypes', 'EDD add-ons apply to the emailing lanes only.');
    issues.throwIfAny();

    const payer = emailing ? input.payer : 'organization';
    const cost = priceOf(lane, input.eddCheckTypes.length);
    const token = emailing ? newLinkToken() : null;
    const link = token ? `${deps.publicBaseUrl}/${payer === 'customer' ? 'pay' : 'verify'}/${token}` : undefined;
    const status = emailing ? 'PENDING' : 'IN_PROGRESS';
    const verification = await verifications.insert(
      {
        orgId: ctx.orgId,
        customerId: subject.id,
        beneficialOwnerId: input.beneficialOwnerId,
        kind: lane.kind,
        lane: lane.kind === 'KYB' ? lane.method : 'link',
        payer,
        status: payer === 'customer' && emailing ? 'PAYMENT_PENDING' : status,
        cost: payer === 'organization' ? cost : 0,
        recipientEmail: emailing ? input.recipient : null,
        customMessage: input.customMessage,
        eddCheckTypes: input.eddCheckTypes,
      },
      token ? linkTokenHash(token) : null,
      tx,
    );
    if (payer === 'organization') {
      const reason = `${lane.kind.toLowerCase()}_start`;
      await charge(ctx, { cost, reason, verificationId: verification.id, customerId: subject.id, what: 'This check' }, tx);
    }
    const updated = await customers.update(
      ctx.orgId,
      subject.id,
      await reviewColumns.withReview(subject, { kycStatus: status, kycStartedAt: new Date(), kycCompletedAt: null }, tx),
      tx,
    );
    const dto = updated.kind === 'entity' ? await entities.dtoOf(updated, tx) : toIndividualDto(updated);
    await changes.record({ actor: ctx.actor, action: input.action, before: subject, after: updated, dto }, tx);
    if (emailing && link && input.recipient) {
      const what = lane.kind === 'KYB' ? `business verification for ${subject.name}` : 'identity verification';
      await emails.queue(
        {
          orgId: ctx.orgId,
          recipient: input.recipient,
          subject: payer === 'customer' ? `Action needed: pay for and complete your ${what}` : `Action needed: complete your ${what}`,
          body: [
            `Hello ${input.recipientName},`,
            '',
            `You have been asked to complete ${what}.`,
            ...(input.customMessage ? ['', input.customMessage] : []),
            '',
            payer === 'customer' ? `Pay by card and start here: ${link}` : `Start here: ${link}`,
            '',
            'This link is personal; do not forward it.',
          ].join('\n'),
          link,
          verificationId: verification.id,
        },
        tx,
      );
    }
    return { updated, link };
  }

  return {
    /** POST /entities/{id}/kyb. */
    async startKyb(ctx: RequestContext & { features: ReadonlySet<string> }, ref: string, body: StartKybBody) {
      const request = body ?? {};
      return ctx.transaction(async (tx) => {
        const entity = await customers.findByRef(ctx.orgId, 'entity', ref, tx, { forUpdate: true });
        if (!entity) throw AppError.notFound('Entity');
        const manualOnly = MANUAL_ONLY_TYPES.has(entity.type);
        const method: KybMethod = request.method ?? (manualOnly ? 'manual' : 'automated');
        if (manualOnly && method !== 'manual') {
          throw AppError.field('method', `${entity.type} entities support only the manual method.`);
        }
        if (method === 'contact_led' && !ctx.features.has('kyb_extra_methods')) {
          throw new AppError('feature_disabled', 403, 'The contact_led method needs the kyb_extra_methods feature.', {
            feature: 'kyb_extra_methods',
          });
        }
        const contact = entity.contactCustomerId ? await customers.findById(ctx.orgId, entity.contactCustomerId, tx) : undefined;
        const { updated, link } = await arm(ctx, tx, {
          subject: entity,
          lane: { kind: 'KYB', method },
          payer: await payerFor(ctx.orgId, entity, request.payer, tx),
          recipient: contact?.email ?? undefined,
          recipientName: contact?.name ?? entity.name,
          customMessage: request.customMessage,
          eddCheckTypes: [...new Set(request.eddCheckTypes ?? [])],
          action: 'entity.kyb_started',
        });
        return { ...(await entities.dtoOf(updated, tx)), ...(link ? { verification_link: link } : {}) };
      });
    },

    /** POST /customers/{id}/kyc: emails the person, or their representative when one is recorded. */
    async startKyc(ctx: RequestContext, ref: string, body: StartKycBody) {
      const request = body ?? {};
      return ctx.transaction(async (tx) => {
        const person = await customers.findByRef(ctx.orgId, 'individual', ref, tx, { forUpdate: true });
        if (!person) throw AppError.notFound('Customer');
        const { updated, link } = await arm(ctx, tx, {
          subject: person,
          lane: { kind: 'KYC' },
          payer: await payerFor(ctx.orgId, person, request.payer, tx),
          recipient: person.representativeEmail ?? person.email ?? undefined,
          recipientName: person.representativeName ?? person.name,
          customMessage: request.customMessage,
          eddCheckTypes: [...new Set(request.eddCheckTypes ?? [])],
          action: 'customer.kyc_started',
        });
        return { ...toIndividualDto(updated), ...(link ? { verification_link: link } : {}) };
      });
    },

    /** POST /entities/{id}/ubos/{uboId}/send-link: starts the owner's KYC like a KYC start. */
    async sendOwnerLink(ctx: RequestContext, ref: string, ownerId: string, body: StartKycBody) {
      const request = body ?? {};
      return ctx.transaction(async (tx) => {
        const entity = await customers.findByRef(ctx.orgId, 'entity', ref, tx);
        if (!entity) throw AppError.notFound('Entity');
        const owner = await entityOwners.findOwner(ctx.orgId, entity.id, ownerId, tx);
        if (!owner) throw AppError.notFound('Beneficial owner');
        const person = await customers.findById(ctx.orgId, owner.person.id, tx, { forUpdate: true });
        const { link } = await arm(ctx, tx, {
          subject: person!,
          lane: { kind: 'KYC' },
          payer: await payerFor(ctx.orgId, entity, request.payer, tx),
          recipient: person!.representativeEmail ?? person!.email ?? undefined,
          recipientName: person!.representativeName ?? person!.name,
          customMessage: request.customMessage,
          eddCheckTypes: [...new Set(request.eddCheckTypes ?? [])],
          beneficialOwnerId: owner.owner.id,
          action: 'beneficial_owner.kyc_started',
        });
        const refreshed = await entityOwners.findOwner(ctx.orgId, entity.id, ownerId, tx);
        return { ...toBeneficialOwnerDto(refreshed!), ...(link ? { verification_link: link } : {}) };
      });
    },
  };
}

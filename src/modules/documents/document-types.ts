/**
 * The fixed catalogue of entity document types (docs/decisions.md, "Entity documents"): the codes
 * uploads and document requests name, served at GET /v1/document-types. Codes are stable; new ones may
 * be added, none removed or renamed.
 */
export const DOCUMENT_TYPES = [
  { code: 'TRUST_DEED', name: 'Trust deed', description: 'The deed establishing a trust, with any variations.', entityTypes: ['TRUST'] },
  {
    code: 'PARTNERSHIP_AGREEMENT',
    name: 'Partnership agreement',
    description: 'The agreement between the partners of a partnership.',
    entityTypes: ['PARTNERSHIP'],
  },
  {
    code: 'SMSF_DEED',
    name: 'SMSF trust deed',
    description: 'The trust deed of a self-managed superannuation fund.',
    entityTypes: ['SMSF'],
  },
  {
    code: 'CERTIFICATE_OF_REGISTRATION',
    name: 'Certificate of registration',
    description: 'A certificate of registration or incorporation issued by a registrar.',
    entityTypes: ['COMPANY', 'OTHER'],
  },
  {
    code: 'COMPANY_EXTRACT',
    name: 'Company extract',
    description: 'A current or historical extract from a company register.',
    entityTypes: ['COMPANY'],
  },
  {
    code: 'ID_OF_OFFICEHOLDER',
    name: 'Identity document of an officeholder',
    description: 'An identity document of a director, trustee, partner or other officeholder.',
    entityTypes: ['COMPANY', 'TRUST', 'PARTNERSHIP', 'SMSF', 'OTHER'],
  },
  {
    code: 'OTHER',
    name: 'Other document',
    description: 'Any other document supporting the entity’s verification; describe it.',
    entityTypes: ['COMPANY', 'TRUST', 'PARTNERSHIP', 'SMSF', 'OTHER'],
  },
] as const;

export type DocumentTypeCode = (typeof DOCUMENT_TYPES)[number]['code'];
export const DOCUMENT_TYPE_CODES = DOCUMENT_TYPES.map((type) => type.code) as [DocumentTypeCode, ...DocumentTypeCode[]];

/** What the service accepts, by content; checked on the first bytes, never on a name or a declared type. */
export const DOCUMENT_MEDIA_TYPES = ['application/pdf', 'image/png', 'image/jpeg'] as const;
export type DocumentMediaType = (typeof DOCUMENT_MEDIA_TYPES)[number];

/** The largest document accepted: 10 MiB. */
export const MAX_DOCUMENT_BYTES = 10 * 1024 * 1024;
/** Every upload and every document request costs this many credits, under the KYB payer rules. */
export const DOCUMENT_PRICE = 1;

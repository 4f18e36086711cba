import { createHash, randomBytes } from 'node:crypto';

/** What a link token looks like: 32 random bytes, base64url. Anything else is not looked up at all. */
export const LINK_TOKEN_PATTERN = /^[A-Za-z0-9_-]{43}$/;

export function newLinkToken(): string {
  return randomBytes(32).toString('base64url');
}

/** The directory key of a link token: its SHA-256, so the database never holds a usable token. */
export function linkTokenHash(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

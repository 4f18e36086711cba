import { hash, randomInt } from 'node:crypto';

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const API_KEY_PREFIX = 'svc_live_';
const SECRET_LENGTH = 40;
const KEY_PATTERN = /^svc_live_[0-9A-Za-z]{32,}$/;

/** `svc_live_` + 40 base62 characters (≈238 bits), drawn with a CSPRNG and no modulo bias. */
export function generateApiKey(): string {
  let secret = '';
  for (let i = 0; i < SECRET_LENGTH; i += 1) secret += BASE62[randomInt(BASE62.length)];
  return API_KEY_PREFIX + secret;
}

export function hashApiKey(plaintext: string): string {
  // One-shot: no Hash object per request, as createHash would make.
  return hash('sha256', plaintext, 'hex');
}

export function looksLikeApiKey(value: string): boolean {
  return KEY_PATTERN.test(value);
}

/** What may be shown of a key after creation: the fixed prefix and four characters. */
export function displayPrefix(plaintext: string): string {
  return plaintext.slice(0, API_KEY_PREFIX.length + 4);
}

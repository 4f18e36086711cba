import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createTextSealer, LINK_KEY_FILE, parseLinkKey, resolveLinkKey, SealedTextError } from './text-sealer.js';

const folders: string[] = [];
const tempDir = () => {
  const folder = mkdtempSync(join(tmpdir(), 'link-key-'));
  folders.push(folder);
  return folder;
};
afterEach(() => {
  for (const folder of folders.splice(0)) rmSync(folder, { recursive: true, force: true });
});

describe('text sealer', () => {
  it('when text is sealed, the value holds none of it and opens to the same text', () => {
    const sealer = createTextSealer(randomBytes(32));
    const text = 'Start here: https://app.example.test/verify/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcde';
    const sealed = sealer.seal(text);
    expect(sealer.isSealed(sealed)).toBe(true);
    expect(sealed).not.toContain('AbCdEfGhIj');
    expect(sealer.open(sealed)).toBe(text);
    // A fresh IV each time: equal texts do not look equal at rest.
    expect(sealer.seal(text)).not.toBe(sealed);
  });

  it('when a value was written before sealing, it opens as it is', () => {
    expect(createTextSealer(randomBytes(32)).open('plain body')).toBe('plain body');
  });

  it('when a sealed value is opened under another key or was altered, it throws a SealedTextError naming LINK_ENCRYPTION_KEY', () => {
    const sealed = createTextSealer(randomBytes(32)).seal('secret');
    expect(() => createTextSealer(randomBytes(32)).open(sealed)).toThrow(SealedTextError);
    const sealer = createTextSealer(randomBytes(32));
    const altered = sealer.seal('secret').slice(0, -2) + 'AA';
    expect(() => sealer.open(altered)).toThrow(/LINK_ENCRYPTION_KEY/);
  });

  it('when LINK_ENCRYPTION_KEY is 64 hex digits or base64 of 32 bytes, it is read as those bytes; anything else is refused', () => {
    const bytes = randomBytes(32);
    expect(parseLinkKey(bytes.toString('hex'))).toEqual(bytes);
    expect(parseLinkKey(bytes.toString('base64'))).toEqual(bytes);
    expect(parseLinkKey(bytes.toString('base64url'))).toEqual(bytes);
    expect(parseLinkKey('ab'.repeat(31))).toBeUndefined();
    expect(parseLinkKey(randomBytes(24).toString('base64'))).toBeUndefined();
  });

  it('when no key is configured, one is drawn into DATA_DIR readable by the owner only, and every later resolution reads the same key', () => {
    const dataDir = join(tempDir(), 'nested');
    const first = resolveLinkKey({ key: undefined, dataDir });
    expect(first.source).toBe('file');
    expect(statSync(join(dataDir, LINK_KEY_FILE)).mode & 0o777).toBe(0o600);
    expect(resolveLinkKey({ key: undefined, dataDir }).key).toEqual(first.key);
    const configured = randomBytes(32);
    expect(resolveLinkKey({ key: configured, dataDir })).toEqual({ key: configured, source: 'environment' });
  });

  it('when the key file holds something else, it refuses to start rather than draw a new key', () => {
    const dataDir = tempDir();
    writeFileSync(join(dataDir, LINK_KEY_FILE), 'not a key\n');
    expect(() => resolveLinkKey({ key: undefined, dataDir })).toThrow(/does not hold a link encryption key/);
    expect(readFileSync(join(dataDir, LINK_KEY_FILE), 'utf8')).toBe('not a key\n');
  });
});

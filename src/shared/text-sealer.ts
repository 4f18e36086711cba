import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import { linkSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Text that holds a usable link (an email's body, a stored reply that carries `upload_url` or
 * `verification_link`) is kept sealed at rest: AES-256-GCM under a key that lives outside the
 * database, so a database reader or a backup holds no usable link.
 */
export type TextSealer = {
  seal(text: string): string;
  /** The text of a sealed value; text written before sealing existed is returned as it is. */
  open(value: string): string;
  isSealed(value: string): boolean;
};

const PREFIX = 'sealed:v1:';
const IV_BYTES = 12;
const TAG_BYTES = 16;
const LINK_KEY_BYTES = 32;
export const LINK_KEY_FILE = 'link-encryption.key';

export class SealedTextError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SealedTextError';
  }
}

export function createTextSealer(key: Buffer): TextSealer {
  if (key.length !== LINK_KEY_BYTES) throw new Error(`a sealing key is ${LINK_KEY_BYTES} bytes, not ${key.length}`);
  // Named in the error of a value that does not open, so an operator can tell which key is in use without seeing it.
  const keyId = createHash('sha256').update(key).digest('hex').slice(0, 8);
  return {
    seal(text) {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', key, iv);
      const sealed = Buffer.concat([cipher.update(text, 'utf8'), cipher.final()]);
      return PREFIX + Buffer.concat([iv, sealed, cipher.getAuthTag()]).toString('base64url');
    },
    open(value) {
      if (!value.startsWith(PREFIX)) return value;
      const bytes = Buffer.from(value.slice(PREFIX.length), 'base64url');
      try {
        const decipher = createDecipheriv('aes-256-gcm', key, bytes.subarray(0, IV_BYTES));
        decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES));
        return Buffer.concat([decipher.update(bytes.subarray(IV_BYTES, bytes.length - TAG_BYTES)), decipher.final()]).toString('utf8');
      } catch {
        throw new SealedTextError(
          `A sealed value does not open with the link encryption key in use (key id ${keyId}): LINK_ENCRYPTION_KEY must be the key that sealed it.`,
        );
      }
    },
    isSealed(value) {
      return value.startsWith(PREFIX);
    },
  };
}

/**
 * LINK_ENCRYPTION_KEY as bytes: 64 hex digits, or 32 bytes in base64 (standard or URL-safe).
 * Undefined for anything else, which the configuration names as a bad value.
 */
export function parseLinkKey(value: string): Buffer | undefined {
  const text = value.trim();
  if (/^[0-9a-fA-F]{64}$/.test(text)) return Buffer.from(text, 'hex');
  if (/^[A-Za-z0-9+/_-]{43}=?$/.test(text)) {
    const bytes = Buffer.from(text.replace(/\+/g, '-').replace(/\//g, '_').replace(/=$/, ''), 'base64url');
    return bytes.length === LINK_KEY_BYTES ? bytes : undefined;
  }
  return undefined;
}

/**
 * The key of this deployment: LINK_ENCRYPTION_KEY when set, else `link-encryption.key` in DATA_DIR,
 * drawn on first use (mode 0600). Instances started together agree on one file: each writes its own
 * candidate aside and links it into place, and the link fails for all but the first.
 */
export function resolveLinkKey(options: { key: Buffer | undefined; dataDir: string }): {
  key: Buffer;
  source: 'environment' | 'file';
  path?: string;
} {
  if (options.key) return { key: options.key, source: 'environment' };
  const path = join(options.dataDir, LINK_KEY_FILE);
  const existing = readKeyFile(path);
  if (existing) return { key: existing, source: 'file', path };
  mkdirSync(options.dataDir, { recursive: true });
  const candidate = `${path}.${process.pid}.${randomBytes(4).toString('hex')}`;
  writeFileSync(candidate, `${randomBytes(LINK_KEY_BYTES).toString('hex')}\n`, { mode: 0o600, flag: 'wx' });
  try {
    linkSync(candidate, path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
  } finally {
    unlinkSync(candidate);
  }
  const key = readKeyFile(path);
  if (!key) throw new Error(`${path} does not hold a link encryption key (64 hex digits)`);
  return { key, source: 'file', path };
}

function readKeyFile(path: string): Buffer | undefined {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
  const key = parseLinkKey(text);
  if (!key) throw new Error(`${path} does not hold a link encryption key (64 hex digits)`);
  return key;
}

/** The sealer of this deployment's configuration (LINK_ENCRYPTION_KEY, else the key file in DATA_DIR). */
export function linkSealerFor(config: { linkEncryptionKey: Buffer | undefined; dataDir: string }): TextSealer {
  return createTextSealer(resolveLinkKey({ key: config.linkEncryptionKey, dataDir: config.dataDir }).key);
}

/** linkSealerFor, its key read (or created) at its first use: a command that seals nothing touches no key file. */
export function lazyLinkSealer(config: { linkEncryptionKey: Buffer | undefined; dataDir: string }): TextSealer {
  let sealer: TextSealer | undefined;
  const key = (): TextSealer => (sealer ??= linkSealerFor(config));
  return { seal: (text) => key().seal(text), open: (value) => key().open(value), isSealed: (value) => key().isSealed(value) };
}

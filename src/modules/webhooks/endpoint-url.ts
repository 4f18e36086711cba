import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { isIP, type LookupFunction } from 'node:net';
import ipaddr from 'ipaddr.js';

export const MAX_ENDPOINT_URL_LENGTH = 2048;

/** Why a webhook target was refused; the message names the address so operators can act on it. */
export class UnsafeWebhookTargetError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UnsafeWebhookTargetError';
  }
}

/**
 * Only globally routable unicast addresses are deliverable. An allowlist (ipaddr.js `range()` must be
 * `unicast`) rather than a denylist, so loopback, private, link-local (cloud metadata 169.254.169.254),
 * CGNAT, unique-local IPv6 (fd00:ec2::254), multicast, reserved and the translation prefixes that can
 * embed a private IPv4 (6to4, Teredo, NAT64) are all refused, including ones added to the registry later.
 */
export function isPublicAddress(address: string): boolean {
  if (!ipaddr.isValid(address)) return false;
  let parsed = ipaddr.parse(address);
  if (parsed.kind() === 'ipv6' && (parsed as ipaddr.IPv6).isIPv4MappedAddress()) {
    parsed = (parsed as ipaddr.IPv6).toIPv4Address();
  }
  return parsed.range() === 'unicast';
}

function bareHostname(url: URL): string {
  return url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
}

/** Syntax and scheme rules; returns the normalized URL or a message for the operator. */
export function parseEndpointUrl(raw: string, options: { allowPrivate: boolean }): { url: URL } | { problem: string } {
  const trimmed = raw.trim();
  if (trimmed.length === 0) return { problem: 'A URL is required.' };
  if (trimmed.length > MAX_ENDPOINT_URL_LENGTH) return { problem: `Must be at most ${MAX_ENDPOINT_URL_LENGTH} characters.` };
  let url: URL;
  try {
    url = new URL(trimmed);
  } catch {
    return { problem: 'Must be an absolute URL.' };
  }
  const allowedSchemes = options.allowPrivate ? ['https:', 'http:'] : ['https:'];
  if (!allowedSchemes.includes(url.protocol)) {
    return { problem: options.allowPrivate ? 'Must be an http or https URL.' : 'Must be an https URL.' };
  }
  if (url.username || url.password) return { problem: 'Must not contain credentials; authenticate with the signature instead.' };
  if (url.hash) return { problem: 'Must not contain a fragment.' };
  return { url };
}

/** Every address the host resolves to; an IP literal resolves to itself. */
export async function resolveHost(hostname: string): Promise<LookupAddress[]> {
  const bare = hostname.startsWith('[') ? hostname.slice(1, -1) : hostname;
  const family = isIP(bare);
  if (family) return [{ address: bare, family }];
  return new Promise((resolve, reject) => {
    dnsLookup(bare, { all: true, verbatim: true }, (error, addresses) => (error ? reject(error) : resolve(addresses)));
  });
}

/**
 * Refuses a target any of whose addresses is not public (one private answer is enough for an
 * attacker who controls the DNS to win a race), unless private targets are allowed.
 */
export async function assertDeliverableTarget(url: URL, options: { allowPrivate: boolean }): Promise<void> {
  if (options.allowPrivate) return;
  const hostname = bareHostname(url);
  let addresses: LookupAddress[];
  try {
    addresses = await resolveHost(hostname);
  } catch (error) {
    throw new UnsafeWebhookTargetError(`Host "${hostname}" could not be resolved (${(error as NodeJS.ErrnoException).code ?? 'lookup failed'}).`);
  }
  if (addresses.length === 0) throw new UnsafeWebhookTargetError(`Host "${hostname}" has no address.`);
  const blocked = addresses.find((entry) => !isPublicAddress(entry.address));
  if (blocked) {
    throw new UnsafeWebhookTargetError(`Host "${hostname}" resolves to ${blocked.address}, which is not a public address.`);
  }
}

/**
 * A `lookup` for http(s) agents that checks the addresses the socket is about to connect to, so a
 * DNS answer that changes between validation and delivery (rebinding) cannot reach a private address.
 * Node skips `lookup` for IP literals; those are checked by `assertDeliverableTarget` beforehand.
 */
export function guardedLookup(options: { allowPrivate: boolean }): LookupFunction {
  return (hostname, lookupOptions, callback) => {
    dnsLookup(hostname, { ...lookupOptions, all: true }, (error, addresses) => {
      if (error) return callback(error, '', 0);
      const list = addresses as unknown as LookupAddress[];
      if (!options.allowPrivate) {
        const blocked = list.find((entry) => !isPublicAddress(entry.address));
        if (blocked) {
          return callback(
            new UnsafeWebhookTargetError(`Host "${hostname}" resolves to ${blocked.address}, which is not a public address.`),
            '',
            0,
          );
        }
      }
      if (list.length === 0) return callback(new UnsafeWebhookTargetError(`Host "${hostname}" has no address.`), '', 0);
      if ((lookupOptions as { all?: boolean }).all) {
        return (callback as unknown as (error: null, addresses: LookupAddress[]) => void)(null, list);
      }
      callback(null, list[0]!.address, list[0]!.family);
    });
  };
}

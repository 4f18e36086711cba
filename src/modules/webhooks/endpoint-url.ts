import { lookup as dnsLookup } from 'node:dns/promises';
import type { LookupAddress } from 'node:dns';
import { BlockList, isIP, type LookupFunction } from 'node:net';

const MAX_ENDPOINT_URL_LENGTH = 2048;

/**
 * The one answer to every refusal that rests on what DNS said about a host name: that it resolves to
 * a private address, to none, or not at all. Anyone allowed to register an endpoint would otherwise
 * learn through it what internal names exist and where they point (`https://vm/` "resolves to
 * 127.0.0.1"; an unknown name ENOTFOUND). An address written in the URL itself is named: the caller
 * wrote it.
 */
export const NOT_A_PUBLIC_HOST =
  'Not a public address: webhooks go only to host names that resolve to public addresses, and this one cannot be used.';

/**
 * Why a webhook target was refused. `message` may be shown to anyone; `detail` also says what DNS
 * answered (the address, or the resolver's error), for the operator's CLI only.
 */
export class UnsafeWebhookTargetError extends Error {
  readonly detail: string;
  constructor(message: string, detail: string = message) {
    super(message);
    this.name = 'UnsafeWebhookTargetError';
    this.detail = detail;
  }
}

/** A refusal that rests on DNS: the generic answer, with what DNS said as the operator's detail. */
const dnsRefusal = (detail: string) => new UnsafeWebhookTargetError(NOT_A_PUBLIC_HOST, detail);

/**
 * Where webhooks may go. WEBHOOK_ALLOW_PRIVATE_URLS (development only) lifts the whole SSRF guard:
 * http, private addresses and any port. Otherwise: https to a globally reachable address on 443 or a
 * port of WEBHOOK_ALLOWED_PORTS.
 */
export type WebhookTargetPolicy = {
  allowPrivateUrls: boolean;
  allowedPorts?: readonly number[];
};

export function webhookTargetPolicy(config: {
  webhookAllowPrivateUrls: boolean;
  webhookAllowedPorts: readonly number[];
}): WebhookTargetPolicy {
  return { allowPrivateUrls: config.webhookAllowPrivateUrls, allowedPorts: config.webhookAllowedPorts };
}

/**
 * Every address a host name resolves to (the shape of `dns.lookup` with `all: true`). Injectable so
 * a test can make a name resolve to what an attacker's DNS would answer.
 */
export type ResolveHost = (hostname: string, options?: { family?: number; hints?: number }) => Promise<LookupAddress[]>;

const systemResolve: ResolveHost = (hostname, options = {}) =>
  dnsLookup(hostname, { family: options.family ?? 0, hints: options.hints, all: true, verbatim: true });

type Block = { cidr: string; name: string };

/**
 * The entries of the IANA special-purpose address registries whose "Globally Reachable" is False or
 * N/A (iana-ipv4-special-registry and iana-ipv6-special-registry, as published in 2025; read
 * 2026-01), plus IPv4 multicast (224.0.0.0/4, its own registry) and the deprecated IPv6 ranges that
 * left the special registry but are still not unicast destinations: IPv4-compatible ::/96
 * (RFC 4291) and site-local fec0::/10 (RFC 3879).
 *
 * Matched with node:net's BlockList, whose parser is the system's inet_pton and which judges an
 * IPv4-mapped address (::ffff:a.b.c.d) by the IPv4 rules. Not ipaddr.js (2.5): its `range()`
 * calls ::/96 "unicast", so [::7f00:1] (what WHATWG URL makes of [::127.0.0.1]) passed, and its
 * parser reads `::8.8.8.8`, the dotted form resolvers print for ::/96, as IPv4-mapped 8.8.8.8.
 */
const NOT_GLOBALLY_REACHABLE: readonly Block[] = [
  { cidr: '0.0.0.0/8', name: '"this network", RFC 791' },
  { cidr: '10.0.0.0/8', name: 'private-use, RFC 1918' },
  { cidr: '100.64.0.0/10', name: 'shared address space (CGNAT), RFC 6598' },
  { cidr: '127.0.0.0/8', name: 'loopback, RFC 1122' },
  { cidr: '169.254.0.0/16', name: 'link-local, RFC 3927' },
  { cidr: '172.16.0.0/12', name: 'private-use, RFC 1918' },
  { cidr: '192.0.0.0/24', name: 'IETF protocol assignments, RFC 6890' },
  { cidr: '192.0.2.0/24', name: 'documentation (TEST-NET-1), RFC 5737' },
  { cidr: '192.88.99.0/24', name: 'deprecated 6to4 relay anycast, RFC 7526' },
  { cidr: '192.168.0.0/16', name: 'private-use, RFC 1918' },
  { cidr: '198.18.0.0/15', name: 'benchmarking, RFC 2544' },
  { cidr: '198.51.100.0/24', name: 'documentation (TEST-NET-2), RFC 5737' },
  { cidr: '203.0.113.0/24', name: 'documentation (TEST-NET-3), RFC 5737' },
  { cidr: '224.0.0.0/4', name: 'multicast, RFC 5771' },
  { cidr: '240.0.0.0/4', name: 'reserved, RFC 1112' },
  { cidr: '255.255.255.255/32', name: 'limited broadcast, RFC 919' },

  { cidr: '::/128', name: 'unspecified, RFC 4291' },
  { cidr: '::1/128', name: 'loopback, RFC 4291' },
  { cidr: '::/96', name: 'deprecated IPv4-compatible, RFC 4291' },
  // The registry calls the well-known NAT64 prefix globally reachable, but it reaches the IPv4
  // address inside through whatever translator is near the sender, private or not; a receiver
  // registers its own address instead.
  { cidr: '64:ff9b::/96', name: 'IPv4/IPv6 translation (NAT64), RFC 6052' },
  { cidr: '64:ff9b:1::/48', name: 'local-use IPv4/IPv6 translation, RFC 8215' },
  { cidr: '100::/64', name: 'discard-only, RFC 6666' },
  { cidr: '100:0:0:1::/64', name: 'dummy IPv6 prefix' },
  { cidr: '2001::/23', name: 'IETF protocol assignments (Teredo, benchmarking, ORCHID), RFC 2928' },
  { cidr: '2001:db8::/32', name: 'documentation, RFC 3849' },
  { cidr: '2002::/16', name: '6to4, RFC 3056' },
  { cidr: '3fff::/20', name: 'documentation, RFC 9637' },
  { cidr: '5f00::/16', name: 'segment routing (SRv6) SIDs, RFC 9602' },
  { cidr: 'fc00::/7', name: 'unique-local, RFC 4193' },
  { cidr: 'fe80::/10', name: 'link-local, RFC 4291' },
  { cidr: 'fec0::/10', name: 'deprecated site-local, RFC 3879' },
  { cidr: 'ff00::/8', name: 'multicast, RFC 4291' },
];

/** Inside the blocks above, the registries mark these globally reachable. */
const GLOBALLY_REACHABLE_INSIDE: readonly string[] = [
  '192.0.0.9/32', // Port Control Protocol anycast, RFC 7723
  '192.0.0.10/32', // TURN anycast, RFC 8155
  '2001:1::1/128', // Port Control Protocol anycast, RFC 7723
  '2001:1::2/128', // TURN anycast, RFC 8155
  '2001:1::3/128', // DNS-SD service registration protocol anycast, RFC 9665
  '2001:3::/32', // AMT, RFC 7450
  '2001:4:112::/48', // AS112-v6, RFC 7535
  '2001:20::/28', // ORCHIDv2, RFC 7343
  '2001:30::/28', // drone remote ID entity tags, RFC 9374
];

function subnets(cidrs: readonly string[]): BlockList {
  const list = new BlockList();
  for (const cidr of cidrs) {
    const [network, bits] = cidr.split('/') as [string, string];
    list.addSubnet(network, Number(bits), isIP(network) === 6 ? 'ipv6' : 'ipv4');
  }
  return list;
}

const blocks = NOT_GLOBALLY_REACHABLE.map((block) => ({ name: block.name, list: subnets([block.cidr]) }));
const exceptions = subnets(GLOBALLY_REACHABLE_INSIDE);
const ipv4Mapped = subnets(['::ffff:0:0/96']);
// The IANA IPv6 address space registry allocates only 2000::/3 as global unicast; the rest is
// reserved, so an address there is refused even before a special-purpose entry names it.
const ipv6GlobalUnicast = subnets(['2000::/3']);

/** Why an address is not globally reachable, or undefined when it is. */
export function nonPublicRange(address: string): string | undefined {
  const family = isIP(address);
  if (family === 0) return 'not an IP address';
  const type = family === 6 ? 'ipv6' : 'ipv4';
  if (exceptions.check(address, type)) return undefined;
  const block = blocks.find((candidate) => candidate.list.check(address, type));
  if (block) return block.name;
  // An IPv4-mapped address has been judged by the IPv4 rules above.
  if (type === 'ipv6' && !ipv4Mapped.check(address, 'ipv6') && !ipv6GlobalUnicast.check(address, 'ipv6')) {
    return 'reserved by the IETF, outside global unicast 2000::/3';
  }
  return undefined;
}

function bareHostname(url: URL): string {
  return url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
}

/** The port a request to the URL goes to (the scheme's default when none is written). */
function effectivePort(url: URL): number {
  if (url.port !== '') return Number(url.port);
  return url.protocol === 'http:' ? 80 : 443;
}

/**
 * A port anything but the web's own ports invites scans of mail, database and admin services on the
 * receiver's host; other ports must be listed by the operator.
 */
export function portProblem(url: URL, policy: WebhookTargetPolicy): string | undefined {
  if (policy.allowPrivateUrls) return undefined;
  const port = effectivePort(url);
  if (port === 443 || policy.allowedPorts?.includes(port)) return undefined;
  return `Port ${port} is not allowed: webhooks go to port 443 unless WEBHOOK_ALLOWED_PORTS lists the port.`;
}

/** Syntax, scheme and port rules; returns the normalized URL or a message for the operator. */
export function parseEndpointUrl(raw: string, policy: WebhookTargetPolicy): { url: URL } | { problem: string } {
  const trimmed = raw.trim();
  if (trimmed.length === 0) return { problem: 'A URL is required.' };
  if (trimmed.length > MAX_ENDPOINT_URL_LENGTH) return { problem: `Must be at most ${MAX_ENDPOINT_URL_LENGTH} characters.` };
  let url: URL;
  try {
    // WHATWG parsing turns every IPv4 spelling (2130706433, 0x7f.1, 017700000001) into dotted form,
    // so the address rules below see the address a connection would use.
    url = new URL(trimmed);
  } catch {
    return { problem: 'Must be an absolute URL.' };
  }
  const allowedSchemes = policy.allowPrivateUrls ? ['https:', 'http:'] : ['https:'];
  if (!allowedSchemes.includes(url.protocol)) {
    return { problem: policy.allowPrivateUrls ? 'Must be an http or https URL.' : 'Must be an https URL.' };
  }
  if (url.username || url.password) return { problem: 'Must not contain credentials; authenticate with the signature instead.' };
  if (url.hash) return { problem: 'Must not contain a fragment.' };
  const badPort = portProblem(url, policy);
  if (badPort) return { problem: badPort };
  return { url };
}

/** Every address the host resolves to; an IP literal resolves to itself. */
export async function resolveHost(hostname: string, resolve: ResolveHost = systemResolve): Promise<LookupAddress[]> {
  const bare = hostname.startsWith('[') ? hostname.slice(1, -1) : hostname;
  const family = isIP(bare);
  if (family) return [{ address: bare, family }];
  return resolve(bare);
}

/** The refusal of a host name none or not all of whose addresses are public; undefined when all are. */
function refusedAddress(hostname: string, addresses: readonly LookupAddress[]): UnsafeWebhookTargetError | undefined {
  if (addresses.length === 0) return dnsRefusal(`Host "${hostname}" has no address.`);
  for (const entry of addresses) {
    const range = nonPublicRange(entry.address);
    if (range !== undefined)
      return dnsRefusal(`Host "${hostname}" resolves to ${entry.address}, which is not a public address (${range}).`);
  }
  return undefined;
}

/**
 * Refuses a target any of whose addresses is not public (one private answer is enough for an
 * attacker who controls the DNS to win a race), unless private targets are allowed.
 */
export async function assertDeliverableTarget(url: URL, policy: WebhookTargetPolicy, resolve?: ResolveHost): Promise<void> {
  if (policy.allowPrivateUrls) return;
  const badPort = portProblem(url, policy);
  if (badPort) throw new UnsafeWebhookTargetError(badPort);
  const hostname = bareHostname(url);
  if (isIP(hostname)) {
    // Written in the URL: naming it tells the caller nothing new.
    const range = nonPublicRange(hostname);
    if (range !== undefined) throw new UnsafeWebhookTargetError(`${hostname} is not a public address (${range}).`);
    return;
  }
  let addresses: LookupAddress[];
  try {
    addresses = await resolveHost(hostname, resolve);
  } catch (error) {
    throw dnsRefusal(`Host "${hostname}" could not be resolved (${(error as NodeJS.ErrnoException).code ?? 'lookup failed'}).`);
  }
  const refused = refusedAddress(hostname, addresses);
  if (refused) throw refused;
}

/**
 * A `lookup` for http(s) agents that checks every address the socket may connect to, so a DNS
 * answer that changes between registration and delivery (rebinding) cannot reach a private address.
 * Node skips `lookup` for IP literals; those are checked by `assertDeliverableTarget` beforehand.
 * Under the guard, a refusal and a failed resolution are the one generic error: the attempt's error
 * is shown to the organisation (a name it controls may point, by CNAME, at an internal one).
 */
export function guardedLookup(policy: WebhookTargetPolicy, resolve: ResolveHost = systemResolve): LookupFunction {
  return (hostname, lookupOptions, callback) => {
    const { family, hints, all } = lookupOptions as { family?: number | string; hints?: number; all?: boolean };
    const wanted = family === 'IPv4' ? 4 : family === 'IPv6' ? 6 : Number(family ?? 0);
    resolve(hostname, { family: wanted, hints }).then(
      (found) => {
        const list = wanted === 4 || wanted === 6 ? found.filter((entry) => entry.family === wanted) : found;
        const refused = policy.allowPrivateUrls
          ? list.length === 0
            ? new UnsafeWebhookTargetError(`Host "${hostname}" has no address.`)
            : undefined
          : refusedAddress(hostname, list);
        if (refused) return callback(refused, '', 0);
        if (all) return (callback as unknown as (error: null, addresses: LookupAddress[]) => void)(null, list);
        callback(null, list[0]!.address, list[0]!.family);
      },
      (error: NodeJS.ErrnoException) =>
        callback(
          policy.allowPrivateUrls ? error : dnsRefusal(`Host "${hostname}" could not be resolved (${error.code ?? 'lookup failed'}).`),
          '',
          0,
        ),
    );
  };
}

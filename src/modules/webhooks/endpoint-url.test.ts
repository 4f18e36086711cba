import { createServer, type AddressInfo, type Server } from 'node:net';
import type { LookupAddress } from 'node:dns';
import ipaddr from 'ipaddr.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  assertDeliverableTarget,
  nonPublicRange,
  NOT_A_PUBLIC_HOST,
  parseEndpointUrl,
  UnsafeWebhookTargetError,
  type ResolveHost,
} from './endpoint-url.js';
import { createWebhookSender } from './webhook-sender.js';

/** An address the checks let through: outside every non-public range. */
const isPublic = (address: string): boolean => nonPublicRange(address) === undefined;

const STRICT = { allowPrivateUrls: false };

/**
 * Each entry of the IANA special-purpose registries (IPv4 and IPv6) that is not globally reachable,
 * with addresses at its start, inside and at its end.
 */
const NOT_GLOBALLY_REACHABLE: Array<[entry: string, addresses: string[]]> = [
  ['0.0.0.0/8 this network', ['0.0.0.0', '0.1.2.3', '0.255.255.255']],
  ['10.0.0.0/8 private-use', ['10.0.0.0', '10.1.2.3', '10.255.255.255']],
  ['100.64.0.0/10 shared address space', ['100.64.0.0', '100.100.100.200', '100.127.255.255']],
  ['127.0.0.0/8 loopback', ['127.0.0.1', '127.8.9.10', '127.255.255.255']],
  ['169.254.0.0/16 link-local (cloud metadata)', ['169.254.0.0', '169.254.169.254', '169.254.255.255']],
  ['172.16.0.0/12 private-use', ['172.16.0.0', '172.20.1.1', '172.31.255.255']],
  ['192.0.0.0/24 IETF protocol assignments', ['192.0.0.0', '192.0.0.8', '192.0.0.170', '192.0.0.171', '192.0.0.255']],
  ['192.0.2.0/24 TEST-NET-1', ['192.0.2.0', '192.0.2.1', '192.0.2.255']],
  ['192.88.99.0/24 deprecated 6to4 relay anycast', ['192.88.99.0', '192.88.99.1', '192.88.99.255']],
  ['192.168.0.0/16 private-use', ['192.168.0.0', '192.168.1.1', '192.168.255.255']],
  ['198.18.0.0/15 benchmarking', ['198.18.0.0', '198.19.1.1', '198.19.255.255']],
  ['198.51.100.0/24 TEST-NET-2', ['198.51.100.0', '198.51.100.7', '198.51.100.255']],
  ['203.0.113.0/24 TEST-NET-3', ['203.0.113.0', '203.0.113.9', '203.0.113.255']],
  ['224.0.0.0/4 multicast', ['224.0.0.1', '239.255.255.250', '239.255.255.255']],
  ['240.0.0.0/4 reserved', ['240.0.0.0', '250.1.2.3', '255.255.255.254']],
  ['255.255.255.255/32 limited broadcast', ['255.255.255.255']],
  ['::/128 unspecified', ['::']],
  ['::1/128 loopback', ['::1']],
  [
    '::ffff:0:0/96 IPv4-mapped, judged by the embedded IPv4',
    ['::ffff:127.0.0.1', '::ffff:10.0.0.1', '::ffff:169.254.169.254', '::ffff:a00:1'],
  ],
  ['::/96 deprecated IPv4-compatible', ['::127.0.0.1', '::8.8.8.8', '::10.0.0.1', '::ffff']],
  ['64:ff9b::/96 NAT64', ['64:ff9b::', '64:ff9b::7f00:1', '64:ff9b::808:808']],
  ['64:ff9b:1::/48 local-use translation', ['64:ff9b:1::', '64:ff9b:1:ffff::1']],
  ['100::/64 discard-only', ['100::', '100::1', '100::ffff:ffff:ffff:ffff']],
  ['100:0:0:1::/64 dummy prefix', ['100:0:0:1::1']],
  ['2001::/23 IETF protocol assignments', ['2001::', '2001:0:4136:e378::1', '2001:2::1', '2001:10::1', '2001:1::4', '2001:1ff:ffff::1']],
  ['2001:db8::/32 documentation', ['2001:db8::', '2001:db8::1', '2001:db8:ffff:ffff::1']],
  ['2002::/16 6to4', ['2002::', '2002:7f00:1::1', '2002:0a00:0001::1', '2002:ffff::1']],
  ['3fff::/20 documentation', ['3fff::', '3fff::1', '3fff:fff:ffff::1']],
  ['5f00::/16 SRv6 SIDs', ['5f00::', '5f00:1::1', '5f00:ffff::1']],
  ['fc00::/7 unique-local', ['fc00::', 'fd00:ec2::254', 'fdff:ffff::1']],
  ['fe80::/10 link-local', ['fe80::', 'fe80::1', 'febf:ffff::1']],
  ['fec0::/10 deprecated site-local', ['fec0::', 'fec0::1', 'feff:ffff::1']],
  ['ff00::/8 multicast', ['ff00::', 'ff02::1', 'ffff:ffff::1']],
  ['outside global unicast 2000::/3', ['4000::1', '8000::1', 'e000::1', '1234::1']],
];

/** Public addresses, and the registries' globally reachable entries inside refused blocks. */
const GLOBALLY_REACHABLE: Array<[what: string, address: string]> = [
  ['public IPv4', '8.8.8.8'],
  ['public IPv4 next to 10/8', '11.0.0.1'],
  ['public IPv4 next to 172.16/12', '172.32.0.1'],
  ['public IPv4 next to 192.168/16', '192.169.0.1'],
  ['public IPv4 next to 100.64/10', '100.128.0.1'],
  ['public IPv4-mapped', '::ffff:8.8.8.8'],
  ['public IPv6', '2606:4700:4700::1111'],
  ['PCP anycast 192.0.0.9/32', '192.0.0.9'],
  ['TURN anycast 192.0.0.10/32', '192.0.0.10'],
  ['AS112-v4 192.31.196.0/24', '192.31.196.1'],
  ['AMT 192.52.193.0/24', '192.52.193.1'],
  ['AS112 direct delegation 192.175.48.0/24', '192.175.48.1'],
  ['PCP anycast 2001:1::1/128', '2001:1::1'],
  ['TURN anycast 2001:1::2/128', '2001:1::2'],
  ['DNS-SD SRP anycast 2001:1::3/128', '2001:1::3'],
  ['AMT 2001:3::/32', '2001:3::1'],
  ['AS112-v6 2001:4:112::/48', '2001:4:112::1'],
  ['ORCHIDv2 2001:20::/28', '2001:20::1'],
  ['drone remote ID 2001:30::/28', '2001:30::1'],
  ['AS112 direct delegation 2620:4f:8000::/48', '2620:4f:8000::1'],
];

describe('webhook target addresses (IANA special-purpose registries)', () => {
  it.each(NOT_GLOBALLY_REACHABLE)('when an address is in %s, it is not public', (_entry, addresses) => {
    for (const address of addresses) expect(isPublic(address), address).toBe(false);
  });

  it.each(GLOBALLY_REACHABLE)('when an address is a %s address (%s), it is public', (_what, address) => {
    expect(isPublic(address)).toBe(true);
  });

  it.each([
    // ipaddr.js range() and this table agree
    ['127.0.0.1', 'loopback', false],
    ['10.0.0.1', 'private', false],
    ['100.64.0.1', 'carrierGradeNat', false],
    ['169.254.1.1', 'linkLocal', false],
    ['224.0.0.1', 'multicast', false],
    ['255.255.255.255', 'broadcast', false],
    ['0.0.0.1', 'unspecified', false],
    ['192.0.2.1', 'reserved', false],
    ['fd00::1', 'uniqueLocal', false],
    ['2001::1', 'teredo', false],
    ['2002::1', '6to4', false],
    ['64:ff9b::1', 'rfc6052', false],
    ['5f00::1', 'segmentRouting', false],
    ['3fff::1', 'reserved', false],
    ['8.8.8.8', 'unicast', true],
    // the registries mark these globally reachable; ipaddr.js does not call them unicast
    ['192.0.0.9', 'reserved', true],
    ['192.52.193.1', 'amt', true],
    ['192.175.48.1', 'as112', true],
    ['2001:3::1', 'amt', true],
    ['2001:4:112::1', 'as112v6', true],
    ['2001:20::1', 'orchid2', true],
    // ipaddr.js calls these unicast; the registries do not make them reachable
    ['::7f00:1', 'unicast', false],
    ['::808:808', 'unicast', false],
    ['100:0:0:1::1', 'unicast', false],
    ['4000::1', 'unicast', false],
  ] as const)('when the address is %s (ipaddr.js range %s), it is public: %s', (address, range, expected) => {
    expect(ipaddr.parse(address).range()).toBe(range);
    expect(isPublic(address)).toBe(expected);
  });

  it('when a resolver prints an IPv4-compatible address in dotted form (::8.8.8.8), it is refused, not read as IPv4-mapped', () => {
    expect(ipaddr.parse('::8.8.8.8').range()).toBe('ipv4Mapped'); // why ipaddr.js does not parse here
    expect(isPublic('::8.8.8.8')).toBe(false);
    expect(isPublic('::127.0.0.1')).toBe(false);
    expect(isPublic('::ffff:8.8.8.8')).toBe(true);
  });

  it('when the text is not an IP address, it is not public', () => {
    expect(isPublic('localhost')).toBe(false);
    expect(isPublic('')).toBe(false);
  });
});

async function registrationProblem(
  raw: string,
  policy: { allowPrivateUrls: boolean; allowedPorts?: number[] } = STRICT,
  resolve?: ResolveHost,
) {
  const parsed = parseEndpointUrl(raw, policy);
  if ('problem' in parsed) return parsed.problem;
  try {
    await assertDeliverableTarget(parsed.url, policy, resolve);
    return undefined;
  } catch (error) {
    return (error as Error).message;
  }
}

describe('webhook endpoint URLs at registration', () => {
  it.each([
    ['https://2130706433/hook', 'decimal'],
    ['https://0x7f.1/hook', 'hexadecimal, two parts'],
    ['https://0x7f000001/hook', 'hexadecimal'],
    ['https://017700000001/hook', 'octal'],
    ['https://0177.0.0.1/hook', 'octal first part'],
    ['https://127.1/hook', 'two parts'],
    ['https://[::127.0.0.1]/hook', 'IPv4-compatible IPv6'],
    ['https://[::8.8.8.8]/hook', 'IPv4-compatible IPv6 of a public address'],
    ['https://[::ffff:7f00:1]/hook', 'IPv4-mapped IPv6 in hex'],
    ['https://[0:0:0:0:0:ffff:127.0.0.1]/hook', 'IPv4-mapped IPv6, long form'],
    ['https://[64:ff9b::a9fe:a9fe]/hook', 'NAT64 of the metadata address'],
    ['https://[fe80::1%25eth0]/hook', 'link-local with a zone'],
  ])('when the host is %s (%s), it is refused as not public', async (url) => {
    expect(await registrationProblem(url)).toMatch(/not a public address|Must be an absolute URL/);
  });

  it('when the host is a loopback address in any spelling, WHATWG parsing gives the dotted form that is checked', () => {
    for (const raw of ['https://2130706433/', 'https://0x7f.1/', 'https://017700000001/', 'https://127.1/']) {
      const parsed = parseEndpointUrl(raw, STRICT);
      expect('url' in parsed && parsed.url.hostname).toBe('127.0.0.1');
    }
  });

  it('when no port or 443 is given on https, it is accepted; any other port is refused', async () => {
    expect(await registrationProblem('https://93.184.215.14/hook')).toBeUndefined();
    expect(await registrationProblem('https://93.184.215.14:443/hook')).toBeUndefined();
    for (const port of [80, 22, 25, 5432, 6379, 8080, 8443, 65535]) {
      expect(await registrationProblem(`https://93.184.215.14:${port}/hook`)).toMatch(
        new RegExp(`Port ${port} is not allowed.*WEBHOOK_ALLOWED_PORTS`),
      );
    }
  });

  it('when WEBHOOK_ALLOWED_PORTS lists ports, exactly those are accepted besides 443', async () => {
    const policy = { allowPrivateUrls: false, allowedPorts: [8443, 9443] };
    expect(await registrationProblem('https://93.184.215.14:8443/hook', policy)).toBeUndefined();
    expect(await registrationProblem('https://93.184.215.14:9443/hook', policy)).toBeUndefined();
    expect(await registrationProblem('https://93.184.215.14/hook', policy)).toBeUndefined();
    expect(await registrationProblem('https://93.184.215.14:8444/hook', policy)).toMatch(/Port 8444 is not allowed/);
  });

  it('when private URLs are allowed (development), http, private addresses and any port are accepted', async () => {
    const policy = { allowPrivateUrls: true };
    expect(await registrationProblem('http://127.0.0.1:3000/hook', policy)).toBeUndefined();
    expect(await registrationProblem('https://[::1]:8443/hook', policy)).toBeUndefined();
    expect(await registrationProblem('http://localhost/hook', policy)).toBeUndefined();
  });

  it('when a host name resolves to several addresses and one of them is private, it is refused, the detail naming the address', async () => {
    const resolve: ResolveHost = async () => [
      { address: '93.184.215.14', family: 4 },
      { address: '10.0.0.5', family: 4 },
    ];
    expect(await registrationProblem('https://hooks.example.test/in', STRICT, resolve)).toBe(NOT_A_PUBLIC_HOST);
    expect(await registrationDetail('https://hooks.example.test/in', resolve)).toMatch(
      /"hooks\.example\.test" resolves to 10\.0\.0\.5, which is not a public address \(private-use/,
    );
  });

  it('when a host name resolves to a private address, to no address or not at all, the refusal is one message naming neither the name nor what DNS said', async () => {
    const notFound = Object.assign(new Error('getaddrinfo ENOTFOUND vm'), { code: 'ENOTFOUND' });
    const answers: Record<string, ResolveHost> = {
      loopback: async () => [{ address: '127.0.0.1', family: 4 }],
      private: async () => [{ address: '::ffff:10.1.2.3', family: 6 }],
      'no address': async () => [],
      'not found': async () => Promise.reject(notFound),
      'temporary failure': async () => Promise.reject(Object.assign(new Error('getaddrinfo EAI_AGAIN vm'), { code: 'EAI_AGAIN' })),
    };
    const problems = await Promise.all(Object.values(answers).map((resolve) => registrationProblem('https://vm/hook', STRICT, resolve)));
    expect(new Set(problems)).toEqual(new Set([NOT_A_PUBLIC_HOST]));
    expect(NOT_A_PUBLIC_HOST).not.toMatch(/vm|127|10\.1|ENOTFOUND|EAI_AGAIN|resolves to/);
    // The operator's detail still tells them apart.
    expect(await registrationDetail('https://vm/hook', answers.loopback!)).toMatch(/"vm" resolves to 127\.0\.0\.1/);
    expect(await registrationDetail('https://vm/hook', answers['not found']!)).toMatch(/"vm" could not be resolved \(ENOTFOUND\)/);
  });

  it('when the URL itself holds a private address, the refusal names it (the caller wrote it) and asks no resolver', async () => {
    const lookups: string[] = [];
    const resolve: ResolveHost = async (hostname) => {
      lookups.push(hostname);
      return [];
    };
    expect(await registrationProblem('https://10.0.0.5/hook', STRICT, resolve)).toBe(
      '10.0.0.5 is not a public address (private-use, RFC 1918).',
    );
    expect(await registrationProblem('https://[::1]/hook', STRICT, resolve)).toBe('::1 is not a public address (loopback, RFC 4291).');
    expect(lookups).toEqual([]);
  });
});

/** What the operator's CLI is told of a refusal (UnsafeWebhookTargetError.detail). */
async function registrationDetail(raw: string, resolve: ResolveHost): Promise<string | undefined> {
  const parsed = parseEndpointUrl(raw, STRICT);
  if ('problem' in parsed) return parsed.problem;
  try {
    await assertDeliverableTarget(parsed.url, STRICT, resolve);
    return undefined;
  } catch (error) {
    return error instanceof UnsafeWebhookTargetError ? error.detail : String(error);
  }
}

describe('webhook sending at connect time', () => {
  let listener: Server;
  let port: number;
  let connections = 0;
  beforeAll(async () => {
    // A bare TCP listener: any connection the sender makes shows up here, TLS or not.
    listener = createServer((socket) => {
      connections += 1;
      socket.destroy();
    });
    await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
    port = (listener.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => listener.close(() => resolve())));

  const send = (sender: ReturnType<typeof createWebhookSender>, url: string) =>
    sender.send({ url, secret: `whsec_${Buffer.alloc(32, 1).toString('base64')}`, eventId: 'evt_1', payload: '{}' });

  it('when a host name passed registration but now resolves to a private address (DNS rebinding), the send is refused before connecting', async () => {
    const registeredAs: LookupAddress[] = [{ address: '93.184.215.14', family: 4 }];
    const now: LookupAddress[] = [{ address: '127.0.0.1', family: 4 }];
    let answers = registeredAs;
    const resolve: ResolveHost = async () => answers;
    const url = `https://rebinding.example.test:${port}/hook`;
    expect(await registrationProblem(url, { allowPrivateUrls: false, allowedPorts: [port] }, resolve)).toBeUndefined();

    answers = now;
    const sender = createWebhookSender({ allowPrivateUrls: false, allowedPorts: [port], resolveHost: resolve, timeoutMs: 2_000 });
    try {
      const result = await send(sender, url);
      expect(result).toMatchObject({ statusCode: null, error: NOT_A_PUBLIC_HOST });
      expect(connections).toBe(0);
    } finally {
      sender.close();
    }
  });

  it('when a host name resolves to a private address or not at all at send time, the attempt records the same error', async () => {
    const notFound = Object.assign(new Error('getaddrinfo ENOTFOUND internal.example.test'), { code: 'ENOTFOUND' });
    const privateSender = createWebhookSender({
      allowPrivateUrls: false,
      allowedPorts: [port],
      resolveHost: async () => [{ address: '10.0.0.7', family: 4 }],
    });
    const unknownSender = createWebhookSender({
      allowPrivateUrls: false,
      allowedPorts: [port],
      resolveHost: async () => Promise.reject(notFound),
    });
    try {
      const url = `https://internal.example.test:${port}/hook`;
      const [refused, unresolved] = [await send(privateSender, url), await send(unknownSender, url)];
      expect(refused.error).toBe(NOT_A_PUBLIC_HOST);
      expect(unresolved.error).toBe(refused.error);
      expect(connections).toBe(0);
    } finally {
      privateSender.close();
      unknownSender.close();
    }
  });

  it('when one of several resolved addresses is private, the send is refused, whichever the socket would try first', async () => {
    const resolve: ResolveHost = async () => [
      { address: '127.0.0.1', family: 4 },
      { address: '::ffff:10.0.0.1', family: 6 },
    ];
    const sender = createWebhookSender({ allowPrivateUrls: false, allowedPorts: [port], resolveHost: resolve, timeoutMs: 2_000 });
    try {
      const result = await send(sender, `https://mixed.example.test:${port}/hook`);
      expect(result.error).toBe(NOT_A_PUBLIC_HOST);
      expect(connections).toBe(0);
    } finally {
      sender.close();
    }
  });

  it('when the same name is sent to with private URLs allowed, the connection is made (the refusal above is the guard)', async () => {
    const resolve: ResolveHost = async () => [{ address: '127.0.0.1', family: 4 }];
    const sender = createWebhookSender({ allowPrivateUrls: true, resolveHost: resolve, timeoutMs: 2_000 });
    try {
      const result = await send(sender, `https://rebinding.example.test:${port}/hook`);
      expect(result.statusCode).toBeNull(); // the listener hangs up: no HTTP answer
      expect(connections).toBeGreaterThanOrEqual(1);
    } finally {
      sender.close();
      connections = 0;
    }
  });

  it('when the port of a stored endpoint is no longer allowed, the send is refused before any lookup or connection', async () => {
    const lookups: string[] = [];
    // Private on purpose: were the port rule missing, the address rule would still keep this test off the network.
    const resolve: ResolveHost = async (hostname) => {
      lookups.push(hostname);
      return [{ address: '127.0.0.1', family: 4 }];
    };
    const sender = createWebhookSender({ allowPrivateUrls: false, allowedPorts: [], resolveHost: resolve, timeoutMs: 2_000 });
    try {
      const result = await send(sender, `https://ports.example.test:${port}/hook`);
      expect(result.error).toMatch(new RegExp(`Port ${port} is not allowed`));
      expect(lookups).toEqual([]);
      expect(connections).toBe(0);
      expect((await send(sender, 'https://[::127.0.0.1]/hook')).error).toMatch(/::7f00:1 is not a public address/);
    } finally {
      sender.close();
    }
  });
});

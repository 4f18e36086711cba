/** Credits per check: the one place prices live. */
const PRICES = {
  KYC: 1,
  KYB: { automated: 2, contact_led: 3, manual: 0 },
  EDD_ADD_ON: 1,
} as const;

export type KybMethod = keyof typeof PRICES.KYB;

/** The `manual` lane is free whatever else is asked; every other check adds its EDD add-ons. */
export function priceOf(check: { kind: 'KYC' } | { kind: 'KYB'; method: KybMethod }, eddAddOns: number): number {
  if (check.kind === 'KYB' && check.method === 'manual') return 0;
  const base = check.kind === 'KYC' ? PRICES.KYC : PRICES.KYB[check.method];
  return base + eddAddOns * PRICES.EDD_ADD_ON;
}

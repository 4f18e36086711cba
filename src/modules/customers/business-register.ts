/**
 * The business-register (ABN) lookup for sole traders. Pluggable; the default checks nothing. A
 * miss, an error or a slow answer never blocks ingest: it is only recorded.
 */
export type BusinessRegister = { lookupAbn(abn: string): Promise<'ACTIVE' | 'INACTIVE' | 'NOT_FOUND'> };

export type BusinessRegisterStatus =
  'NOT_CHECKED' | 'REGISTER_VERIFIED' | 'REGISTER_INACTIVE' | 'REGISTER_NOT_FOUND' | 'REGISTER_UNAVAILABLE';

export async function checkBusinessRegister(
  register: BusinessRegister | undefined,
  abn: string,
  timeoutMs = 2_000,
): Promise<BusinessRegisterStatus> {
  if (!register) return 'NOT_CHECKED';
  let timer: NodeJS.Timeout | undefined;
  try {
    const result = await Promise.race([
      register.lookupAbn(abn),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('business register timeout')), timeoutMs);
      }),
    ]);
    return result === 'ACTIVE' ? 'REGISTER_VERIFIED' : result === 'INACTIVE' ? 'REGISTER_INACTIVE' : 'REGISTER_NOT_FOUND';
  } catch {
    return 'REGISTER_UNAVAILABLE';
  } finally {
    clearTimeout(timer);
  }
}

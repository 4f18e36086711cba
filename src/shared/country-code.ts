import countries from 'i18n-iso-countries';
import { z } from 'zod';

const alpha3 = new Set(Object.keys(countries.getAlpha3Codes()));

/** An ISO 3166-1 alpha-3 country code, trimmed and upper-cased. */
export const countryCode = z
  .string()
  .transform((value) => value.trim().toUpperCase())
  .refine((value) => alpha3.has(value), { message: 'Must be an ISO 3166-1 alpha-3 country code, e.g. NZL.' })
  .meta({ example: 'NZL' });

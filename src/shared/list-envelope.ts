import { z } from 'zod';

/**
 * The one list envelope of the API (the spec's GET /customers): `has_more` is true only when
 * another page exists, and `next_cursor` is then the cursor of that page, null on the last page. A
 * generic paginator that follows next_cursor until null ends on every list, feeds included.
 */
export type ListPage<T> = { object: 'list'; data: T[]; has_more: boolean; next_cursor: string | null; limit: number };

/**
 * A feed a consumer resumes (the events feed, the audit trail): the same envelope plus `resume_cursor`,
 * never null, where the consumer's next poll starts (after the last item returned; on an empty page the
 * position the page started from). next_cursor is the same value while has_more, null on the last page.
 */
export type FeedPage<T> = ListPage<T> & { resume_cursor: string };

const CURSOR_EXAMPLE = 'eyJwIjo0MiwiZiI6IjNmOWMifQ.Tm90LWEtcmVhbC1tYWM';

/** The envelope's schema; `order` says how `data` is sorted. */
export const listEnvelope = <T extends z.ZodType>(item: T, order: string) =>
  z.object({
    object: z.literal('list').describe('Always list.'),
    data: z.array(item).describe(`This page, ${order}. Never null; empty when nothing matches.`),
    has_more: z.boolean().describe('True only when another page exists; then next_cursor fetches it.'),
    next_cursor: z
      .string()
      .nullable()
      .describe('Pass as cursor, with the same filters, for the next page; null on the last page.')
      .meta({ example: CURSOR_EXAMPLE }),
    limit: z.int().describe('The page size applied.').meta({ example: 50 }),
  });

/** The envelope of a feed: the list envelope plus resume_cursor. */
export const feedEnvelope = <T extends z.ZodType>(item: T, order: string) =>
  listEnvelope(item, order).extend({
    has_more: z
      .boolean()
      .describe(
        'True only when another page exists right now (then next_cursor fetches it: poll again at once); false on the last page (poll again later with resume_cursor).',
      ),
    resume_cursor: z
      .string()
      .describe(
        'Never null: where your next poll resumes (after the last item returned; on an empty page the cursor you sent). Keep the last one durably and pass it as cursor, with the same filters, to get only newer items. Equals next_cursor while has_more is true.',
      )
      .meta({ example: CURSOR_EXAMPLE }),
  });

/**
 * A list page from `limit + 1` rows read in list order: the extra row only says there is more, and
 * next_cursor is the cursor after the page's last row.
 */
export function listPage<Row, T>(rows: Row[], limit: number, toDto: (row: Row) => T, cursorAfter: (row: Row) => string): ListPage<T> {
  const page = rows.slice(0, limit);
  const hasMore = rows.length > limit;
  const last = page.at(-1);
  return { object: 'list', data: page.map(toDto), has_more: hasMore, next_cursor: hasMore && last ? cursorAfter(last) : null, limit };
}

/** A feed page: next_cursor follows the envelope's rule, resume_cursor is where the next poll starts. */
export function feedPage<T>(data: T[], limit: number, hasMore: boolean, resumeCursor: string): FeedPage<T> {
  return { object: 'list', data, has_more: hasMore, next_cursor: hasMore ? resumeCursor : null, resume_cursor: resumeCursor, limit };
}

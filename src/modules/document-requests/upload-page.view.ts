import { createHash } from 'node:crypto';
import type { UploadPageView } from './document-requests.service.js';

/*
 * The contact's upload page: plain HTML that works without JavaScript and loads nothing from
 * anywhere. Its one inline stylesheet is allowed by its hash, so the Content-Security-Policy can say
 * `default-src 'none'` and no injected markup could run or load anything.
 */

const STYLE = `
*{box-sizing:border-box}
body{margin:0;background:#f3f5f8;color:#1d2433;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:40rem;margin:2.5rem auto;padding:2rem;background:#fff;border:1px solid #d9dee7;border-radius:10px}
h1{font-size:1.5rem;margin:0 0 .5rem}
.lead{color:#4a5468;margin:0 0 1.25rem}
.message{white-space:pre-wrap;background:#f7f9fc;border-left:4px solid #3b6fd8;padding:.75rem 1rem;margin:0 0 1.25rem}
.due{font-weight:600}
ul.types{list-style:none;padding:0;margin:1rem 0}
ul.types li{display:flex;justify-content:space-between;gap:1rem;padding:.6rem 0;border-bottom:1px solid #eceff4}
.received{color:#1f7a3d;font-weight:600}
.outstanding{color:#9a5b00;font-weight:600}
fieldset{border:0;padding:0;margin:1.25rem 0}
label{display:block;font-weight:600;margin:.9rem 0 .3rem}
input[type=file]{display:block;width:100%;padding:.5rem;border:1px dashed #9aa6bd;border-radius:6px;background:#fafbfd}
button{margin-top:1.25rem;padding:.7rem 1.4rem;font:inherit;font-weight:600;color:#fff;background:#2f5fc4;border:0;border-radius:6px;cursor:pointer}
.error{background:#fdecec;border:1px solid #e3a3a3;color:#8a1c1c;padding:.75rem 1rem;border-radius:6px;margin:0 0 1.25rem}
.notice{background:#eaf6ee;border:1px solid #9fd3b0;color:#1f5c33;padding:.75rem 1rem;border-radius:6px;margin:0 0 1.25rem}
.small{color:#5b6579;font-size:.875rem}
`;

/** The page's Content-Security-Policy: nothing may load or run; the stylesheet is allowed by its hash; forms post back here only. */
const UPLOAD_PAGE_CSP = [
  "default-src 'none'",
  `style-src 'sha256-${createHash('sha256').update(STYLE).digest('base64')}'`,
  "form-action 'self'",
  "base-uri 'none'",
  "frame-ancestors 'none'",
].join('; ');

/** Headers of every page response: the token is in the URL, so it must not leak by Referer or cache either. */
export const UPLOAD_PAGE_HEADERS: Readonly<Record<string, string>> = {
  'Content-Security-Policy': UPLOAD_PAGE_CSP,
  'Referrer-Policy': 'no-referrer',
  'Cache-Control': 'no-store',
  'X-Content-Type-Options': 'nosniff',
  'X-Frame-Options': 'DENY',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

const ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (character) => ESCAPES[character]!);
}

const DUE_FORMAT = new Intl.DateTimeFormat('en-AU', { timeZone: 'UTC', dateStyle: 'long', timeStyle: 'short' });

function page(title: string, content: string): string {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex, nofollow">
<title>${escapeHtml(title)}</title>
<style>${STYLE}</style>
</head>
<body>
<main>
${content}
</main>
</body>
</html>
`;
}

/** The request and its form: one file input per outstanding type. `error` is shown above it; `notice` confirms a partial upload. */
export function renderUploadPage(view: UploadPageView, options: { error?: string; notice?: string; maxFileMiB: number }): string {
  const { request } = view;
  const outstanding = view.items.filter((item) => !item.received);
  const items = view.items
    .map(
      (item) =>
        `<li><span>${escapeHtml(item.name)}</span>${
          item.received ? '<span class="received">Received</span>' : '<span class="outstanding">Outstanding</span>'
        }</li>`,
    )
    .join('\n');
  const inputs = outstanding
    .map(
      (item) =>
        `<label for="file-${item.code}">${escapeHtml(item.name)}</label>\n<input type="file" id="file-${item.code}" name="${item.code}" accept=".pdf,.png,.jpg,.jpeg">`,
    )
    .join('\n');
  return page(
    `Documents for ${view.entityName}`,
    `<h1>Documents for ${escapeHtml(view.entityName)}</h1>
<p class="lead">${escapeHtml(view.organisationName)} asks you to upload the documents below.</p>
${options.error ? `<p class="error" role="alert">${escapeHtml(options.error)}</p>` : ''}
${options.notice ? `<p class="notice" role="status">${escapeHtml(options.notice)}</p>` : ''}
${request.message ? `<p class="message">${escapeHtml(request.message)}</p>` : ''}
<p>Please upload by <span class="due">${escapeHtml(DUE_FORMAT.format(request.dueAt))} UTC</span>.</p>
<ul class="types">
${items}
</ul>
<form method="post" enctype="multipart/form-data">
<fieldset>
${inputs}
</fieldset>
<p class="small">PDF, PNG or JPEG, at most ${options.maxFileMiB} MiB each.</p>
<button type="submit">Upload</button>
</form>`,
  );
}

export function renderThankYouPage(): string {
  return page(
    'Documents received',
    `<h1>Thank you</h1>
<p class="notice" role="status">All requested documents have been received.</p>
<p>You can close this page. The link you used no longer works.</p>`,
  );
}

export function renderInvalidLinkPage(): string {
  return page(
    'Link not valid',
    `<h1>This link is not valid</h1>
<p>The link may be mistyped, may have expired, or the request may already be complete.</p>
<p>If you still need to send documents, ask the organisation that sent you the link for a new one.</p>`,
  );
}

/** An error before the request could be read (a body that is not a form, a failure of ours). */
export function renderErrorPage(message: string): string {
  return page('Something went wrong', `<h1>Something went wrong</h1>\n<p class="error" role="alert">${escapeHtml(message)}</p>`);
}

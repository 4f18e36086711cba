export type Part = { name: string; value: string } | { name: string; data: Buffer; filename?: string; contentType?: string };

/** A multipart/form-data body and its Content-Type; `ctx.request` sends it as it is, with that Content-Type. */
export class MultipartBody {
  constructor(
    readonly payload: Buffer,
    readonly contentType: string,
  ) {}
}

/** A multipart/form-data body, built by hand so tests control every byte. */
export function multipart(parts: Part[]): MultipartBody {
  const boundary = `----svc-test-${Math.random().toString(36).slice(2)}`;
  const pieces: Buffer[] = [];
  for (const part of parts) {
    if ('value' in part) {
      pieces.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${part.name}"\r\n\r\n${part.value}\r\n`, 'utf8'));
    } else {
      const filename = part.filename === undefined ? '' : `; filename="${part.filename}"`;
      pieces.push(
        Buffer.from(
          `--${boundary}\r\nContent-Disposition: form-data; name="${part.name}"${filename}\r\nContent-Type: ${part.contentType ?? 'application/octet-stream'}\r\n\r\n`,
          'utf8',
        ),
        part.data,
        Buffer.from('\r\n'),
      );
    }
  }
  pieces.push(Buffer.from(`--${boundary}--\r\n`));
  return new MultipartBody(Buffer.concat(pieces), `multipart/form-data; boundary=${boundary}`);
}

/** The smallest upload POST /v1/entities/:id/documents accepts: a 2 KiB PDF of type OTHER. */
export function minimalUpload(): MultipartBody {
  const data = Buffer.alloc(2048, 0x41);
  Buffer.from('%PDF-1.7\n').copy(data);
  return multipart([
    { name: 'file', data, filename: 'minimal.pdf' },
    { name: 'type', value: 'OTHER' },
  ]);
}

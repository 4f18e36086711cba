import { buildApp } from '../src/app.js';
import { createDatabase } from '../src/db/client.js';
import { loadConfig } from '../src/config/config.js';
import { apiModules } from '../src/modules/index.js';
import { z } from 'zod';
apiModules.push(async (app) => {
  app.get('/designated-services', { schema: { response: { 200: z.object({ object: z.literal('list') }).strict() } } }, async () => ({ object: 'list' as const }));
  app.patch('/customers/:id', { schema: { params: z.object({ id: z.uuid() }), body: z.object({ email: z.email().describe('Email') }).strict(), response: { 200: z.object({ id: z.string() }) } } }, async () => ({ id: 'x' }));
});
const database = createDatabase('postgres://invalid@127.0.0.1:1/none');
const app = await buildApp({ config: loadConfig({}), database, logger: false });
await app.ready();
console.log(JSON.stringify(app.swagger(), null, 2));
for (const url of ['/docs', '/docs/', '/docs/js/scalar.js', '/openapi.json']) {
  const r = await app.inject(url);
  console.log(url, r.statusCode, r.headers['content-type'], r.headers.location, r.body.length);
}
await app.close(); await database.close();

import type { Command } from 'commander';
import { DELIVERY_STATUSES, type DeliveryStatus } from '../../modules/webhooks/webhooks.schemas.js';
import { EVENT_TYPES, type EventType } from '../../shared/outbox.js';
import { parseInteger, parseList, type CommandContext, type CliRunner } from '../runner.js';

const service = ({ services }: CommandContext) => services.webhooks;

export function registerWebhookCommands(program: Command, cli: CliRunner): void {
  const webhook = program.command('webhook').description('Manage webhook endpoints and deliveries');

  webhook
    .command('add')
    .description('Register an endpoint; its signing secret (whsec_…) is printed only here')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--url <url>', 'https URL on port 443 (or one in WEBHOOK_ALLOWED_PORTS) of a public address that receives the events')
    .option('--events <list>', `comma-separated event types (${EVENT_TYPES.join(', ')}); default all`)
    .option('--disabled', 'register it disabled')
    .action((options: { org: string; url: string; events?: string; disabled?: boolean }) =>
      cli.runCommand((context) =>
        service(context).addEndpoint(
          {
            orgId: options.org,
            url: options.url,
            events: parseList(options.events) as EventType[] | undefined,
            enabled: options.disabled ? false : undefined,
          },
          context.actor,
        ),
      ),
    );

  webhook
    .command('list')
    .description('List the endpoints of an organisation (no secrets)')
    .requiredOption('--org <id>', 'organisation id')
    .action((options: { org: string }) => cli.runCommand((context) => service(context).listEndpoints(options.org)));

  webhook
    .command('disable')
    .description('Disable an endpoint; its queued deliveries fail')
    .argument('<id>', 'endpoint id')
    .option('--org <id>', 'organisation id (refuses an endpoint of another organisation)')
    .option('--reason <text>', 'why, kept on the endpoint')
    .action((id: string, options: { org?: string; reason?: string }) =>
      cli.runCommand((context) =>
        service(context).disableEndpoint(id, { orgId: options.org, reason: options.reason, actor: context.actor }),
      ),
    );

  webhook
    .command('deliveries')
    .description('List deliveries, newest first, with every attempt (status code, latency, error)')
    .requiredOption('--org <id>', 'organisation id')
    .option('--event <id>', 'only deliveries of this event')
    .option('--status <status>', `only deliveries in this status (${DELIVERY_STATUSES.join(', ')})`)
    .option('--limit <n>', 'at most this many (1 to 1000, default 100)', parseInteger('--limit'))
    .action((options: { org: string; event?: string; status?: string; limit?: number }) =>
      cli.runCommand((context) =>
        service(context).listDeliveries({
          orgId: options.org,
          eventId: options.event,
          status: options.status as DeliveryStatus | undefined,
          limit: options.limit,
        }),
      ),
    );

  webhook
    .command('resend')
    .description('Send a delivery again now (a settled one gets a new delivery of the same event)')
    .argument('<deliveryId>', 'delivery id')
    .option('--org <id>', 'organisation id (refuses a delivery of another organisation)')
    .action((deliveryId: string, options: { org?: string }) =>
      cli.runCommand((context) => service(context).resendDelivery(deliveryId, { orgId: options.org, actor: context.actor })),
    );

  webhook
    .command('test')
    .description('Emit a webhook.test event to every enabled endpoint of the organisation, or with --endpoint to that one only')
    .requiredOption('--org <id>', 'organisation id')
    .option('--endpoint <id>', 'only this endpoint (prints {event, delivery}); a disabled one is refused')
    .action((options: { org: string; endpoint?: string }) =>
      cli.runCommand<unknown>((context) =>
        options.endpoint === undefined
          ? service(context).sendTestEvent(options.org, context.actor)
          : service(context).sendTestEventTo(options.endpoint, { orgId: options.org, actor: context.actor }),
      ),
    );

  webhook
    .command('update')
    .description('Change an endpoint (as PATCH /v1/webhook-endpoints/{id}); prints it, without its secret')
    .argument('<id>', 'endpoint id')
    .option('--org <id>', 'organisation id (refuses an endpoint of another organisation)')
    .option('--url <url>', 'a new URL, checked as on add')
    .option('--events <list>', `comma-separated event types (${EVENT_TYPES.join(', ')}); "" for all`)
    .option('--description <text>', 'your note; "" clears it')
    .option('--enable', 'enable it again (clears disabled_reason)')
    .option('--disable', 'disable it; its queued deliveries fail')
    .action(
      (id: string, options: { org?: string; url?: string; events?: string; description?: string; enable?: boolean; disable?: boolean }) =>
        cli.runCommand((context) => {
          if (options.enable && options.disable) throw new Error('--enable and --disable exclude each other');
          return service(context).updateEndpoint(
            id,
            {
              url: options.url,
              events: parseList(options.events) as EventType[] | undefined,
              description: options.description === undefined ? undefined : options.description || null,
              enabled: options.enable ? true : options.disable ? false : undefined,
            },
            { orgId: options.org, actor: context.actor },
          );
        }),
    );

  webhook
    .command('rotate-secret')
    .description('Give an endpoint a new signing secret (printed only here); the old one keeps signing too for the grace period')
    .argument('<id>', 'endpoint id')
    .option('--org <id>', 'organisation id (refuses an endpoint of another organisation)')
    .option(
      '--grace-period-seconds <n>',
      'how long the old secret keeps signing (0 to 604800, default 86400)',
      parseInteger('--grace-period-seconds'),
    )
    .action((id: string, options: { org?: string; gracePeriodSeconds?: number }) =>
      cli.runCommand((context) =>
        service(context).rotateSecret(id, { orgId: options.org, gracePeriodSeconds: options.gracePeriodSeconds, actor: context.actor }),
      ),
    );

  webhook
    .command('delete')
    .description('Delete an endpoint with its delivery log; its queued deliveries are never sent')
    .argument('<id>', 'endpoint id')
    .option('--org <id>', 'organisation id (refuses an endpoint of another organisation)')
    .action((id: string, options: { org?: string }) =>
      cli.runCommand((context) => service(context).deleteEndpoint(id, { orgId: options.org, actor: context.actor })),
    );
}

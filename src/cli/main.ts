import { runCliOutcome } from './program.js';

const outcome = await runCliOutcome(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, env: process.env });
// A failure ends the process at once, whatever it still holds open; a finished command lets it drain.
if (outcome.exitNow) process.exit(outcome.code);
process.exitCode = outcome.code;

import { execFileSync } from 'node:child_process';

/** A Chromium (Debian's `chromium`, or CHROMIUM_PATH) to run pages in, if this machine has one. */
export function findChromium(): string | undefined {
  for (const candidate of [process.env.CHROMIUM_PATH, 'chromium', 'chromium-browser', 'google-chrome']) {
    if (!candidate) continue;
    try {
      execFileSync(candidate, ['--version'], { stdio: 'ignore', timeout: 10_000 });
      return candidate;
    } catch {
      // not this one
    }
  }
  return undefined;
}

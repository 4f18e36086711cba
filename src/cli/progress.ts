/** Where a progress bar draws: stderr, or a stand-in of it in a test. */
export type ProgressStream = { isTTY?: boolean; columns?: number; write(text: string): unknown };

export type ProgressBar = { start(total: number): void; update(done: number): void; stop(): void };

/** How often the bar is redrawn at most: more often only costs the export time. */
const REDRAW_MS = 200;

const count = (value: number) => Math.round(value).toLocaleString('en-US');

function duration(seconds: number): string {
  if (!Number.isFinite(seconds)) return '--';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/** One line of the bar: `[#####-----]  52% 520,000/1,000,000 rows  41,230 rows/s  ETA 12s`. */
export function renderProgress(done: number, total: number, elapsedMs: number, width = 30): string {
  const fraction = total > 0 ? Math.min(1, done / total) : 1;
  const filled = Math.round(fraction * width);
  const rate = elapsedMs > 0 ? (done * 1000) / elapsedMs : 0;
  const eta = rate > 0 ? (total - done) / rate : Number.POSITIVE_INFINITY;
  return `[${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${String(Math.floor(fraction * 100)).padStart(3)}% ${count(done)}/${count(total)} rows  ${count(rate)} rows/s  ETA ${duration(eta)}`;
}

/**
 * A progress bar on a terminal, redrawn in place; nothing at all when the stream is not a terminal
 * (a pipe, a file, a CI log), so a script's stderr carries errors only.
 */
export function createProgressBar(stream: ProgressStream = process.stderr, now: () => number = Date.now): ProgressBar {
  if (!stream.isTTY) return { start() {}, update() {}, stop() {} };
  let total = 0;
  let done = 0;
  let startedAt = 0;
  let drawnAt = 0;
  const draw = () => {
    drawnAt = now();
    stream.write(`\r${renderProgress(done, total, drawnAt - startedAt)}\x1b[K`);
  };
  return {
    start(rows) {
      total = rows;
      startedAt = now();
      draw();
    },
    update(rows) {
      done = rows;
      if (now() - drawnAt >= REDRAW_MS) draw();
    },
    stop() {
      draw();
      stream.write('\n');
    },
  };
}

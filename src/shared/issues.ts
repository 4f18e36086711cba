import { AppError } from './app-error.js';

/** Collects every validation problem of a request, so the caller sees them all at once. */
export class Issues {
  private readonly issues: Record<string, string[]> = Object.create(null);

  add(path: string, message: string): this {
    (this.issues[path] ??= []).push(message);
    return this;
  }

  get empty(): boolean {
    return Object.keys(this.issues).length === 0;
  }

  throwIfAny(): void {
    if (!this.empty) throw AppError.validation(this.issues);
  }
}

/** Today's date (UTC) as yyyy-mm-dd. */
export function todayIso(now: Date): string {
  return now.toISOString().slice(0, 10);
}

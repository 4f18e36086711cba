/**
 * Rate-limit windows are counted by the database's clock, which the tests share with the machine.
 * What a test says about one burst window holds only for requests that all ran within one second,
 * and a busy machine (a whole suite runs beside each file) can stretch a burst past the second's end.
 */

/** Waits for the start of the next wall-clock second and returns it (epoch seconds). */
export async function startOfSecond(): Promise<number> {
  const second = Math.floor(Date.now() / 1000) + 1;
  await new Promise((resolve) => setTimeout(resolve, second * 1000 - Date.now() + 5));
  return second;
}

const ATTEMPTS = 20;

/**
 * Makes what a burst spends (`prepare`: a fresh key), then runs `act` at the start of a second, and
 * does both again until `act` finished within that second, so an attempt that spilled into the next
 * second leaves nothing behind for the next one. Fails, saying so, when no second was quiet enough.
 */
export async function withinOneSecond<P, T>(prepare: () => Promise<P>, act: (prepared: P, second: number) => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt += 1) {
    const prepared = await prepare();
    const second = await startOfSecond();
    const result = await act(prepared, second);
    if (Math.floor(Date.now() / 1000) === second) return result;
    if (attempt >= ATTEMPTS) throw new Error(`the machine is too busy: no attempt of ${ATTEMPTS} finished within one second`);
  }
}

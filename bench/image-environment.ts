import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { DockerfileParser, Env } from 'dockerfile-ast';

/**
 * The ENV values of the Dockerfile's runtime (last) stage in `root`: what every process in the image
 * starts with. The bench starts the project with the image's NODE_OPTIONS, and the container tests run
 * the assembled image with all of them.
 */
export function imageEnvironment(root: string): Record<string, string> {
  const instructions = DockerfileParser.parse(readFileSync(join(root, 'Dockerfile'), 'utf8')).getInstructions();
  const runtimeStart = instructions.findLastIndex((instruction) => instruction.getKeyword() === 'FROM');
  const environment: Record<string, string> = {};
  for (const instruction of instructions.slice(runtimeStart)) {
    if (!(instruction instanceof Env)) continue;
    for (const property of instruction.getProperties()) environment[property.getName()] = property.getValue() ?? '';
  }
  return environment;
}

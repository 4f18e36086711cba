import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { PROJECT_ROOT } from '../helpers/svc-process.js';

/*
 * The boundaries a newcomer reads from the folder layout, checked against the imports themselves: each
 * src/modules/<domain> is a unit, and every other top-level folder or file of src is one. A module may
 * use src/shared and src/plugins, and another module only in one direction; the plugins see no module
 * that sees them back. Without the check, a convenient import in the wrong direction goes unnoticed
 * until the units can no longer be read, tested or moved one at a time.
 *
 * Imports are read with TypeScript's own pre-processor, so `import type`, `export … from` and dynamic
 * `import()` all count: a type-only cycle still ties two units together for a reader.
 */
const SRC = join(PROJECT_ROOT, 'src');

type Import = { from: string; to: string };

function sourceFiles(folder: string): string[] {
  return readdirSync(folder, { withFileTypes: true }).flatMap((entry) => {
    const path = join(folder, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.test.ts') && !entry.name.endsWith('.d.ts') ? [path] : [];
  });
}

/** Path relative to src, with forward slashes, as the messages show it. */
const name = (path: string): string => relative(SRC, path).split(sep).join('/');

function relativeImports(files: Set<string>): Import[] {
  const imports: Import[] = [];
  for (const file of files) {
    const { importedFiles } = ts.preProcessFile(readFileSync(file, 'utf8'), true, true);
    for (const { fileName: specifier } of importedFiles) {
      if (!specifier.startsWith('.')) continue;
      const target = resolve(dirname(file), specifier);
      const source = target.replace(/\.js$/, '.ts');
      if (files.has(source)) imports.push({ from: file, to: source });
      // A relative import that is not a source file of src must be a data file (JSON) that exists; anything
      // else means this reader missed a form of import and would pass on a graph it never saw.
      else if (!(specifier.endsWith('.json') && existsSync(target))) {
        throw new Error(`${name(file)}: cannot resolve ${specifier}`);
      }
    }
  }
  return imports;
}

/** src/modules/<domain>/… → modules/<domain>; any other path → its top-level folder or file. */
function unitOf(path: string): string {
  const parts = name(path).split('/');
  return parts[0] === 'modules' && parts.length > 2 ? `modules/${parts[1]}` : parts[0]!;
}

/**
 * Every elementary cycle of the graph, each as its list of edges. Each cycle is found once, from its
 * smallest node, by a depth-first walk that visits only nodes after that one.
 */
function cycles<E>(edges: Map<string, Map<string, E>>): Array<Array<[from: string, to: string, example: E]>> {
  const nodes = [...edges.keys()].sort();
  const found: Array<Array<[string, string, E]>> = [];
  for (const start of nodes) {
    const path: Array<[string, string, E]> = [];
    const onPath = new Set<string>([start]);
    const walk = (node: string): void => {
      for (const [next, example] of edges.get(node) ?? []) {
        if (next === start) found.push([...path, [node, next, example]]);
        else if (next > start && !onPath.has(next)) {
          onPath.add(next);
          path.push([node, next, example]);
          walk(next);
          path.pop();
          onPath.delete(next);
        }
      }
    };
    walk(start);
  }
  return found;
}

function addEdge<E>(edges: Map<string, Map<string, E>>, from: string, to: string, example: E): void {
  const targets = edges.get(from) ?? new Map<string, E>();
  if (!targets.has(to)) targets.set(to, example);
  edges.set(from, targets);
}

const files = new Set(sourceFiles(SRC));
const imports = relativeImports(files);
const describeImport = ({ from, to }: Import): string => `${name(from)} imports ${name(to)}`;

describe('module boundaries', () => {
  it('when src is read, its relative imports are found', () => {
    expect(files.size).toBeGreaterThan(100);
    expect(imports.some(({ from, to }) => name(from) === 'app.ts' && name(to) === 'modules/index.ts')).toBe(true);
  });

  it('when src is read, no two modules import each other, directly or through others, and the plugins import no module that imports them', () => {
    // The modules and the plugins; src/modules/index.ts, which composes the modules, counts as one of them.
    const counted = (unit: string): boolean => unit === 'plugins' || unit.startsWith('modules');
    const edges = new Map<string, Map<string, Import>>();
    for (const edge of imports) {
      const from = unitOf(edge.from);
      const to = unitOf(edge.to);
      if (from !== to && counted(from) && counted(to)) addEdge(edges, from, to, edge);
    }
    const report = cycles(edges).map((cycle) =>
      [
        cycle.map(([from]) => from).join(' -> ') + ` -> ${cycle[0]![0]}`,
        ...cycle.map(([, , example]) => `  ${describeImport(example)}`),
      ].join('\n'),
    );
    expect(report, report.join('\n')).toEqual([]);
  });

  it('when src/plugins and src/shared are read, they import no module: modules build on them, never the other way', () => {
    const leaks = imports
      .filter(({ from, to }) => ['plugins', 'shared'].includes(unitOf(from)) && unitOf(to).startsWith('modules'))
      .map(describeImport);
    expect(leaks, leaks.join('\n')).toEqual([]);
  });

  it('when src/modules is read, no module builds what another module owns: its repositories, services and other factories come in through src/services.ts', () => {
    const built: string[] = [];
    for (const file of files) {
      if (!unitOf(file).startsWith('modules/')) continue;
      const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest);
      for (const statement of source.statements) {
        if (!ts.isImportDeclaration(statement) || !ts.isStringLiteral(statement.moduleSpecifier)) continue;
        const target = resolve(dirname(file), statement.moduleSpecifier.text).replace(/\.js$/, '.ts');
        const clause = statement.importClause;
        const another = files.has(target) && unitOf(target).startsWith('modules/') && unitOf(target) !== unitOf(file);
        if (!another || !clause || clause.isTypeOnly) continue;
        const bindings = clause.namedBindings && ts.isNamedImports(clause.namedBindings) ? clause.namedBindings.elements : [];
        for (const element of bindings) {
          const imported = (element.propertyName ?? element.name).text;
          if (!element.isTypeOnly && /^create[A-Z]/.test(imported)) built.push(`${name(file)} imports ${imported} from ${name(target)}`);
        }
      }
    }
    expect(built, built.join('\n')).toEqual([]);
  });

  it('when src/modules is read, no file imports itself back through others', () => {
    const edges = new Map<string, Map<string, Import>>();
    for (const edge of imports) {
      if (name(edge.from).startsWith('modules/') && name(edge.to).startsWith('modules/'))
        addEdge(edges, name(edge.from), name(edge.to), edge);
    }
    const report = cycles(edges).map((cycle) => cycle.map(([from]) => from).join(' -> ') + ` -> ${cycle[0]![0]}`);
    expect(report, report.join('\n')).toEqual([]);
  });
});

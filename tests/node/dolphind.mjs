// tests/node/dolphind.mjs — starts and stops a dolphind for the Node client
// tests: a free port, the binary from DOLPHIN_BIN (default <repo>/build/
// dolphind), the model from DOLPHIN_SHARED (default <repo>/../shared), ready
// when /healthz answers 200. Not a test file itself (node --test only picks
// up *.test.mjs).
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, closeSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const BIN = process.env.DOLPHIN_BIN || join(REPO, 'build', 'dolphind');
export const SHARED = process.env.DOLPHIN_SHARED || join(REPO, '..', 'shared');

/** Why the tests cannot run here (missing binary or model), or null. */
export function missing(model) {
  if (!existsSync(BIN)) return `${BIN} not built (set DOLPHIN_BIN)`;
  const dir = join(SHARED, 'models', model);
  if (!existsSync(dir)) return `test model ${dir} not found (set DOLPHIN_SHARED)`;
  return null;
}

function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.on('error', fail);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

/** Start dolphind on `model` with extra flags; resolves once it is ready. */
export async function startServer(model, extra = []) {
  const port = await freePort();
  const logPath = join(mkdtempSync(join(tmpdir(), 'dolphind-node-')), 'dolphind.log');
  const fd = openSync(logPath, 'w');
  const args = ['--model', join(SHARED, 'models', model), '--host', '127.0.0.1',
    '--port', String(port), '--threads', '2', ...extra];
  const proc = spawn(BIN, args, { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  let exited = null;
  proc.on('exit', (code, signal) => { exited = { code, signal }; });
  const url = `http://127.0.0.1:${port}`;
  const log = () => { try { return readFileSync(logPath, 'utf8'); } catch { return ''; } };
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (exited) throw new Error(`dolphind exited during start-up (${JSON.stringify(exited)}):\n${log()}`);
    try {
      const r = await fetch(`${url}/healthz`);
      if (r.status === 200) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      proc.kill('SIGKILL');
      throw new Error(`dolphind not ready within 60 s:\n${log()}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    baseURL: `${url}/v1`,
    log,
    /** SIGTERM, then wait; rejects on a non-zero exit or sanitizer report. */
    async stop() {
      if (!exited) {
        const done = new Promise((r) => proc.on('exit', r));
        proc.kill('SIGTERM');
        const timer = setTimeout(() => proc.kill('SIGKILL'), 60_000);
        await done;
        clearTimeout(timer);
      }
      const text = log();
      const bad = ['AddressSanitizer', 'runtime error:', 'LeakSanitizer'].filter((m) => text.includes(m));
      if (exited.code !== 0 || bad.length) {
        throw new Error(`dolphind exit ${JSON.stringify(exited)} ${bad}:\n${text.slice(-4000)}`);
      }
    },
  };
}

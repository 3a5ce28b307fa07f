// What the dashboard scripts share: the system's headless Chromium (playwright-core, no
// browser download) on a fresh profile, named checks, polling, and the RESULT line the
// Rust tests read.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

export const T = 30_000; // generous: a loaded machine is slow
export const passed = [];

export async function check(name, f) {
  try { await f(); } catch (e) { throw new Error(`${name}: ${e.message}`); }
  passed.push(name);
}

// Polled from here: waitForFunction evaluates strings in the page, which the
// dashboard's Content-Security-Policy (script-src 'self') rightly forbids.
export async function until(what, f) {
  const deadline = Date.now() + T;
  for (;;) {
    if (await f()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// Chromium (CHROMIUM, default /usr/bin/chromium) with one page; `errors` collects the
// page's uncaught errors; `finish(failure)` closes it, removes its profile and prints
// `RESULT {"passed":n,"checks":[...],"failed":[...]}`.
export async function openBrowser() {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'statehub-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = context.pages()[0] || await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const finish = async (failure) => {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
    console.log('RESULT ' + JSON.stringify({ passed: passed.length, checks: passed, failed: failure ? [failure] : [] }));
  };
  return { page, errors, finish };
}

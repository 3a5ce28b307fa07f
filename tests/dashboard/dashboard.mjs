// Drives statehub's dashboard in the system's headless Chromium (playwright-core, no
// browser download) and checks what each page shows. Run by
// crates/statehub/tests/dashboard.rs, which starts statehub and the real clients and
// answers this script's `STEP <name> <json>` lines on stdin with `OK` (or a reason)
// once it has done or checked its part. Ends with `RESULT {"passed":n,"failed":[...]}`.
//
// Env: STATEHUB_URL, STATEHUB_ADMIN_KEY, CHROMIUM (default /usr/bin/chromium),
// SCREENSHOT_DIR (optional: one PNG per page).
import path from 'node:path';
import readline from 'node:readline';
import { T, check, openBrowser, until } from './lib.mjs';

const BASE = process.env.STATEHUB_URL;
const KEY = process.env.STATEHUB_ADMIN_KEY;
const SHOTS = process.env.SCREENSHOT_DIR;
const answers = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function step(name, data = {}) {
  console.log(`STEP ${name} ${JSON.stringify(data)}`);
  const { value, done } = await answers.next();
  if (done || value !== 'OK') throw new Error(`step ${name}: ${done ? 'no answer' : value}`);
}

const { page, errors, finish } = await openBrowser();

const text = (sel) => page.evaluate((s) => document.querySelector(s)?.textContent ?? '', sel);
const has = (sel, t) => until(`"${t}" in ${sel}`, async () => (await text(sel)).includes(t));
const visible = (sel) => page.locator(sel).waitFor({ state: 'visible', timeout: T });
const shot = async (name) => { if (SHOTS) await page.screenshot({ path: path.join(SHOTS, name + '.png') }); };
const confirm = async (ok) => { await visible('#confirm'); await page.click(ok ? '#confirm-ok' : '#confirm-cancel'); };

let failure = null;
try {
  await check('login page shown, wrong key refused', async () => {
    await page.goto(BASE + '/');
    await visible('#page-login');
    await page.fill('#login-key', 'not-the-key-0123456789');
    await page.click('#login-form button');
    await has('#login-error', 'The admin key was refused.');
    if (await page.isVisible('#nav')) throw new Error('navigation shown after a refused key');
    await shot('login');
  });

  await check('overview after login', async () => {
    await page.fill('#login-key', KEY);
    await page.click('#login-form button');
    await visible('#page-overview');
    await until('2 connections', async () => Number(await text('#card-connections .value')) >= 2);
    // The second refresh turns counts into rates.
    await until('a rate', async () => /^\d+\.\d$/.test(await text('#card-rate-in .value')));
    await has('#card-wps-hubs .value', '1');
    await shot('overview');
  });

  await check('API refuses a request without the key', async () => {
    const status = await page.evaluate(async () => (await fetch('/admin/api/overview')).status);
    if (status !== 401) throw new Error(`status ${status}`);
  });

  const device = '#clients-table tbody tr[data-client="dash-device"]';
  await check('clients list the MQTT device', async () => {
    await page.click('nav a[href="#clients"]');
    await visible(device);
    for (const text of ['127.0.0.1:', 'devices/+/cmd (QoS 1)', '300 s', 'yes']) await has(device, text);
    const protocol = await page.textContent(device + ' td:nth-child(3)');
    if (protocol !== '5') throw new Error(`protocol shown: ${protocol}`);
    await shot('clients');
  });

  await check('a client disconnected with 0x98', async () => {
    await page.click(device + ' button');
    await confirm(true);
    await step('disconnected', { client: 'dash-device' });
    for (let i = 0; ; i++) {
      await page.click('#clients-refresh');
      await page.waitForTimeout(200);
      const state = await page.textContent(device + ' td:nth-child(4)').catch(() => '');
      if (state === 'no') break;
      if (i > 100) throw new Error('still shown connected');
    }
  });

  await check('scan shows a key set by an MQTT client, with value and version', async () => {
    await page.click('nav a[href="#store"]');
    await page.fill('#scan-pattern', 'dash/*');
    await page.click('#scan-form button[type=submit]');
    await has('#scan-keys', 'dash/seeded');
    await page.click('#scan-keys button:text-is("dash/seeded")');
    await has('#key-view', 'from-mqtt');
    const version = await page.textContent('#key-view dd:nth-of-type(3)');
    if (!/^\d{15}:\d{5}:/.test(version)) throw new Error(`version shown: ${version}`);
  });

  await check('set asks for confirmation; cancel sets nothing', async () => {
    await page.fill('#key-name', 'dash/new');
    await page.fill('#key-value', 'from-browser');
    await page.click('#key-set');
    await confirm(false);
    await step('absent', { key: 'dash/new' });
    await page.click('#key-set');
    await confirm(true);
    await has('#status', 'dash/new set');
    await step('value', { key: 'dash/new', value: 'from-browser' });
  });

  await check('delete with confirmation', async () => {
    await page.click('#key-del');
    await confirm(true);
    await has('#status', 'dash/new deleted');
    await step('absent', { key: 'dash/new' });
  });

  await check('watch sees a change made by another client', async () => {
    await page.fill('#key-name', 'dash/watched');
    await page.click('#key-watch');
    await has('#watch-log', 'dash/watched: (absent)');
    await step('set', { key: 'dash/watched', value: 'changed-by-mqtt' });
    await has('#watch-log', 'dash/watched = changed-by-mqtt @ ');
  });

  await check('watch shows every one of quick changes, with versions, and the delete', async () => {
    // Set five times in a row then deleted by the test's state store client, all
    // well within the half second a poll would have taken.
    const values = ['burst-1', 'burst-2', 'burst-3', 'burst-4', 'burst-5'];
    await step('burst', { key: 'dash/watched', values });
    await has('#watch-count', '7 changes since watching');
    const lines = await page.evaluate(() =>
      [...document.querySelectorAll('#watch-log li')].map((li) => li.textContent));
    const shown = lines.filter((l) => /dash\/watched( = |: )/.test(l));
    const want = ['(absent)', 'changed-by-mqtt', ...values, '(absent)'];
    if (shown.length !== want.length) throw new Error(`log: ${JSON.stringify(lines)}`);
    shown.forEach((line, i) => {
      if (!line.includes(want[i])) throw new Error(`line ${i} is ${line}, not ${want[i]}`);
      if (i > 0 && !/ @ \d{15}:\d{5}:/.test(line)) throw new Error(`no version: ${line}`);
    });
    await page.fill('#scan-pattern', 'dash/*');
    await page.click('#scan-form button[type=submit]');
    await has('#scan-keys', 'dash/seeded');
    await page.click('#scan-keys button:text-is("dash/seeded")');
    await has('#key-view', 'from-mqtt');
    await shot('store');
  });

  await check('Web PubSub hub, group and connection shown; group message delivered', async () => {
    await page.click('nav a[href="#wps"]');
    await page.click('#hubs-table button:text-is("dash")');
    await has('#hub-name', 'dash: 1 connections, 1 groups');
    await has('#groups-table tbody', 'room');
    await has('#conns-table tbody', 'wps-user');
    await page.fill('#send-group', 'room');
    await page.fill('#send-text', 'hello-from-dashboard');
    await page.click('#send-form button');
    await has('#status', 'sent to 1 connection(s) of room');
    await step('wps-received', { text: 'hello-from-dashboard' });
    await shot('wps');
  });

  await check('topic tail shows a message published by rumqttc', async () => {
    await page.click('nav a[href="#tail"]');
    await page.fill('#tail-filter', 'dash/tail/#');
    await page.click('#tail-start');
    await has('#tail-state', 'tailing dash/tail/#');
    await step('publish', { topic: 'dash/tail/1', payload: 'tail-payload' });
    await has('#tail-table tbody', 'dash/tail/1');
    await has('#tail-table tbody', 'tail-payload');
    await shot('tail');
    await page.click('#tail-stop');
  });

  await check('log out forgets the key', async () => {
    await page.click('#logout');
    await visible('#page-login');
    const kept = await page.evaluate(() => sessionStorage.length);
    if (kept !== 0) throw new Error('key still in sessionStorage');
  });

  if (errors.length) throw new Error('page errors: ' + errors.join('; '));
} catch (e) {
  failure = e.message;
  await shot('failure').catch(() => {});
}
await finish(failure);
process.exit(failure ? 1 : 0);

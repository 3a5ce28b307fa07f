// The dashboard's Web PubSub page with more hubs, groups and connections than one page
// holds (the server runs with `[admin] page_limit = 2`), in the system's headless
// Chromium: Next and Previous walk each list. Run by
// crates/statehub/tests/dashboard_paging.rs, which starts statehub and connects hubs
// `pa` (5 connections, groups g1..g5, one each), `pb` and `pc` (one connection each)
// before running this. Ends with `RESULT {"passed":n,"failed":[...]}`.
//
// Env: STATEHUB_URL, STATEHUB_ADMIN_KEY, CHROMIUM (default /usr/bin/chromium).
import { T, check, openBrowser, until } from './lib.mjs';

const BASE = process.env.STATEHUB_URL;
const KEY = process.env.STATEHUB_ADMIN_KEY;

const { page, errors, finish } = await openBrowser();

/// The first cells of a table's rows.
const firsts = (table) => page.evaluate((t) =>
  [...document.querySelectorAll(`#${t} tbody tr`)].map((tr) => tr.firstChild.textContent), table);
const shows = (table, want) => until(`${table} showing ${want}`, async () =>
  JSON.stringify(await firsts(table)) === JSON.stringify(want));
const hidden = (sel) => page.evaluate((s) => document.querySelector(s).hidden, sel);
async function expectButtons(name, prev, next) {
  await until(`${name} buttons prev=${prev} next=${next}`, async () =>
    (await hidden(`#${name}-prev`)) === !prev && (await hidden(`#${name}-next`)) === !next);
}

let failure = null;
try {
  await page.goto(BASE + '/');
  await page.fill('#login-key', KEY);
  await page.click('#login-form button');
  await page.locator('#page-overview').waitFor({ state: 'visible', timeout: T });
  await page.click('nav a[href="#wps"]');

  await check('hubs: two pages, Next and Previous', async () => {
    await shows('hubs-table', ['pa', 'pb']);
    await expectButtons('hubs', false, true);
    await page.click('#hubs-next');
    await shows('hubs-table', ['pc']);
    await expectButtons('hubs', true, false);
    await page.click('#hubs-prev');
    await shows('hubs-table', ['pa', 'pb']);
  });

  await check('groups: three pages of a hub', async () => {
    await page.click('#hubs-table button:text-is("pa")');
    await until('hub pa', async () => (await page.textContent('#hub-name')) === 'pa: 5 connections, 5 groups');
    await shows('groups-table', ['g1', 'g2']);
    await expectButtons('groups', false, true);
    await page.click('#groups-next');
    await shows('groups-table', ['g3', 'g4']);
    await page.click('#groups-next');
    await shows('groups-table', ['g5']);
    await expectButtons('groups', true, false);
    await page.click('#groups-prev');
    await shows('groups-table', ['g3', 'g4']);
  });

  await check('connections: every one once over the pages', async () => {
    const seen = [];
    seen.push(...await firsts('conns-table'));
    for (let i = 0; i < 2; i++) {
      const before = JSON.stringify(await firsts('conns-table'));
      await page.click('#conns-next');
      await until('the next page', async () => JSON.stringify(await firsts('conns-table')) !== before);
      seen.push(...await firsts('conns-table'));
    }
    await expectButtons('conns', true, false);
    if (seen.length !== 5 || new Set(seen).size !== 5) throw new Error(`seen ${JSON.stringify(seen)}`);
    // The groups page stayed where it was.
    await shows('groups-table', ['g3', 'g4']);
  });

  if (errors.length) throw new Error('page errors: ' + errors.join('; '));
} catch (e) {
  failure = e.message;
}
await finish(failure);
process.exit(failure ? 1 : 0);

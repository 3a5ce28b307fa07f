// statehub dashboard: one page per hash (#overview, #clients, #store, #wps, #tail),
// every datum from /admin/api with the admin key as a bearer token. Text from the
// server is only ever put in the page with textContent.
'use strict';

const KEY = 'statehub-admin-key';
const $ = (sel) => document.querySelector(sel);
let timer = null;          // the overview's refresh
let tail = null;           // AbortController of the topic tail
let watch = null;          // AbortController of the watched key
let clientsAfter = null;   // where the next clients page starts
let scanToken = null;

function status(text) {
  $('#status').textContent = text;
  if (text) setTimeout(() => { if ($('#status').textContent === text) $('#status').textContent = ''; }, 4000);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) {
    const td = document.createElement('td');
    if (c instanceof Node) td.append(c); else td.textContent = c === null || c === undefined ? '' : String(c);
    tr.append(td);
  }
  return tr;
}

function shown(v) { // a value as the API shows it: text, or hex when binary
  if (!v) return '';
  const body = v.text !== undefined ? v.text : '0x' + v.hex;
  return v.truncated ? body + ` … (${v.bytes} bytes)` : body;
}

async function api(path, options = {}) {
  const headers = { Authorization: 'Bearer ' + sessionStorage.getItem(KEY), ...(options.headers || {}) };
  if (options.json !== undefined) { headers['Content-Type'] = 'application/json'; options.body = JSON.stringify(options.json); }
  const r = await fetch(path, { ...options, headers });
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) { logout('The admin key was refused.'); throw new Error('unauthorized'); }
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// Server-Sent Events over fetch (EventSource cannot send the bearer header).
function stream(path, onEvent, onEnd) {
  const ctl = new AbortController();
  (async () => {
    try {
      const r = await fetch(path, { headers: { Authorization: 'Bearer ' + sessionStorage.getItem(KEY) }, signal: ctl.signal });
      if (!r.ok) { const b = await r.json().catch(() => ({})); throw new Error(b.error || r.statusText); }
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          let kind = 'message', data = '';
          for (const line of block.split('\n')) {
            if (line.startsWith('event:')) kind = line.slice(6).trim();
            else if (line.startsWith('data:')) data += line.slice(5).trimStart();
          }
          if (data) onEvent(kind, JSON.parse(data));
        }
      }
      onEnd(null);
    } catch (e) { if (e.name !== 'AbortError') onEnd(e); }
  })();
  return ctl;
}

function confirmAction(text) {
  return new Promise((resolve) => {
    const d = $('#confirm');
    $('#confirm-text').textContent = text;
    d.onclose = () => resolve(d.returnValue === 'ok');
    d.returnValue = '';
    d.showModal();
  });
}

function logout(why) {
  sessionStorage.removeItem(KEY);
  stopAll();
  $('#nav').hidden = true;
  $('#login-error').textContent = why || '';
  show('login');
}

function stopAll() {
  clearInterval(timer); timer = null;
  if (tail) { tail.abort(); tail = null; }
  if (watch) { watch.abort(); watch = null; }
}

function show(page) {
  for (const s of document.querySelectorAll('.page')) s.hidden = s.id !== 'page-' + page;
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.getAttribute('href') === '#' + page);
}

function route() {
  if (!sessionStorage.getItem(KEY)) { show('login'); return; }
  $('#nav').hidden = false;
  const page = (location.hash || '#overview').slice(1);
  clearInterval(timer); timer = null;
  status('');
  show(page);
  const load = { overview: startOverview, clients: () => loadClients(true), store: () => {}, wps: loadHubs, tail: () => {} }[page];
  if (load) Promise.resolve(load()).catch((e) => status(e.message));
}

// ---- overview ---------------------------------------------------------------
let previous = null;
async function renderOverview() {
  const o = await api('/admin/api/overview');
  const now = Date.now();
  const rate = (k) => previous ? ((o.mqtt[k] - previous.o.mqtt[k]) * 1000 / (now - previous.t)).toFixed(1) : '…';
  const cards = [
    ['Uptime', `${Math.floor(o.uptime_secs / 3600)}h ${Math.floor(o.uptime_secs / 60) % 60}m ${o.uptime_secs % 60}s`, 'uptime'],
    ['MQTT connections', o.mqtt.connections, 'connections'],
    ['Connections accepted', o.mqtt.connections_total, 'connections-total'],
    ['Subscriptions', o.mqtt.subscriptions, 'subscriptions'],
    ['Messages in', o.mqtt.messages_in, 'messages-in'],
    ['Messages in /s', rate('messages_in'), 'rate-in'],
    ['Messages out', o.mqtt.messages_out, 'messages-out'],
    ['Messages out /s', rate('messages_out'), 'rate-out'],
    ['Dropped', o.mqtt.dropped, 'dropped'],
    ['Retained', o.mqtt.retained_messages, 'retained'],
    ['Persistent sessions', o.mqtt.persistent_sessions, 'persistent'],
    ['Queued messages', o.mqtt.queued_messages, 'queued'],
    ['Web PubSub hubs', o.webpubsub ? o.webpubsub.hubs : 'off', 'wps-hubs'],
    ['Live streams', o.live_streams, 'streams'],
  ];
  previous = { o, t: now };
  const box = $('#overview-cards');
  box.replaceChildren(...cards.map(([label, value, id]) => {
    const c = el('div', null, 'card'); c.id = 'card-' + id;
    c.append(el('div', label, 'label'), el('div', value, 'value'));
    return c;
  }));
}
async function startOverview() {
  await renderOverview();
  timer = setInterval(() => renderOverview().catch((e) => status(e.message)), 2000);
}

// ---- clients ----------------------------------------------------------------
async function loadClients(first) {
  if (first) clientsAfter = null;
  const q = clientsAfter ? '&after=' + encodeURIComponent(clientsAfter) : '';
  const page = await api('/admin/api/clients?limit=50' + q);
  const body = $('#clients-table tbody');
  if (first) body.replaceChildren();
  for (const c of page.clients) {
    const subs = c.subscriptions.map((s) => `${s.filter} (QoS ${s.qos})`).join(', ')
      + (c.subscription_count > c.subscriptions.length ? ` … ${c.subscription_count} in all` : '');
    const expiry = c.session_expiry_secs === 4294967295 ? 'never' : c.session_expiry_secs + ' s';
    let action = '';
    if (c.connected) {
      action = el('button', 'Disconnect', 'danger');
      action.dataset.client = c.client_id;
      action.onclick = () => disconnect(c.client_id);
    }
    const tr = row([c.client_id, c.address, c.protocol, c.connected ? 'yes' : 'no', expiry, subs, c.queued, action]);
    tr.dataset.client = c.client_id;
    body.append(tr);
  }
  clientsAfter = page.next_after;
  $('#clients-more').hidden = !clientsAfter;
}
async function disconnect(id) {
  if (!await confirmAction(`Disconnect ${id} (DISCONNECT 0x98, Administrative action)?`)) return;
  await api('/admin/api/clients/disconnect', { method: 'POST', json: { client_id: id } }).then(
    () => status(`${id} disconnected`), (e) => status(e.message));
  await loadClients(true);
}

// ---- state store ------------------------------------------------------------
async function scan(more) {
  const pattern = $('#scan-pattern').value || '*';
  const q = '?pattern=' + encodeURIComponent(pattern) + (more && scanToken ? '&token=' + encodeURIComponent(scanToken) : '');
  const page = await api('/admin/api/store/scan' + q);
  const list = $('#scan-keys');
  if (!more) list.replaceChildren();
  for (const k of page.keys) {
    const li = el('li'); const b = el('button', shown(k)); b.type = 'button';
    b.onclick = () => { $('#key-name').value = k.text ?? ''; getKey(); };
    li.append(b); list.append(li);
  }
  if (!more && page.keys.length === 0) list.append(el('li', 'no key matches', 'hint'));
  scanToken = page.token; $('#scan-more').hidden = !scanToken;
}
function keyView(pairs) {
  $('#key-view').replaceChildren(...pairs.flatMap(([k, v]) => [el('dt', k), el('dd', v)]));
}
async function getKey() {
  const key = $('#key-name').value;
  try {
    const r = await api('/admin/api/store/key?key=' + encodeURIComponent(key));
    keyView([['key', r.key], ['value', shown(r.value)], ['version', r.version]]);
  } catch (e) { keyView([['key', key], ['value', '(absent)']]); status(e.message); }
}
async function setKey() {
  const key = $('#key-name').value, value = $('#key-value').value;
  if (!await confirmAction(`Set ${key} to "${value}"?`)) return;
  const r = await api('/admin/api/store/key', { method: 'PUT', json: { key, value } });
  status(`${key} set`); keyView([['key', key], ['value', value], ['version', r.version]]);
}
async function delKey() {
  const key = $('#key-name').value;
  if (!await confirmAction(`Delete ${key}?`)) return;
  const r = await api('/admin/api/store/key?key=' + encodeURIComponent(key), { method: 'DELETE' });
  status(r.deleted ? `${key} deleted` : `${key} did not exist`); keyView([['key', key], ['value', '(deleted)']]);
}
// The server pushes every change (its KEYNOTIFY): the first event is the value now,
// each later one a change, with its version; the log keeps the last 500.
function watchKey() {
  if (watch) watch.abort();
  const key = $('#key-name').value, log = $('#watch-log'), count = $('#watch-count');
  let changes = 0, first = true;
  log.replaceChildren(el('li', `watching ${key}`, 'hint'));
  count.textContent = '';
  watch = stream('/admin/api/store/watch?key=' + encodeURIComponent(key), (kind, d) => {
    if (kind === 'overflow') { log.append(el('li', d.error, 'error')); return; }
    if (first) first = false; else changes += 1;
    const at = d.version ? ` @ ${d.version}` : '';
    const text = d.deleted ? `${d.key}: (absent)${at}` : `${d.key} = ${shown(d.value)}${at}`;
    log.append(el('li', `${new Date().toLocaleTimeString()} ${text}`));
    while (log.children.length > 500) log.firstChild.remove();
    count.textContent = `${changes} change${changes === 1 ? '' : 's'} since watching`;
  }, (e) => log.append(el('li', e ? 'watch ended: ' + e.message : 'watch ended', 'error')));
}

// ---- Web PubSub -------------------------------------------------------------
// Keyset paging: each list keeps the `after` cursors of the pages it went through, so
// Previous goes back to the cursor before; Next shows only when the API gave one.
function pager(name) { return { name, cursors: [null], next: null }; }
const hubsPager = pager('hubs'), groupsPager = pager('groups'), connsPager = pager('conns');
const cursor = (p) => p.cursors[p.cursors.length - 1];
function showPager(p, count) {
  const page = p.cursors.length;
  $(`#${p.name}-page`).textContent = page > 1 || p.next ? `page ${page}${count ? ` · ${count} shown` : ''}` : '';
  $(`#${p.name}-prev`).hidden = page === 1;
  $(`#${p.name}-next`).hidden = !p.next;
}
function turn(p, forward, reload) {
  if (forward && p.next) p.cursors.push(p.next);
  else if (!forward && p.cursors.length > 1) p.cursors.pop();
  return reload();
}
const param = (name, value) => value ? `&${name}=${encodeURIComponent(value)}` : '';
async function loadHubs(first) {
  if (first !== false) hubsPager.cursors = [null];
  let r;
  try { r = await api('/admin/api/wps/hubs?limit=50' + param('after', cursor(hubsPager))); } catch (e) {
    $('#wps-off').hidden = false; $('#wps-off').textContent = e.message; return;
  }
  $('#wps-off').hidden = true;
  $('#hubs-table tbody').replaceChildren(...r.hubs.map((h) => {
    const b = el('button', h.name); b.type = 'button'; b.onclick = () => loadHub(h.name);
    return row([b, h.connections]);
  }));
  hubsPager.next = r.next_after; showPager(hubsPager, `${r.hubs.length} of ${r.total}`);
}
async function loadHub(name) {
  groupsPager.cursors = [null]; connsPager.cursors = [null];
  $('#hub-view').dataset.hub = name;
  return renderHub();
}
async function renderHub() {
  const name = $('#hub-view').dataset.hub;
  const h = await api('/admin/api/wps/hub?limit=50&name=' + encodeURIComponent(name)
    + param('groups_after', cursor(groupsPager)) + param('connections_after', cursor(connsPager)));
  $('#hub-view').hidden = false;
  $('#hub-name').textContent = `${h.name}: ${h.connection_count} connections, ${h.group_count} groups`;
  $('#groups-table tbody').replaceChildren(...h.groups.map((g) => row([g.name, g.members])));
  $('#conns-table tbody').replaceChildren(...h.connections.map((c) => row([c.connection_id, c.user_id, c.subprotocol, c.groups.join(', ')])));
  groupsPager.next = h.groups_next_after; showPager(groupsPager, `${h.groups.length} of ${h.group_count}`);
  connsPager.next = h.connections_next_after; showPager(connsPager, `${h.connections.length} of ${h.connection_count}`);
}
async function sendToGroup() {
  const hub = $('#hub-view').dataset.hub, group = $('#send-group').value, text = $('#send-text').value;
  const r = await api('/admin/api/wps/send', { method: 'POST', json: { hub, group, text } });
  status(`sent to ${r.reached} connection(s) of ${group}`);
}

// ---- topic tail -------------------------------------------------------------
function startTail() {
  if (tail) tail.abort();
  const filter = $('#tail-filter').value, body = $('#tail-table tbody');
  body.replaceChildren();
  $('#tail-start').disabled = true; $('#tail-stop').disabled = false;
  $('#tail-state').textContent = `connecting to ${filter}…`;
  tail = stream('/admin/api/tail?filter=' + encodeURIComponent(filter), (kind, d) => {
    if (kind === 'ready') $('#tail-state').textContent = `tailing ${d.filter}`;
    else if (kind === 'overflow') $('#tail-state').textContent = d.error;
    else if (kind === 'message') {
      const tr = row([new Date().toLocaleTimeString(), d.topic, d.qos, shown(d.payload)]);
      tr.lastChild.className = 'payload';
      body.prepend(tr);
      while (body.children.length > 500) body.lastChild.remove();
    }
  }, (e) => { if (e) $('#tail-state').textContent = 'tail ended: ' + e.message; stopTail(); });
}
function stopTail() {
  if (tail) { tail.abort(); tail = null; }
  $('#tail-start').disabled = false; $('#tail-stop').disabled = true;
}

// ---- wiring -----------------------------------------------------------------
function on(sel, event, f) {
  $(sel).addEventListener(event, (e) => { e.preventDefault(); Promise.resolve(f(e)).catch((err) => status(err.message)); });
}
document.addEventListener('DOMContentLoaded', () => {
  on('#login-form', 'submit', async () => {
    sessionStorage.setItem(KEY, $('#login-key').value);
    $('#login-key').value = '';
    try { await api('/admin/api/overview'); } catch (e) { return; }
    $('#login-error').textContent = '';
    if (!location.hash || location.hash === '#login') location.hash = '#overview'; else route();
  });
  on('#logout', 'click', () => logout(''));
  on('#clients-refresh', 'click', () => loadClients(true));
  on('#clients-more', 'click', () => loadClients(false));
  on('#scan-form', 'submit', () => scan(false));
  on('#scan-more', 'click', () => scan(true));
  on('#key-get', 'click', getKey);
  on('#key-set', 'click', setKey);
  on('#key-del', 'click', delKey);
  on('#key-watch', 'click', watchKey);
  on('#send-form', 'submit', sendToGroup);
  on('#hubs-prev', 'click', () => turn(hubsPager, false, () => loadHubs(false)));
  on('#hubs-next', 'click', () => turn(hubsPager, true, () => loadHubs(false)));
  on('#groups-prev', 'click', () => turn(groupsPager, false, renderHub));
  on('#groups-next', 'click', () => turn(groupsPager, true, renderHub));
  on('#conns-prev', 'click', () => turn(connsPager, false, renderHub));
  on('#conns-next', 'click', () => turn(connsPager, true, renderHub));
  on('#tail-form', 'submit', startTail);
  on('#tail-stop', 'click', stopTail);
  window.addEventListener('hashchange', route);
  route();
});

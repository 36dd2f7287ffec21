'use strict';
// The status page as a console. It reads the sidecar's views (GET), and changes state only through
// `send` (JSON, with the admin key when one was entered). The key lives in sessionStorage, for
// this tab only, and never in a URL. Every text from the sidecar goes in through textContent.
const KEY = 'lanes-admin-key';
const REPORT_EVERY_S = 15;  // the report changes by the hour: no need to ask every second
const FORECAST_EVERY_S = 5;  // a rate over the last hour moves slowly

function el(tag, text, cls){
  const e = document.createElement(tag);
  if(text !== undefined) e.textContent = String(text);
  if(cls) e.className = cls;
  return e;
}
function row(cells){
  const tr = el('tr');
  for(const c of cells){
    const td = el('td');
    if(c instanceof Node) td.appendChild(c);
    else td.textContent = c === null || c === undefined ? '—' : String(c);
    tr.appendChild(td);
  }
  return tr;
}
function notice(text){ document.getElementById('notice').textContent = text || ''; }
function auth(){
  const key = sessionStorage.getItem(KEY);
  return key ? {'Authorization': 'Bearer ' + key} : {};
}
function why(method, path, response, data){
  const reason = data && data.error ? data.error.message : response.statusText;
  const hint = response.status === 401 || response.status === 403
    ? ' — enter the admin key above' : '';
  return `${method} ${path}: ${response.status} ${reason}${hint}`;
}
// A view: {ok, data, why}. With client keys configured the views need a key too.
async function get(path){
  const response = await fetch(path, {headers: auth()});
  let data = null; try{ data = await response.json(); }catch(e){}
  return {ok: response.ok, data, why: response.ok ? '' : why('GET', path, response, data)};
}
// The one way this page changes state: JSON, and the admin key (if any) as a Bearer token.
async function send(method, path, body){
  const headers = {'Content-Type': 'application/json', ...auth()};
  const response = await fetch(path, {method, headers, body: JSON.stringify(body ?? {})});
  let data = null; try{ data = await response.json(); }catch(e){}
  notice(response.ok ? '' : why(method, path, response, data));
  return {ok: response.ok, status: response.status, data};
}
function showKey(){
  document.getElementById('admin-state').textContent =
    sessionStorage.getItem(KEY) ? 'key set for this tab' : 'no key';
}
document.getElementById('admin').onsubmit = (e) => {
  e.preventDefault();
  const input = document.getElementById('admin-key');
  if(input.value) sessionStorage.setItem(KEY, input.value);
  input.value = ''; showKey(); refresh(true);
};
document.getElementById('admin-forget').onclick = () => {
  sessionStorage.removeItem(KEY); showKey(); refresh(true);
};
async function decide(id, decision){
  await send('POST', '/v1/approvals/' + encodeURIComponent(id), {decision});
  refresh();
}
async function toggle(lane, off){
  await send('POST', `/v1/lanes/${encodeURIComponent(lane)}/${off ? 'off' : 'on'}`, {});
  refresh();
}
async function revoke(id){
  await send('DELETE', '/v1/grants/' + encodeURIComponent(id), {});
  refresh();
}
// Redraw a part only when what it shows changed (its clocks left out by the caller).
const drawn = {};
function draw(part, data, paint){
  const text = JSON.stringify(data);
  if(drawn[part] === text) return;
  paint(data); drawn[part] = text;
}

// Keyed rows: a row per key, kept from one refresh to the next; a cell is rewritten only when
// what it shows changed, and a control keeps its element (its label and action updated in place),
// so nothing under the pointer is ever replaced — a press on "Switch off" that spans a refresh
// still clicks. A row comes and goes only with its key. A row: {key, cls, data: {dataset},
// span: colSpan of a lone cell, cells: [a value (text), or {tag, text, cls, title, act}]}.
function sync(box, rows, tag = 'tr', slot = 'td'){
  const have = new Map();
  for(const child of box.children) have.set(child.dataset.key, child);
  let at = box.firstElementChild;
  for(const r of rows){
    let node = have.get(r.key);
    if(node) have.delete(r.key);
    else{ node = el(tag); node.dataset.key = r.key; }
    if(node === at) at = at.nextElementSibling;
    else box.insertBefore(node, at);
    fill(node, r, slot);
  }
  for(const node of have.values()) node.remove();
}
function fill(node, r, slot){
  if(node.className !== (r.cls || '')) node.className = r.cls || '';
  for(const [k, v] of Object.entries(r.data || {})) if(node.dataset[k] !== v) node.dataset[k] = v;
  while(node.children.length > r.cells.length) node.lastElementChild.remove();
  r.cells.forEach((c, i) => {
    const cell = node.children[i] || node.appendChild(el(slot));
    if(r.span && cell.colSpan !== r.span) cell.colSpan = r.span;
    put(cell, c);
  });
}
function put(cell, c){
  if(c === null || c === undefined || typeof c !== 'object'){
    const text = c === null || c === undefined ? '—' : String(c);
    if(cell.firstElementChild) cell.replaceChildren();
    if(cell.textContent !== text) cell.textContent = text;
    return;
  }
  let node = cell.firstElementChild;
  if(!node || node.tagName !== c.tag.toUpperCase()){ node = el(c.tag); cell.replaceChildren(node); }
  const text = String(c.text ?? '');
  if(node.textContent !== text) node.textContent = text;
  if(node.className !== (c.cls || '')) node.className = c.cls || '';
  if(node.title !== (c.title || '')) node.title = c.title || '';
  for(const [k, v] of Object.entries(c.data || {})) if(node.dataset[k] !== v) node.dataset[k] = v;
  if('disabled' in c && node.disabled !== c.disabled) node.disabled = c.disabled;
  if(c.act) node.onclick = c.act;
}
function only(key, text, cls, span){ return {key, cls, span, cells: [text]}; }

// Every time on the page is UTC, and says so.
function utc(epoch){ return new Date(epoch * 1000).toISOString().slice(0, 16).replace('T', ' ') + ' UTC'; }
function utcTime(epoch){
  const at = new Date(epoch * 1000).toISOString(), today = new Date().toISOString().slice(0, 10);
  return at.slice(0, 10) === today ? at.slice(11, 19) : at.slice(0, 19).replace('T', ' ');
}
function text(id, value){
  const e = document.getElementById(id);
  if(e.textContent !== value) e.textContent = value;
}

function showSummary(state){
  const paid = state.paid;
  text('summary', `free lane ${state.free_lane ? 'on' : 'OFF'} · ` +
    `paid today $${paid.spent_today_usd.toFixed(6)} of $${paid.ceiling_usd.toFixed(2)} · ` +
    `fallback ${paid.fallback}` +
    (state.state && !state.state.up ? ` · state ${state.state.kind} DOWN: paid closed` : ''));
}
function showApprovals(approvals){
  const box = document.getElementById('approvals');
  if(!approvals.ok){ sync(box, [only('!', {tag: 'span', text: approvals.why, cls: 'bad'})], 'div', 'span'); return; }
  const rows = approvals.data.data.map(a => ({key: 'a:' + a.id, cls: 'approval', data: {id: a.id},
    cells: [`${a.id}: client ${a.client} → ${a.candidate} ` +
      `(≤ $${a.estimated_cost_usd.toFixed(4)}); free exhausted: ${a.exhausted.join(', ') || '—'} `,
      ...[['Approve once', 'once'], ['Approve 1 h', '1h'], ['Deny', 'deny']].map(([label, d]) =>
        ({tag: 'button', text: label, act: () => decide(a.id, d)}))]}));
  sync(box, rows.length ? rows : [only('-', 'none', 'none')], 'div', 'span');
}
function showGrants(grants){
  const body = document.getElementById('grants');
  if(!grants.ok){ sync(body, [only('!', grants.why, 'bad', 5)]); return; }
  const rows = grants.data.data.map(g => ({key: 'g:' + g.id, cls: 'grant', data: {id: g.id},
    cells: [{tag: 'code', text: g.id.length > 20 ? g.id.slice(0, 20) + '…' : g.id, title: g.id},
      g.client, g.kind === 'once'
        ? `paid fallback once, on ${g.candidate}, for the client's retry`
        : 'paid fallback, any paid model',
      utc(g.until), {tag: 'button', text: 'Revoke', cls: 'revoke', act: () => revoke(g.id)}]}));
  sync(body, rows.length ? rows : [only('-', 'none', 'none', 5)]);
}

// The lanes table, paged per lane: a lane shows PAGE_ROWS of its models at a time, with a row to
// page through the rest — a catalog of thousands of models is never drawn whole.
const PAGE_ROWS = 50;
const offsets = {};  // lane → the first of its models shown
function turn(lane, by, total){
  offsets[lane] = Math.max(0, Math.min((offsets[lane] || 0) + by, total - 1));
  if(lastState) showLanes(lastState);
}
function modelRow(l, m, first, said){
  // the lane's own state: switched off, its provider unreachable (why, on hover), else its breaker
  const unreachable = said && said.state === 'unreachable';
  const lane = {tag: 'span', text: l.off ? 'off' : unreachable ? 'unreachable' : l.breaker.state,
    cls: (l.off || unreachable || l.breaker.state !== 'closed') ? 'bad' : 'ok',
    title: unreachable ? said.why : ''};
  const sw = first ? {tag: 'button', text: l.off ? 'Switch on' : 'Switch off', cls: 'switch',
    data: {lane: l.name}, act: () => toggle(l.name, !l.off)} : '';
  const canary = m.quarantined ? {tag: 'span', text: 'quarantined', cls: 'pill quarantined',
    title: m.quarantined} : '';
  // the lane's first row is keyed by the lane, not its model: its switch stays put when the
  // models change order (the most used first)
  const key = first ? 'first:' + l.name : `m:${l.name}/${m.model}`;
  return {key, data: {lane: l.name}, cells: [l.name, l.kind, sw, lane,
    m.model, m.tier, {tag: 'span', text: m.breaker.state, cls: m.breaker.state !== 'closed' ? 'bad' : 'ok'},
    m.free_now ? 'yes' : (m.reason || 'no'),
    m.backoff_s ? `${Math.ceil(m.backoff_s)} s (${m.backoff_reason})` : '',  // a countdown
    m.requests_remaining, m.used_today, canary]};
}
function laneRows(l, said){
  const total = l.models.length, from = Math.min(offsets[l.name] || 0, Math.max(total - 1, 0));
  const rows = l.models.slice(from, from + PAGE_ROWS).map((m, i) => modelRow(l, m, i === 0, said));
  if(total > PAGE_ROWS){
    const to = Math.min(from + PAGE_ROWS, total);
    rows.push({key: 'pager:' + l.name, cls: 'other pager', data: {lane: l.name}, cells: [l.name,
      l.kind, {tag: 'button', text: '‹ previous', cls: 'previous', disabled: from === 0,
        act: () => turn(l.name, -PAGE_ROWS, total)}, '',
      `models ${from + 1}–${to} of ${total.toLocaleString('en')}`, '', '', '', '', '', '',
      {tag: 'button', text: 'next ›', cls: 'next', disabled: to >= total,
        act: () => turn(l.name, PAGE_ROWS, total)}]});
  }
  if(l.other)  // the models beyond [metrics] models_per_lane, summed up by the sidecar
    rows.push({key: 'other:' + l.name, cls: 'other', data: {lane: l.name}, cells: [l.name, l.kind,
      '', '', `${l.other.models} more models`, '', '', `${l.other.free_now} free now`, '', '', '', '']});
  return rows;
}
let lastState = null;
function showLanes(state){
  lastState = state;
  const said = Object.fromEntries((state.configured || []).map((c) => [c.name, c]));
  const rows = state.lanes.flatMap((l) => laneRows(l, said[l.name]));
  const shown = new Set(rows.map((r) => r.data.lane));
  // every lane the config names: one with no model listed yet has a row of its own, saying why
  for(const c of state.configured || []){
    if(shown.has(c.name) || c.state === 'unavailable') continue;
    const off = c.state === 'off';
    rows.push({key: 'first:' + c.name, data: {lane: c.name}, cells: [c.name, c.kind,
      {tag: 'button', text: off ? 'Switch on' : 'Switch off', cls: 'switch', data: {lane: c.name},
        act: () => toggle(c.name, !off)},
      {tag: 'span', text: c.state.replace('_', ' '), cls: 'bad', title: c.why},
      '', '', '', c.why, '', '', '', '']});
  }
  for(const [name, reason] of Object.entries(state.unavailable))
    rows.push({key: 'u:' + name, cells: [name, '', '', 'unavailable', '', '', '', reason, '', '', '', '']});
  sync(document.getElementById('lanes'), rows);
}
function showRecent(recent){
  sync(document.getElementById('recent'), recent.map(j => ({key: 'j:' + j.id, cells: [
    utcTime(j.at), {tag: 'code', text: j.id.slice(0, 12), title: j.id},
    {tag: 'span', text: j.route || '—', cls: 'pill'}, j.lane || '—', j.model || '—', j.client,
    j.cohort || '—', j.outcome, j.attempts, `${Math.round(j.latency_s * 1000)} ms`,
    '$' + j.cost_usd.toFixed(6)]})));
}

const OUTLOOK = {used_up: 'used up', runs_out: 'runs out', lasts: 'lasts', no_rate: 'no rate',
  at_ceiling: 'at the ceiling', reaches_ceiling: 'reaches the ceiling', within: 'within'};
function count(v){ return v >= 100 ? Math.round(v).toLocaleString('en') : String(+v.toPrecision(3)); }
function dollars(v){ return '$' + (v >= 0.1 || v === 0 ? v.toFixed(2) : v.toFixed(6)); }
function outlook(name){ return el('span', OUTLOOK[name] || name, 'pill ' + name); }
// GET /v1/forecast: every free quota's projected end, and the paid day's; each says how it was
// made (the notes come from the sidecar), and nothing here is shown as a fact.
function showForecast(forecast){
  const paid = document.getElementById('forecast-paid'), body = document.getElementById('forecast');
  const method = document.getElementById('forecast-method');
  paid.replaceChildren(); body.replaceChildren(); method.textContent = '';
  if(!forecast.ok){ paid.appendChild(el('span', forecast.why, 'bad')); return; }
  const f = forecast.data, p = f.paid;
  const who = p.client === null ? 'paid today' : `paid today (client ${p.client})`;
  paid.append(el('strong', `${who}: ${dollars(p.spent_usd)} of ${dollars(p.ceiling_usd)} `),
    outlook(p.outlook), el('span', ' ' + p.note));
  paid.dataset.outlook = p.outlook;
  if(f.cache){  // the response cache: what its hits saved (an admin's view)
    const c = f.cache, saved = el('div', `response cache ${c.mode}: ${count(c.hits)} hits, ` +
      `${count(c.misses)} misses; saved ${count(c.saved_tokens)} tokens and ` +
      `${dollars(c.saved_usd)}`, 'muted');
    saved.id = 'forecast-cache'; paid.appendChild(saved);
  }
  if(!f.quotas.length){
    const tr = el('tr', undefined, 'none'), td = el('td', 'no free quota per day or month');
    td.colSpan = 6; tr.appendChild(td); body.appendChild(tr);
  }
  for(const q of f.quotas){
    const used = el('span'), bar = el('meter');
    bar.max = q.limit; bar.value = Math.min(q.used, q.limit); bar.high = q.limit * 0.8;
    used.append(bar, `${count(q.used)} / ${count(q.limit)}`);
    const note = el('span'); note.append(outlook(q.outlook), ' ' + q.note);
    const tr = row([q.scope, `${q.dimension} per ${q.window}` +
        (q.source === 'reported' ? ' (reported)' : ''), used,
      q.rate_per_hour === null ? '—' : `${count(q.rate_per_hour)} ${q.dimension}/h`,
      utc(q.resets_at), note]);
    tr.className = 'quota'; tr.dataset.scope = q.scope; tr.dataset.outlook = q.outlook;
    body.appendChild(tr);
  }
  if(f.left_off){
    const tr = el('tr', undefined, 'other'), td = el('td', `… ${f.left_off} more quotas`);
    td.colSpan = 6; tr.appendChild(td); body.appendChild(tr);
  }
  method.textContent = `Rates: ${f.method.rate}, the window being the last ` +
    `${f.method.window_s / 60} min. Projections: ${f.method.projection}. Times: ${f.method.clock}.`;
}

// The forecast's batches (work that can wait): a bar of done / failed / left, the pace and the
// projected end the sidecar worked out. The panel shows only where batches are served.
const BATCH_OUTLOOK = {finishes: 'finishes', expires: 'expires', no_rate: 'no pace yet',
  ending: 'ending'};
function showBatches(forecast){
  const panel = document.getElementById('batches-panel'), body = document.getElementById('batches');
  const batches = forecast.ok ? forecast.data.batches : undefined;
  panel.hidden = batches === undefined;
  body.replaceChildren();
  if(!batches) return;
  if(!batches.length){
    const tr = el('tr', undefined, 'none'), td = el('td', 'no batch running');
    td.colSpan = 7; tr.appendChild(td); body.appendChild(tr);
  }
  for(const b of batches){
    const bar = el('span', undefined, 'batch-bar'), total = Math.max(b.total, 1);
    for(const [part, n] of [['done', b.completed], ['failed', b.failed], ['left', b.left]]){
      const piece = el('span', undefined, part); piece.style.width = (100 * n / total) + '%';
      bar.appendChild(piece);
    }
    const counts = el('span'); counts.append(bar, `${b.completed} / ${b.failed} / ${b.left}`);
    const note = el('span');
    note.append(el('span', BATCH_OUTLOOK[b.outlook] || b.outlook, 'pill ' + b.outlook), ' ' + b.note);
    const tr = row([b.id, b.endpoint, counts,
      b.items_per_hour === null ? '—' : `${count(b.items_per_hour)} items/h`,
      utc(b.expires_at), dollars(b.paid_usd), note]);
    tr.className = 'batch'; tr.dataset.batch = b.id; tr.dataset.outlook = b.outlook;
    body.appendChild(tr);
  }
}

// The forecast and the report without their clocks (when each was made, where its window starts):
// redrawn when a projection or a measure changes, not because time passed.
function forecastContent(forecast){
  if(!forecast.ok) return forecast;
  const {at, method, ...rest} = forecast.data, {since, ...how} = method || {};
  return {...rest, method: how};
}
function reportContent(report){
  if(!report.ok) return report;
  const {since, ...rest} = report.data;
  return rest;
}

// One refresh at a time: the next starts a second after the last one ended (never beside it; later
// when the last took long — a large catalog's views cost the sidecar too), and one asked for
// meanwhile (after an action) runs as soon as the running one ends.
const REFRESH_MS = 1000;
let reportAt = -Infinity, forecastAt = -Infinity;
let running = false, again = false, forceNext = false, timer = null;
function refresh(force){
  forceNext = forceNext || !!force;
  if(running){ again = true; return; }
  clearTimeout(timer);
  run();
}
async function run(){
  running = true;
  const force = forceNext, started = performance.now();
  forceNext = false;
  try{ await refreshOnce(force); }
  finally{ running = false; }
  if(again){ again = false; run(); }
  else timer = setTimeout(refresh, Math.max(REFRESH_MS, 2 * (performance.now() - started)));
}
function showState(state){
  if(!state.ok){ text('summary', state.why); return; }
  showSummary(state.data);
  showLanes(state.data);
  showRecent(state.data.recent);
}
// Each section is drawn as soon as its own view answers, in a task of its own (the lanes' apart
// from the task that parsed their view: with a large catalog, each is tens of milliseconds).
function yielded(value){ return new Promise((resolve) => setTimeout(() => resolve(value))); }
async function refreshOnce(force){
  const now = Date.now() / 1000, views = [get('/v1/lanes').then(yielded).then(showState),
    get('/v1/approvals').then(showApprovals), get('/v1/grants').then(showGrants)];
  if(force || now - reportAt >= REPORT_EVERY_S){
    reportAt = now;  // redrawn when the report changes, and when the hour turns
    views.push(get('/v1/report?since=7d').then((report) =>
      draw('report', {report: reportContent(report), hour: Math.floor(now / 3600)},
        () => showReport(report))));
  }
  if(force || now - forecastAt >= FORECAST_EVERY_S){
    forecastAt = now;
    views.push(get('/v1/forecast').then((forecast) => {
      draw('forecast', forecastContent(forecast), () => showForecast(forecast));
      draw('batches', forecast.ok ? forecast.data.batches : null, () => showBatches(forecast));
    }));
  }
  const ended = await Promise.allSettled(views);
  if(ended.some((e) => e.status === 'rejected')) text('summary', 'sidecar unreachable');
}
showKey(); refresh(true);

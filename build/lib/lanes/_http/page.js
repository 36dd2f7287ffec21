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
// Redraw a part only when what it shows changed, so a button is not replaced under the pointer.
const drawn = {};
function draw(part, data, paint){
  const text = JSON.stringify(data);
  if(drawn[part] === text) return;
  paint(data); drawn[part] = text;
}
function when(epoch){
  const d = new Date(epoch * 1000);
  const same = d.toDateString() === new Date().toDateString();
  return same ? d.toLocaleTimeString() : d.toLocaleString();
}

function showSummary(state){
  const paid = state.paid;
  document.getElementById('summary').textContent = `free lane ${state.free_lane ? 'on' : 'OFF'} · ` +
    `paid today $${paid.spent_today_usd.toFixed(6)} of $${paid.ceiling_usd.toFixed(2)} · ` +
    `fallback ${paid.fallback}` +
    (state.state && !state.state.up ? ` · state ${state.state.kind} DOWN: paid closed` : '');
}
function showApprovals(approvals){
  const box = document.getElementById('approvals'); box.replaceChildren();
  if(!approvals.ok){ box.appendChild(el('span', approvals.why, 'bad')); return; }
  if(!approvals.data.data.length) box.appendChild(el('span', 'none', 'none'));
  for(const a of approvals.data.data){
    const d = el('div', undefined, 'approval'); d.dataset.id = a.id;
    d.appendChild(el('span', `${a.id}: client ${a.client} → ${a.candidate} ` +
      `(≤ $${a.estimated_cost_usd.toFixed(4)}); ` +
      `free exhausted: ${a.exhausted.join(', ') || '—'} `));
    for(const [label, decision] of [['Approve once', 'once'], ['Approve 1 h', '1h'],
                                    ['Deny', 'deny']]){
      const b = el('button', label); b.onclick = () => decide(a.id, decision); d.appendChild(b);
    }
    box.appendChild(d);
  }
}
function showGrants(grants){
  const body = document.getElementById('grants'); body.replaceChildren();
  const only = (text, cls) => {
    const tr = el('tr', undefined, cls), td = el('td', text); td.colSpan = 5;
    tr.appendChild(td); body.appendChild(tr);
  };
  if(!grants.ok){ only(grants.why, 'bad'); return; }
  if(!grants.data.data.length) only('none', 'none');
  for(const g of grants.data.data){
    const id = el('code', g.id.length > 20 ? g.id.slice(0, 20) + '…' : g.id); id.title = g.id;
    const what = g.kind === 'once'
      ? `paid fallback once, on ${g.candidate}, for the client's retry`
      : 'paid fallback, any paid model';
    const b = el('button', 'Revoke', 'revoke'); b.onclick = () => revoke(g.id);
    const tr = row([id, g.client, what, when(g.until), b]);
    tr.className = 'grant'; tr.dataset.id = g.id; body.appendChild(tr);
  }
}
function showLanes(state){
  const lanes = document.getElementById('lanes'); lanes.replaceChildren();
  for(const l of state.lanes){
    l.models.forEach((m, i) => {
      const st = el('span', l.off ? 'off' : l.breaker.state,
                    (l.off || l.breaker.state !== 'closed') ? 'bad' : 'ok');
      const mb = el('span', m.breaker.state, m.breaker.state !== 'closed' ? 'bad' : 'ok');
      let sw = '';
      if(i === 0){
        sw = el('button', l.off ? 'Switch on' : 'Switch off', 'switch');
        sw.dataset.lane = l.name; sw.onclick = () => toggle(l.name, !l.off);
      }
      const canary = m.quarantined ? el('span', 'quarantined', 'pill quarantined') : '';
      if(m.quarantined) canary.title = m.quarantined;
      const tr = row([l.name, l.kind, sw, st, m.model, m.tier, mb,
        m.free_now ? 'yes' : (m.reason || 'no'),
        m.backoff_s ? `${m.backoff_s.toFixed(1)} s (${m.backoff_reason})` : '',
        m.requests_remaining, m.used_today, canary]);
      tr.dataset.lane = l.name; lanes.appendChild(tr);
    });
    if(l.other){  // the models beyond [metrics] models_per_lane, summed up
      const tr = row([l.name, l.kind, '', '', `${l.other.models} more models`, '', '',
        `${l.other.free_now} free now`, '', '', '', '']);
      tr.dataset.lane = l.name; tr.className = 'other'; lanes.appendChild(tr);
    }
  }
  for(const [name, reason] of Object.entries(state.unavailable))
    lanes.appendChild(row([name, '', '', 'unavailable', '', '', '', reason, '', '', '', '']));
}
function showRecent(state){
  const recent = document.getElementById('recent'); recent.replaceChildren();
  for(const j of state.recent){
    const id = el('code', j.id.slice(0, 12)); id.title = j.id;
    recent.appendChild(row([new Date(j.at * 1000).toLocaleTimeString(), id,
      el('span', j.route || '—', 'pill'), j.lane || '—', j.model || '—', j.client,
      j.cohort || '—', j.outcome, j.attempts, `${Math.round(j.latency_s * 1000)} ms`,
      '$' + j.cost_usd.toFixed(6)]));
  }
}

const OUTLOOK = {used_up: 'used up', runs_out: 'runs out', lasts: 'lasts', no_rate: 'no rate',
  at_ceiling: 'at the ceiling', reaches_ceiling: 'reaches the ceiling', within: 'within'};
function count(v){ return v >= 100 ? Math.round(v).toLocaleString('en') : String(+v.toPrecision(3)); }
function dollars(v){ return '$' + (v >= 0.1 || v === 0 ? v.toFixed(2) : v.toFixed(6)); }
function utc(epoch){ return new Date(epoch * 1000).toISOString().slice(0, 16).replace('T', ' ') + ' UTC'; }
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

let reportAt = -Infinity, forecastAt = -Infinity;
async function refresh(force){
  try{
    const now = Date.now() / 1000, wantReport = force || now - reportAt >= REPORT_EVERY_S;
    const wantForecast = force || now - forecastAt >= FORECAST_EVERY_S;
    const [state, approvals, grants, report, forecast] = await Promise.all([
      get('/v1/lanes'), get('/v1/approvals'), get('/v1/grants'),
      wantReport ? get('/v1/report?since=7d') : null,
      wantForecast ? get('/v1/forecast') : null]);
    draw('approvals', approvals, showApprovals);
    draw('grants', grants, showGrants);
    if(report){  // redrawn when the report changes, and when the hour turns
      reportAt = now;
      draw('report', {report, hour: Math.floor(now / 3600)}, (d) => showReport(d.report));
    }
    if(forecast){
      forecastAt = now;
      draw('forecast', forecast, showForecast);
      draw('batches', forecast.ok ? forecast.data.batches : null, () => showBatches(forecast));
    }
    if(!state.ok){ document.getElementById('summary').textContent = state.why; return; }
    showSummary(state.data);
    draw('lanes', state.data, showLanes);
    draw('recent', state.data.recent, () => showRecent(state.data));
  }catch(e){ document.getElementById('summary').textContent = 'sidecar unreachable'; }
}
showKey(); refresh(true); setInterval(refresh, 1000);

"""The status page as a console: one self-contained HTML file, no build step, no CDN, no external
asset of any kind (the icon is an inline data URL).

Every state-changing request the page makes goes through one helper, `send(method, path, body)`:
JSON with `Content-Type: application/json`, and — when an admin key was entered in the page's key
field — `Authorization: Bearer <key>`. The key is kept in sessionStorage (gone with the tab),
never in a URL. The kill-switch buttons and the approval buttons both use it.
"""

# A backslash at the end of a line continues it: Python drops the backslash and the newline, so the
# page served is exactly the joined line.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lanes</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
 body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#222;background:#fafafa}
 h1{font-size:1.3rem;margin:0 0 .2rem} h2{font-size:1.05rem;margin:1.4rem 0 .4rem}
 table{border-collapse:collapse;width:100%;background:#fff} \
td,th{border:1px solid #ddd;padding:.3rem .5rem;text-align:left}
 th{background:#f0f0f0} .ok{color:#176f2c} .bad{color:#a11} .muted{color:#777}
 button{margin-right:.4rem;padding:.25rem .7rem;cursor:pointer} #approvals .none{color:#777}
 .pill{display:inline-block;padding:0 .4rem;border-radius:.6rem;background:#eee;font-size:.85em}
 .quarantined{background:#fde2e2;color:#a11} #admin{margin:.6rem 0} #admin input{width:16rem}
 #notice{min-height:1.2em} code{font-size:.85em}
</style></head>
<body>
<h1>lanes</h1><div class="muted" id="summary">loading…</div>
<form id="admin" autocomplete="off"><label>Admin key <input id="admin-key" type="password" \
placeholder="only when client keys are configured"></label> \
<button type="submit" id="admin-save">Use key</button>\
<button type="button" id="admin-forget">Forget</button> \
<span class="muted" id="admin-state"></span></form>
<div id="notice" class="bad" role="status"></div>
<h2>Pending approvals</h2><div id="approvals"><span class="none">none</span></div>
<h2>Lanes</h2>
<table><thead><tr><th>lane</th><th>kind</th><th>switch</th><th>lane breaker</th><th>model</th>\
<th>tier</th><th>model breaker</th><th>free now</th><th>backoff</th><th>remaining</th>\
<th>used today</th><th>canary</th></tr></thead><tbody id="lanes"></tbody></table>
<h2>Recent jobs</h2>
<table><thead><tr><th>when</th><th>request id</th><th>route</th><th>lane</th><th>model</th>\
<th>client</th><th>cohort</th><th>outcome</th><th>attempts</th><th>latency</th><th>cost</th>\
</tr></thead>
<tbody id="recent"></tbody></table>
<script>
const KEY = 'lanes-admin-key';
function el(tag, text, cls){const e=document.createElement(tag); \
if(text!==undefined) e.textContent=String(text); if(cls) e.className=cls; return e;}
function row(cells){const tr=el('tr'); for(const c of cells){const td=el('td'); \
if(c instanceof Node) td.appendChild(c); \
else td.textContent=c===null||c===undefined?'—':String(c); \
tr.appendChild(td);} return tr;}
function notice(text){document.getElementById('notice').textContent = text || '';}
// The one way this page changes state: JSON, and the admin key (if any) as a Bearer token.
async function send(method, path, body){
  const headers = {'Content-Type': 'application/json'};
  const key = sessionStorage.getItem(KEY);
  if(key) headers['Authorization'] = 'Bearer ' + key;
  const response = await fetch(path, {method, headers, body: JSON.stringify(body ?? {})});
  let data = null; try{ data = await response.json(); }catch(e){}
  if(!response.ok){
    const why = data && data.error ? data.error.message : response.statusText;
    notice(`${method} ${path}: ${response.status} ${why}` + \
(response.status===401||response.status===403 ? ' — enter the admin key above' : ''));
  } else notice('');
  return {ok: response.ok, status: response.status, data};
}
function showKey(){ document.getElementById('admin-state').textContent = \
sessionStorage.getItem(KEY) ? 'key set for this tab' : 'no key'; }
document.getElementById('admin').onsubmit = (e) => { e.preventDefault(); \
const input = document.getElementById('admin-key'); \
if(input.value) sessionStorage.setItem(KEY, input.value); input.value=''; showKey(); };
document.getElementById('admin-forget').onclick = () => { sessionStorage.removeItem(KEY); \
showKey(); };
async function decide(id, decision){
  await send('POST', '/v1/approvals/'+encodeURIComponent(id), {decision});
  refresh();
}
async function toggle(lane, off){
  await send('POST', `/v1/lanes/${encodeURIComponent(lane)}/${off?'off':'on'}`, {});
  refresh();
}
async function refresh(){
  try{
    const [state, approvals] = await Promise.all([fetch('/v1/lanes').then(r=>r.json()), \
fetch('/v1/approvals').then(r=>r.json())]);
    const paid = state.paid;
    document.getElementById('summary').textContent = `free lane ${state.free_lane?'on':'OFF'} · \
paid today $${paid.spent_today_usd.toFixed(6)} of $${paid.ceiling_usd.toFixed(2)} · \
fallback ${paid.fallback}` + \
(state.state && !state.state.up ? ` · state ${state.state.kind} DOWN: paid closed` : '');
    const box = document.getElementById('approvals'); box.replaceChildren();
    if(!approvals.data.length){ box.appendChild(el('span','none','none')); }
    for(const a of approvals.data){
      const d = el('div'); d.className='approval'; d.dataset.id=a.id;
      d.appendChild(el('span', `${a.id}: client ${a.client} → ${a.candidate} \
(≤ $${a.estimated_cost_usd.toFixed(4)}); \
free exhausted: ${a.exhausted.join(', ')||'—'} `));
      for(const [label, decision] of [['Approve once','once'],\
['Approve 1 h','1h'],['Deny','deny']]){
        const b = el('button', label); b.onclick = () => decide(a.id, decision); d.appendChild(b);
      }
      box.appendChild(d);
    }
    const lanes = document.getElementById('lanes'); lanes.replaceChildren();
    for(const l of state.lanes){
      l.models.forEach((m, i) => {
        const st = el('span', l.off?'off':l.breaker.state, \
(l.off||l.breaker.state!=='closed')?'bad':'ok');
        const mb = el('span', m.breaker.state, m.breaker.state!=='closed'?'bad':'ok');
        let sw = '';
        if(i === 0){ sw = el('button', l.off ? 'Switch on' : 'Switch off'); \
sw.className = 'switch'; sw.dataset.lane = l.name; sw.onclick = () => toggle(l.name, !l.off); }
        const canary = m.quarantined ? el('span', 'quarantined', 'pill quarantined') : '';
        if(m.quarantined) canary.title = m.quarantined;
        const tr = row([l.name, l.kind, sw, st, m.model, m.tier, mb, \
m.free_now?'yes':(m.reason||'no'),
          m.backoff_s?`${m.backoff_s.toFixed(1)} s (${m.backoff_reason})`:'', \
m.requests_remaining, m.used_today, canary]);
        tr.dataset.lane = l.name; lanes.appendChild(tr);
      });
    }
    for(const [name, why] of Object.entries(state.unavailable)) \
lanes.appendChild(row([name,'','','unavailable','','','',why,'','','','']));
    const recent = document.getElementById('recent'); recent.replaceChildren();
    for(const j of state.recent){
      const id = el('code', j.id.slice(0, 12)); id.title = j.id;
      recent.appendChild(row([new Date(j.at*1000).toLocaleTimeString(), id, \
el('span', j.route||'—','pill'), j.lane||'—', j.model||'—', j.client, j.cohort||'—', \
j.outcome, j.attempts, `${Math.round(j.latency_s*1000)} ms`, '$'+j.cost_usd.toFixed(6)]));
    }
  }catch(e){ document.getElementById('summary').textContent = 'sidecar unreachable'; }
}
showKey(); refresh(); setInterval(refresh, 1000);
</script>
</body></html>
"""

'use strict';
// The report's four charts (GET /v1/report), drawn in SVG by the page itself: no library, nothing
// fetched. Every text goes in through textContent. The SVG namespace is read from a parsed <svg>,
// so that the page carries no URL at all.
const SVG_NS = (() => {
  const d = document.createElement('div'); d.innerHTML = '<svg></svg>';
  return d.firstChild.namespaceURI;
})();
const W = 460, H = 240, M = {l: 58, r: 14, t: 16, b: 42};
const ROUTES = ['local', 'byok', 'primary', 'free_retry', 'paid_fallback'];

function svg(tag, attrs, text){
  const e = document.createElementNS(SVG_NS, tag);
  for(const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if(text !== undefined) e.textContent = String(text);
  return e;
}
function titled(node, text){ node.appendChild(svg('title', {}, text)); return node; }
function pct(v){ return v === null || v === undefined ? '—' : Math.round(v * 100) + ' %'; }
function usd(v){ return '$' + (v === 0 ? '0' : v >= 0.1 ? v.toFixed(2) : String(+v.toPrecision(2))); }
function plain(v){ return String(+v.toFixed(3)); }
function ms(v){ return (v < 10 ? v.toFixed(1) : Math.round(v)) + ' ms'; }
// The top of an axis of four round steps (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten)
// at or above `v`.
function niceTop(v){
  if(!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v / 4));
  const step = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].find(m => m * p * 4 >= v * (1 - 1e-9)) * p;
  return +(4 * step).toPrecision(12);
}

// A chart's frame: caption and legend, a y axis from 0 to `top` (five ticks, grid lines, its unit)
// and the x axis' unit. `y(v)` places a value; `slot(i, n)` is the i-th of n columns.
function frame(name, caption, legend, top, tick, yUnit, xUnit){
  const fig = el('figure', undefined, 'chart'); fig.dataset.chart = name;
  const cap = el('figcaption', caption), keys = el('div', undefined, 'legend');
  for(const [cls, text] of legend) keys.appendChild(el('span', text, cls));
  cap.appendChild(keys); fig.appendChild(cap);
  const root = svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': caption});
  const bottom = H - M.b, height = bottom - M.t, width = W - M.l - M.r;
  const y = v => bottom - height * Math.min(Math.max(v / top, 0), 1);
  for(let i = 0; i <= 4; i++){
    const v = top * i / 4;
    root.appendChild(svg('line', {x1: M.l, x2: W - M.r, y1: y(v), y2: y(v),
                                  class: i ? 'grid' : 'base'}));
    root.appendChild(svg('text', {x: M.l - 6, y: y(v) + 4, 'text-anchor': 'end'}, tick(v)));
  }
  root.appendChild(svg('text', {class: 'axis', 'text-anchor': 'middle',
    transform: `translate(13 ${M.t + height / 2}) rotate(-90)`}, yUnit));
  root.appendChild(svg('text', {class: 'axis', 'text-anchor': 'middle', x: M.l + width / 2,
                                y: H - 5}, xUnit));
  fig.appendChild(root);
  const slot = (i, n) => ({x: M.l + i * width / n, w: width / n});
  const label = (x, text) => root.appendChild(
    svg('text', {class: 'label', x, y: bottom + 15, 'text-anchor': 'middle'}, text));
  const note = (text) => root.appendChild(svg('text', {class: 'axis', x: M.l + width / 2,
    y: M.t + height / 2, 'text-anchor': 'middle'}, text));
  return {fig, root, y, bottom, slot, label, note};
}

// The 24 hours ending with this one ({at: epoch s, h: the report's hour or undefined}).
function lastHours(hours){
  const now = Math.floor(Date.now() / 3600000);
  const by = new Map(hours.map(h => [Math.round(h.hour / 3600), h]));
  return Array.from({length: 24}, (_, i) => ({at: (now - 23 + i) * 3600, h: by.get(now - 23 + i)}));
}
// The 7 UTC days ending with today ({day: 'YYYY-MM-DD', d: the report's day or undefined}).
function lastDays(days){
  const today = Math.floor(Date.now() / 86400000), by = new Map(days.map(d => [d.day, d]));
  return Array.from({length: 7}, (_, i) => {
    const day = new Date((today - 6 + i) * 86400000).toISOString().slice(0, 10);
    return {day, d: by.get(day)};
  });
}
function hourName(at){ return new Date(at * 1000).toISOString().slice(11, 16); }  // UTC, as every time

function shareChart(slots){
  const f = frame('share', 'Free vs paid share of the jobs, per hour',
    [['free', 'free or local'], ['paid', 'paid fallback'], ['other', 'other answers'],
     ['failed', 'not answered']], 1, pct, '% of the hour\'s jobs', 'hour (UTC)');
  slots.forEach((s, i) => {
    const {x, w} = f.slot(i, slots.length);
    if(i % 6 === 0) f.label(x + w / 2, hourName(s.at));
    if(!s.h) return;
    const h = s.h, free = Math.round(h.answered * (h.free_share ?? 0));
    const paid = Math.round(h.answered * (h.paid_share ?? 0));
    const g = titled(svg('g', {class: 'bucket'}), `${hourName(s.at)}: ${h.jobs} job(s), ` +
      `${h.answered} answered; free share ${pct(h.free_share)}, paid share ${pct(h.paid_share)}`);
    let below = 0;
    for(const [cls, n] of [['free', free], ['paid', paid], ['other', h.answered - free - paid],
                           ['failed', h.jobs - h.answered]]){
      if(n <= 0) continue;
      const top = f.y((below + n) / h.jobs);
      g.appendChild(svg('rect', {class: `bar ${cls}`, x: x + 1, width: Math.max(w - 2, 1),
                                 y: top, height: f.y(below / h.jobs) - top}));
      below += n;
    }
    f.root.appendChild(g);
  });
  if(!slots.some(s => s.h)) f.note('no jobs in the last 24 hours');
  return f.fig;
}

function spendChart(slots, ceiling){
  const most = Math.max(ceiling, ...slots.map(s => s.d ? s.d.paid_cost_usd : 0));
  const f = frame('spend', 'Paid spend per day vs the ceiling', [['paid', 'paid spend']],
                  niceTop(most * 1.05), usd, 'US dollars per day', 'day (UTC)');
  slots.forEach((s, i) => {
    const {x, w} = f.slot(i, slots.length), spent = s.d ? s.d.paid_cost_usd : 0;
    f.label(x + w / 2, s.day.slice(5));
    f.root.appendChild(titled(svg('rect', {class: 'bar spend', x: x + w * 0.2, width: w * 0.6,
      y: f.y(spent), height: f.bottom - f.y(spent)}),
      `${s.day}: $${spent.toFixed(6)} of the $${ceiling.toFixed(2)} ceiling`));
    if(spent > 0) f.root.appendChild(svg('text', {class: 'value', x: x + w / 2,
      y: f.y(spent) - 4, 'text-anchor': 'middle'}, usd(spent)));
  });
  f.root.appendChild(svg('line', {class: 'ceiling', x1: M.l, x2: W - M.r,
                                  y1: f.y(ceiling), y2: f.y(ceiling)}));
  f.root.appendChild(svg('text', {class: 'ceiling', x: W - M.r, y: f.y(ceiling) - 4,
                                  'text-anchor': 'end'}, `ceiling $${ceiling.toFixed(2)}`));
  return f.fig;
}

function latencyChart(byRoute){
  const routes = [...ROUTES.filter(r => r in byRoute),
                  ...Object.keys(byRoute).filter(r => !ROUTES.includes(r)).sort()];
  const mean = routes.map(r => byRoute[r] * 1000);
  const f = frame('latency', 'Mean attempt latency per route state', [], niceTop(Math.max(...mean, 1)),
                  plain, 'milliseconds', 'route state');
  routes.forEach((r, i) => {
    const {x, w} = f.slot(i, routes.length);
    f.label(x + w / 2, r);
    f.root.appendChild(titled(svg('rect', {class: 'bar latency', x: x + w * 0.2, width: w * 0.6,
      y: f.y(mean[i]), height: f.bottom - f.y(mean[i])}), `${r}: ${ms(mean[i])} on average`));
    f.root.appendChild(svg('text', {class: 'value', x: x + w / 2, y: f.y(mean[i]) - 4,
                                    'text-anchor': 'middle'}, ms(mean[i])));
  });
  if(!routes.length) f.note('no attempts yet');
  return f.fig;
}

function attemptsChart(slots){
  const points = slots.map((s, i) => ({s, i})).filter(p => p.s.h && p.s.h.answered);
  const most = Math.max(2, ...points.map(p => p.s.h.attempts_per_answer));
  const f = frame('attempts', 'Attempts per answer, per hour', [], niceTop(most),
                  plain, 'attempts per answer', 'hour (UTC)');
  const at = p => {
    const {x, w} = f.slot(p.i, slots.length);
    return [x + w / 2, f.y(p.s.h.attempts_per_answer)];
  };
  slots.forEach((s, i) => {
    const {x, w} = f.slot(i, slots.length);
    if(i % 6 === 0) f.label(x + w / 2, hourName(s.at));
  });
  if(points.length > 1) f.root.appendChild(svg('polyline', {class: 'line',
    points: points.map(p => at(p).join(',')).join(' ')}));
  for(const p of points){
    const [cx, cy] = at(p), h = p.s.h;
    f.root.appendChild(titled(svg('circle', {class: 'point', cx, cy, r: 3.5}),
      `${hourName(p.s.at)}: ${h.attempts_per_answer.toFixed(2)} attempts per answer ` +
      `(${h.answered} answer(s))`));
  }
  if(!points.length) f.note('no answers in the last 24 hours');
  return f.fig;
}

function showReport(view){
  const box = document.getElementById('charts'); box.replaceChildren();
  if(!view.ok){ box.appendChild(el('span', view.why, 'bad')); return; }
  const report = view.data;
  if(!report.total.jobs){ box.appendChild(el('span', 'no jobs yet', 'none')); return; }
  const hours = lastHours(report.hours), days = report.days;
  box.append(shareChart(hours), spendChart(lastDays(days), days[days.length - 1].ceiling_usd),
             latencyChart(report.total.latency_s_by_route), attemptsChart(hours));
}

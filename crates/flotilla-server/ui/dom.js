// Small DOM and formatting helpers shared by the views. No framework: views rebuild their
// part of the page from the API's JSON.

/**
 * h('div', {class: 'x', onclick: f}, child, ...) — children may be strings, nodes, arrays, null;
 * null attributes and dataset entries are left out.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'dataset') {
      for (const [k, v] of Object.entries(value)) if (v !== null && v !== undefined) el.dataset[k] = v;
    } else if (key === 'style' && typeof value === 'object') {
      for (const [p, v] of Object.entries(value)) el.style.setProperty(p, v);
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** The states of SEMANTICS.md, each with a glyph so that colour is never the only cue. */
export const STATES = {
  NotStarted: { glyph: '·', label: 'Not started' },
  Pending: { glyph: '‖', label: 'Pending' },
  Running: { glyph: '▶', label: 'Running' },
  Stopping: { glyph: '■', label: 'Stopping' },
  Stopped: { glyph: '■', label: 'Stopped' },
  Skipped: { glyph: '»', label: 'Skipped' },
  Failed: { glyph: '✕', label: 'Failed' },
  Completed: { glyph: '✓', label: 'Completed' },
};
export const STATE_ORDER = ['Running', 'Pending', 'Failed', 'Stopping', 'Stopped', 'NotStarted', 'Skipped', 'Completed'];
export const TERMINAL = new Set(['Completed', 'Failed', 'Skipped']);

export function badge(state) {
  const known = STATES[state] || { glyph: '?', label: state || 'Unknown' };
  return h('span', { class: `badge s-${state}` }, h('span', { 'aria-hidden': 'true' }, known.glyph), ' ', known.label);
}

/** Counts by state, most interesting first: [['Running', 3], ...]. */
export function countStates(members) {
  const counts = new Map();
  for (const m of members) {
    const s = m.status?.state || 'NotStarted';
    counts.set(s, (counts.get(s) || 0) + 1);
  }
  return STATE_ORDER.filter((s) => counts.has(s)).map((s) => [s, counts.get(s)])
    .concat([...counts].filter(([s]) => !STATE_ORDER.includes(s)));
}

/** A stacked bar of counts by state, with the counts as text beside it. */
export function stateBar(counts, total) {
  const bar = h('div', { class: 'statebar', 'aria-hidden': 'true' });
  for (const [state, n] of counts) {
    bar.append(h('span', { class: `s-${state}`, style: { width: `${(100 * n) / Math.max(total, 1)}%` } }));
  }
  const text = counts.map(([s, n]) => `${n} ${(STATES[s]?.label || s).toLowerCase()}`).join(', ');
  return h('div', { class: 'statebar-wrap', title: text }, bar, h('span', { class: 'counts' }, text || 'no members'));
}

export function parseTime(text) {
  if (!text) return null;
  const t = Date.parse(text);
  return Number.isNaN(t) ? null : t;
}

export function fmtTime(text) {
  const t = parseTime(text);
  if (t === null) return '—';
  const d = new Date(t);
  const sameDay = new Date().toDateString() === d.toDateString();
  return sameDay ? d.toLocaleTimeString() : d.toLocaleString();
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`;
  const hours = Math.floor(s / 3600);
  if (hours < 48) return `${hours}h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function time(text) {
  return text ? h('time', { datetime: text, title: text }, fmtTime(text)) : '—';
}

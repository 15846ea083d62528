// The fleet: every member with its group, labels, region, Kubernetes version, node images,
// maintenance windows (the next opening) and the run it is in; filterable, refreshed slowly.

import { listAll, enc } from './api.js';
import { h, clear, badge, fmtTime, fmtDuration, parseTime, TERMINAL } from './dom.js';

const REFRESH_MS = 10000;

function windowCell(status) {
  const openings = status?.maintenanceOpenings || {};
  const specs = status?.cluster?.maintenance || {};
  const lines = [];
  for (const [field, label] of [['kubernetes', 'Kubernetes'], ['nodeOS', 'Node OS']]) {
    if (!specs[field]) continue;
    const opening = openings[field];
    const from = parseTime(opening?.from);
    const until = parseTime(opening?.until);
    let text;
    if (!opening) text = 'never opens again';
    else if (from <= Date.now()) text = `open, closes in ${fmtDuration(until - Date.now())}`;
    else text = `opens ${fmtTime(opening.from)} (in ${fmtDuration(from - Date.now())})`;
    lines.push(h('div', { title: JSON.stringify(specs[field]) }, `${label}: ${text}`));
  }
  return lines.length ? lines : h('span', { class: 'muted' }, 'any time');
}

/** member name → {run, state} for runs that have not ended. */
function activeRuns(runs) {
  const byMember = new Map();
  for (const run of runs) {
    const status = run.properties?.status;
    const runState = status?.status?.state || 'NotStarted';
    if (TERMINAL.has(runState)) continue;
    for (const stage of status?.stages || []) {
      for (const group of stage.groups || []) {
        for (const m of group.members || []) byMember.set(m.name, { run: run.name, state: m.status?.state });
      }
    }
  }
  return byMember;
}

export async function render(ctx) {
  const { main, fleet, signal } = ctx;
  const body = h('tbody');
  const summary = h('p', { class: 'muted', id: 'fleet-summary' });
  const filter = h('input', { type: 'search', id: 'member-filter', placeholder: 'name, group, label, region…', 'aria-label': 'Filter members' });
  main.append(
    h('div', { class: 'title-row' }, h('h1', {}, `Fleet ${fleet}`), filter),
    summary,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'members' },
      h('caption', { class: 'sr-only' }, `Members of fleet ${fleet}`),
      h('thead', {}, h('tr', {}, ['Member', 'Group', 'Labels', 'Region', 'Kubernetes', 'Node images', 'Maintenance window', 'Run'].map((c) => h('th', { scope: 'col' }, c)))),
      body)));

  let rows = [];
  function applyFilter() {
    const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const { tr, text } of rows) {
      const visible = words.every((w) => text.includes(w));
      tr.hidden = !visible;
      if (visible) shown += 1;
    }
    summary.dataset.shown = String(shown);
  }
  filter.addEventListener('input', applyFilter);

  async function refresh() {
    const [members, runs] = await Promise.all([
      listAll(`/v1/fleets/${enc(fleet)}/members`, { signal }),
      listAll(`/v1/fleets/${enc(fleet)}/updateRuns`, { signal }),
    ]);
    const inRun = activeRuns(runs);
    const regions = new Set();
    const versions = new Map();
    clear(body);
    rows = [];
    for (const member of members) {
      const p = member.properties || {};
      const cluster = p.status?.cluster || {};
      if (cluster.region) regions.add(cluster.region);
      if (cluster.kubernetesVersion) versions.set(cluster.kubernetesVersion, (versions.get(cluster.kubernetesVersion) || 0) + 1);
      const labels = Object.entries(p.labels || {});
      const run = inRun.get(member.name);
      const images = (cluster.nodePools || []).map((pool) => `${pool.name}: ${pool.nodeImageVersion}`);
      const tr = h('tr', { dataset: { member: member.name } },
        h('th', { scope: 'row' }, member.name),
        h('td', {}, p.group || h('span', { class: 'muted' }, '—')),
        h('td', {}, labels.map(([k, v]) => h('span', { class: 'chip' }, `${k}=${v}`))),
        h('td', {}, cluster.region || '—'),
        h('td', {}, cluster.kubernetesVersion || '—'),
        h('td', { class: 'small' }, images.length ? images.map((i) => h('div', {}, i)) : '—'),
        h('td', { class: 'small' }, windowCell(p.status)),
        h('td', {}, run ? [h('a', { href: `#/fleets/${enc(fleet)}/runs/${enc(run.run)}` }, run.run), ' ', badge(run.state)] : h('span', { class: 'muted' }, '—')));
      body.append(tr);
      rows.push({ tr, text: [member.name, p.group, cluster.region, cluster.kubernetesVersion, ...labels.map(([k, v]) => `${k}=${v}`), run?.run].join(' ').toLowerCase() });
    }
    const versionText = [...versions].sort().map(([v, n]) => `${n} on ${v}`).join(', ');
    summary.textContent = `${members.length} members in ${regions.size} regions; ${versionText || 'not observed yet'}; ${inRun.size} in an active run.`;
    applyFilter();
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}

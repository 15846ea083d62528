// The fleets, each with its driver, member count and active runs; and one fleet: every member
// with its group, labels, region, Kubernetes version, node images, maintenance windows (the
// next opening) and the run it is in; filterable, refreshed slowly.

import { listAll, countAll, enc } from './api.js';
import { h, clear, badge, fmtTime, fmtDuration, parseTime, TERMINAL } from './dom.js';
import { progress } from './runs.js';

const REFRESH_MS = 10000;
/** The fleets page asks for the fleets' runs this often; members are counted once per visit. */
const FLEETS_REFRESH_MS = 15000;
/** Fleets read at once on the fleets page: a hundred fleets must not be a hundred requests at once. */
const FLEETS_AT_ONCE = 4;
/** Run states that mean a run is under way (a Pending run waits at a gate). */
const ACTIVE = new Set(['Running', 'Pending', 'Stopping']);

/** Calls fn(item) for every item, at most `limit` at a time. */
async function eachLimited(items, limit, fn) {
  const queue = [...items];
  const worker = async () => {
    while (queue.length) await fn(queue.shift());
  };
  await Promise.all(Array.from({ length: Math.min(limit, queue.length) }, worker));
}

function activeRunLinks(fleet, runs) {
  const active = runs.filter((r) => ACTIVE.has(r.properties?.status?.status?.state));
  if (!active.length) return h('span', { class: 'muted' }, 'none');
  return h('ul', { class: 'plain runs-cell' }, active.map((run) => {
    const status = run.properties.status;
    const { done, total } = progress(status);
    return h('li', { dataset: { run: run.name } },
      h('a', { href: `#/fleets/${enc(fleet)}/runs/${enc(run.name)}` }, run.name), ' ',
      badge(status.status.state),
      h('span', { class: 'counts' }, ` ${done}/${total} done`));
  }));
}

/**
 * The fleets page: a row per fleet with its driver, how many members it has and its runs under
 * way. The table is drawn at once; each fleet's cells fill in as their answers come. There is
 * no count endpoint: members are counted by paging their list a thousand at a time, once per
 * visit; runs are read again every few seconds.
 */
export async function renderList(ctx, fleets) {
  const { main, signal } = ctx;
  main.append(h('h1', {}, 'Fleets'));
  if (!fleets.length) {
    main.append(h('p', {}, 'No fleets yet.'));
    return () => {};
  }
  const cells = new Map();
  const body = h('tbody', {}, fleets.map((fleet) => {
    const members = h('td', { class: 'num', dataset: { members: '' } }, h('span', { class: 'muted' }, '…'));
    const runs = h('td', { dataset: { runs: '' } }, h('span', { class: 'muted' }, '…'));
    cells.set(fleet.name, { members, runs });
    return h('tr', { dataset: { fleet: fleet.name } },
      h('th', { scope: 'row' }, h('a', { href: `#/fleets/${enc(fleet.name)}` }, fleet.name)),
      h('td', {}, fleet.properties?.driver?.type || '—'),
      members,
      runs);
  }));
  main.append(h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'fleets' },
    h('caption', { class: 'sr-only' }, 'Fleets'),
    h('thead', {}, h('tr', {},
      h('th', { scope: 'col' }, 'Fleet'),
      h('th', { scope: 'col' }, 'Driver'),
      h('th', { scope: 'col', class: 'num' }, 'Members'),
      h('th', { scope: 'col' }, 'Active runs'))),
    body)));

  const failed = (cell, e) => {
    if (e.name !== 'AbortError') clear(cell).append(h('span', { class: 'error', title: e.message }, 'could not read'));
  };
  let reading = false;
  const readRuns = async () => {
    if (reading) return; // a slow answer is not asked for again before it comes
    reading = true;
    await eachLimited(fleets, FLEETS_AT_ONCE, async (fleet) => {
      const { runs } = cells.get(fleet.name);
      try {
        clear(runs).append(activeRunLinks(fleet.name, await listAll(`/v1/fleets/${enc(fleet.name)}/updateRuns`, { signal })));
      } catch (e) {
        failed(runs, e);
      }
    });
    reading = false;
  };
  const countMembers = () => eachLimited(fleets, FLEETS_AT_ONCE, async (fleet) => {
    const { members } = cells.get(fleet.name);
    try {
      const n = await countAll(`/v1/fleets/${enc(fleet.name)}/members`, { signal });
      clear(members).append(n.toLocaleString('en-US'));
      members.dataset.members = String(n);
    } catch (e) {
      failed(members, e);
    }
  });
  readRuns();
  countMembers();
  const timer = setInterval(() => { readRuns(); }, FLEETS_REFRESH_MS);
  return () => clearInterval(timer);
}

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

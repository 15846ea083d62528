// The fleets, each with its driver, member count and active runs; and one fleet: its freezes in
// force and coming, its disruption budgets with each partition's members in flight against its
// limit (SEMANTICS §12), and every member with its group, labels, region, Kubernetes version,
// node images, maintenance windows (the next opening) and the run it is in; filterable,
// refreshed slowly.

import { api, listAll, countAll, enc, ApiError } from './api.js';
import { h, clear, badge, fmtTime, fmtDuration, parseTime, time, TERMINAL } from './dom.js';
import { progress } from './runs.js';

const REFRESH_MS = 10000;
/** The fleets page asks for the fleets' runs this often; members are counted once per visit. */
const FLEETS_REFRESH_MS = 15000;
/** Fleets read at once on the fleets page: a hundred fleets must not be a hundred requests at once. */
const FLEETS_AT_ONCE = 4;
/** The page of the lists of freezes and budgets: the most they serve at once (and a fleet holds). */
const RULES_PAGE = 100;
/** Budgets read at once on the fleet page (one request each, for its partitions). */
const BUDGETS_AT_ONCE = 4;
/** What a freeze's scope holds, in words. */
const FREEZE_SCOPES = {
  AllUpgrades: 'all upgrades',
  MinorUpgrades: 'minor upgrades',
  MinorAndNodeUpgrades: 'minor and node upgrades',
};
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

/** Says in a cell or section that its read failed (nothing, when the page was left). */
function couldNotRead(el, e) {
  if (e.name !== 'AbortError') clear(el).append(h('span', { class: 'error', title: e.message }, 'could not read'));
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

  let reading = false;
  const readRuns = async () => {
    if (reading) return; // a slow answer is not asked for again before it comes
    reading = true;
    await eachLimited(fleets, FLEETS_AT_ONCE, async (fleet) => {
      const { runs } = cells.get(fleet.name);
      try {
        clear(runs).append(activeRunLinks(fleet.name, await listAll(`/v1/fleets/${enc(fleet.name)}/updateRuns`, { signal })));
      } catch (e) {
        couldNotRead(runs, e);
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
      couldNotRead(members, e);
    }
  });
  readRuns();
  countMembers();
  const timer = setInterval(() => { readRuns(); }, FLEETS_REFRESH_MS);
  return () => clearInterval(timer);
}

/** A selector (SEMANTICS §2) in words. */
function selectorText(selector) {
  return selector?.byLabel ? `members with ${selector.byLabel}` : 'every member';
}

/** A freeze: in force until its end, or coming, from its next start to that span's end. */
function freezeItem(freeze, now) {
  const p = freeze.properties || {};
  const status = p.status || {};
  const active = !!status.active;
  const scope = FREEZE_SCOPES[p.scope || 'AllUpgrades'] || p.scope;
  let when;
  if (active) {
    const end = parseTime(status.nextEnd);
    when = ['until ', time(status.nextEnd), end !== null ? ` (${fmtDuration(end - now)} left)` : null];
  } else {
    const start = parseTime(status.nextStart);
    when = [time(status.nextStart), ' → ', time(status.nextEnd), start !== null ? ` (in ${fmtDuration(start - now)})` : null];
  }
  return h('li', { class: `freeze${active ? ' active' : ''}`, dataset: { freeze: freeze.name, state: active ? 'active' : 'coming' } },
    h('div', {},
      h('span', { class: `tag${active ? ' frozen' : ''}` }, active ? 'In force' : 'Coming'), ' ',
      h('strong', { class: 'freeze-name' }, freeze.name),
      p.reason ? h('span', { class: 'freeze-reason' }, ` — ${p.reason}`) : null),
    h('div', { class: 'small freeze-when' }, when),
    h('div', { class: 'small muted' },
      `holds ${scope} of ${selectorText(p.selector)}`,
      p.recurrence ? h('span', { title: JSON.stringify(p.recurrence) }, ' · recurring') : null));
}

/** The freezes in force (ending first first), then those coming (starting first first). */
function freezeList(freezes) {
  const now = Date.now();
  const at = (f, field) => parseTime(f.properties?.status?.[field]) ?? Infinity;
  const active = freezes.filter((f) => f.properties?.status?.active).sort((a, b) => at(a, 'nextEnd') - at(b, 'nextEnd'));
  const coming = freezes.filter((f) => !f.properties?.status?.active && f.properties?.status?.nextStart).sort((a, b) => at(a, 'nextStart') - at(b, 'nextStart'));
  const ended = freezes.length - active.length - coming.length;
  const endedNote = ended ? h('p', { class: 'muted small', id: 'freezes-ended' }, `${ended} ${ended === 1 ? 'freeze has' : 'freezes have'} ended.`) : null;
  if (!active.length && !coming.length) return [h('p', { class: 'muted', id: 'no-freezes' }, 'No freeze in force or coming.'), endedNote];
  return [h('ul', { class: 'plain rule-list' }, active.concat(coming).map((f) => freezeItem(f, now))), endedNote];
}

/** What a budget splits its members by, in words. */
function perValueText(perValueOf) {
  return perValueOf?.startsWith('label:') ? `label ${perValueOf.slice('label:'.length)}` : perValueOf;
}

/**
 * One partition of a budget: its value, a bar filling up with its members in flight against
 * its resolved maxUnavailable, and the counts. The replica answering counts those in flight
 * only when it drives the fleet; otherwise they are unknown here.
 */
function partitionItem(part, perValueOf) {
  const label = !perValueOf ? 'all' : part.value || `(no ${perValueText(perValueOf)})`;
  const max = Number(part.maxUnavailable) || 0;
  const known = typeof part.disrupted === 'number';
  const n = known ? part.disrupted : 0;
  const fill = known ? (n > max ? ' over' : n >= max ? ' full' : '') : ' unknown';
  const members = `${part.members} ${part.members === 1 ? 'member' : 'members'}`;
  const counts = `${known ? n : '?'} / ${max} in flight, ${members}`;
  return h('li', {
    class: `partition${fill}`,
    dataset: { value: part.value ?? '', disrupted: known ? String(n) : null, max: String(max), members: String(part.members) },
    title: known ? null : 'members in flight are counted by the replica that drives this fleet',
  },
  h('span', { class: 'partition-value' }, label),
  h('div', { class: 'budgetbar', 'aria-hidden': 'true' }, h('span', { style: { width: `${Math.min(100, (100 * n) / Math.max(max, 1))}%` } })),
  h('span', { class: 'counts' }, counts));
}

/** A budget: its limit, what it splits by and covers, and its partitions (or why not shown). */
function budgetItem(budget, detail) {
  const p = budget.properties || {};
  const per = p.perValueOf ? ` per ${perValueText(p.perValueOf)}` : '';
  let parts;
  if (detail instanceof Error) {
    parts = h('p', { class: 'error small', title: detail.message }, 'could not read its partitions');
  } else {
    const partitions = detail?.properties?.status?.partitions || [];
    parts = partitions.length
      ? h('ul', { class: 'partitions', 'aria-label': `Partitions of ${budget.name}` }, partitions.map((part) => partitionItem(part, p.perValueOf)))
      : h('p', { class: 'muted small' }, 'It covers no members now.');
  }
  return h('li', { class: 'budget', dataset: { budget: budget.name } },
    h('div', {},
      h('strong', { class: 'budget-name' }, budget.name),
      h('span', { class: 'muted small' }, ` at most ${p.maxUnavailable} in flight${per}, of ${selectorText(p.selector)}`)),
    parts);
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
  const freezesBody = h('div', {}, h('span', { class: 'muted' }, '…'));
  const budgetsBody = h('div', {}, h('span', { class: 'muted' }, '…'));
  const filter = h('input', { type: 'search', id: 'member-filter', placeholder: 'name, group, label, region…', 'aria-label': 'Filter members' });
  main.append(
    h('div', { class: 'title-row' }, h('h1', {}, `Fleet ${fleet}`), filter),
    summary,
    h('div', { class: 'rules' },
      h('section', { id: 'freezes', class: 'rules-panel', 'aria-labelledby': 'freezes-title' }, h('h2', { id: 'freezes-title' }, 'Freezes'), freezesBody),
      h('section', { id: 'budgets', class: 'rules-panel', 'aria-labelledby': 'budgets-title' }, h('h2', { id: 'budgets-title' }, 'Disruption budgets'), budgetsBody)),
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

  // The fleet's rules, read with its members: each section says when its own read failed, and
  // neither keeps the members from being drawn.
  async function readFreezes() {
    try {
      const freezes = await listAll(`/v1/fleets/${enc(fleet)}/freezes`, { signal, top: RULES_PAGE });
      clear(freezesBody).append(...freezeList(freezes).filter(Boolean));
    } catch (e) {
      couldNotRead(freezesBody, e);
    }
  }
  async function readBudgets() {
    try {
      const budgets = await listAll(`/v1/fleets/${enc(fleet)}/disruptionBudgets`, { signal, top: RULES_PAGE });
      // The list has each budget's properties; its partitions come with the budget read alone.
      const details = new Map();
      await eachLimited(budgets, BUDGETS_AT_ONCE, async (b) => {
        try {
          details.set(b.name, await api(`/v1/fleets/${enc(fleet)}/disruptionBudgets/${enc(b.name)}`, { signal }));
        } catch (e) {
          if (e.name === 'AbortError') throw e;
          details.set(b.name, e);
        }
      });
      // A budget deleted since the list was read is left out.
      const shown = budgets.filter((b) => !(details.get(b.name) instanceof ApiError && details.get(b.name).status === 404));
      clear(budgetsBody).append(shown.length
        ? h('ul', { class: 'plain rule-list' }, shown.map((b) => budgetItem(b, details.get(b.name))))
        : h('p', { class: 'muted', id: 'no-budgets' }, 'No disruption budgets.'));
    } catch (e) {
      couldNotRead(budgetsBody, e);
    }
  }

  async function refresh() {
    const rules = Promise.all([readFreezes(), readBudgets()]);
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
    await rules;
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}

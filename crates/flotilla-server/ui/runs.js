// The runs of a fleet: state, target, progress, failures, start and finish; refreshed every
// few seconds.

import { listAll, enc } from './api.js';
import { h, clear, badge, time, TERMINAL } from './dom.js';

const REFRESH_MS = 3000;

/** What a run upgrades to, in a few words. */
export function targetText(run) {
  const update = run.properties?.managedClusterUpdate || {};
  const upgrade = update.upgrade || {};
  // A rollback run (SEMANTICS §15): each member back where the original run found it.
  if (run.properties?.rollbackOf) return `back to each member's state before ${run.properties.rollbackOf}`;
  const parts = [upgrade.type || 'Full'];
  if (upgrade.kubernetesVersion) parts.push(`Kubernetes ${upgrade.kubernetesVersion}`);
  if (update.nodeImageSelection?.type) parts.push(`node image ${update.nodeImageSelection.type}`);
  return parts.join(' · ');
}

/** Members done (in a final state) and in total, over the whole status tree. */
export function progress(status) {
  let done = 0;
  let total = 0;
  for (const stage of status?.stages || []) {
    for (const group of stage.groups || []) {
      for (const m of group.members || []) {
        total += 1;
        if (TERMINAL.has(m.status?.state)) done += 1;
      }
    }
  }
  return { done, total };
}

export function progressBar({ done, total }, label) {
  return h('span', { class: 'progress' },
    h('progress', { max: Math.max(total, 1), value: done, 'aria-label': label }),
    h('span', { class: 'counts' }, `${done} / ${total}`));
}

export async function render(ctx) {
  const { main, fleet, signal } = ctx;
  const body = h('tbody');
  const updated = h('span', { class: 'muted' });
  main.append(
    h('div', { class: 'title-row' }, h('h1', {}, 'Update runs'), updated),
    h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'runs' },
      h('caption', { class: 'sr-only' }, `Update runs of fleet ${fleet}`),
      h('thead', {}, h('tr', {}, ['Run', 'State', 'Target', 'Progress', 'Failures', 'Started', 'Finished'].map((c) => h('th', { scope: 'col' }, c)))),
      body)));

  async function refresh() {
    const runs = await listAll(`/v1/fleets/${enc(fleet)}/updateRuns`, { signal });
    runs.sort((a, b) => (b.properties?.status?.status?.startTime || '9').localeCompare(a.properties?.status?.status?.startTime || '9') || a.name.localeCompare(b.name));
    clear(body);
    if (!runs.length) body.append(h('tr', {}, h('td', { colspan: 7 }, 'No update runs yet.')));
    for (const run of runs) {
      const status = run.properties?.status || {};
      const state = status.status?.state || 'NotStarted';
      body.append(h('tr', { dataset: { run: run.name } },
        h('th', { scope: 'row' }, h('a', { href: `#/fleets/${enc(fleet)}/runs/${enc(run.name)}` }, run.name)),
        h('td', {}, badge(state)),
        h('td', {}, targetText(run)),
        h('td', {}, progressBar(progress(status), `${run.name} progress`)),
        h('td', { class: status.failureCount ? 'bad num' : 'num' }, String(status.failureCount ?? 0)),
        h('td', {}, time(status.status?.startTime)),
        h('td', {}, time(status.status?.completedTime))));
    }
    updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  return () => clearInterval(timer);
}

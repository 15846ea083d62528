// Release trains (SEMANTICS §14): every chain of auto-upgrade profiles linked by `upstream`
// across the server's fleets, from its head (a profile others follow that follows none) down,
// each fleet of the train a card in order: its profile and channel, the Kubernetes versions its
// members are on, what its upstream validated and whether it is soaking (a countdown to the
// soak's end, ticking without a re-read), and its last trigger with the run it made. Also the
// provenance a run's page shows (`trainFacts`): where a promoted run's target comes from, and
// whether a Completed run validates its target for the profiles downstream.

import { listAll, enc } from './api.js';
import { h, clear, badge, time, fmtDuration, parseTime } from './dom.js';

/** The trains are read again this often; the countdowns tick every second in between. */
const REFRESH_MS = 15000;
const TICK_MS = 1000;
/** Fleets read at once: a hundred fleets must not be a hundred requests at once. */
const FLEETS_AT_ONCE = 4;

/** Calls fn(item) for every item, at most `limit` at a time. */
async function eachLimited(items, limit, fn) {
  const queue = [...items];
  const worker = async () => {
    while (queue.length) await fn(queue.shift());
  };
  await Promise.all(Array.from({ length: Math.min(limit, queue.length) }, worker));
}

/**
 * A run's id (`/v1/fleets/F/updateRuns/R`, as `validatedBy` and `promotedFrom.runId` name it) as
 * {fleet, run}; null for anything else.
 */
export function parseRunId(id) {
  const match = /^\/v1\/fleets\/([^/]+)\/updateRuns\/([^/]+)$/.exec(id || '');
  if (!match) return null;
  try {
    return { fleet: decodeURIComponent(match[1]), run: decodeURIComponent(match[2]) };
  } catch {
    return null;
  }
}

/** A profile's id (`/v1/fleets/F/autoUpgradeProfiles/P`) as {fleet, name}; null otherwise. */
function parseProfileId(id) {
  const match = /^\/v1\/fleets\/([^/]+)\/autoUpgradeProfiles\/([^/]+)$/.exec(id || '');
  return match ? { fleet: match[1], name: match[2] } : null;
}

/** A link to a run named by its id: `fleet / run`, or the id itself when it is not a run's. */
function runIdLink(id, here) {
  const parsed = parseRunId(id);
  if (!parsed) return h('code', {}, id || '—');
  const text = parsed.fleet === here ? parsed.run : `${parsed.fleet} / ${parsed.run}`;
  return h('a', { href: `#/fleets/${enc(parsed.fleet)}/runs/${enc(parsed.run)}`, class: 'run-link' }, text);
}

/**
 * The members' Kubernetes versions in words, most common first: `3 members: 1.31.4 ×2,
 * 1.30.5 ×1` (members whose cluster was not observed yet count as `not observed`).
 */
export function versionSummary(members) {
  if (!members.length) return 'no members';
  const counts = new Map();
  for (const m of members) {
    const v = m.properties?.status?.cluster?.kubernetesVersion || 'not observed';
    counts.set(v, (counts.get(v) || 0) + 1);
  }
  const ordered = [...counts].sort((a, b) => b[1] - a[1] || b[0].localeCompare(a[0], 'en', { numeric: true }));
  const noun = members.length === 1 ? 'member' : 'members';
  return `${members.length} ${noun}: ${ordered.map(([v, n]) => `${v} ×${n}`).join(', ')}`;
}

/**
 * The trains among profiles: each a head (a profile that follows none here, and that others
 * follow) and its followers in order, nearest first (breadth first, so a profile followed by
 * two comes before both). `profiles` are {id, fleet, profile}; a profile whose upstream is not
 * among them heads its own train (the server refuses such an upstream, but a page read across
 * several requests may see a profile before its upstream).
 */
export function trainsOf(profiles) {
  const byId = new Map(profiles.map((p) => [p.id, p]));
  const followers = new Map();
  for (const p of profiles) {
    const up = p.profile.properties?.upstream?.profileId;
    if (!up) continue;
    if (!followers.has(up)) followers.set(up, []);
    followers.get(up).push(p);
  }
  for (const list of followers.values()) list.sort((a, b) => a.id.localeCompare(b.id));
  const heads = profiles.filter((p) => {
    const up = p.profile.properties?.upstream?.profileId;
    return (!up || !byId.has(up)) && (followers.has(p.id) || up);
  }).sort((a, b) => a.id.localeCompare(b.id));
  const trains = [];
  for (const head of heads) {
    const cars = [];
    const seen = new Set();
    let level = [{ car: head, depth: 0 }];
    while (level.length) {
      const next = [];
      for (const { car, depth } of level) {
        if (seen.has(car.id)) continue; // cycles are refused by the server; never loop here
        seen.add(car.id);
        cars.push({ ...car, depth });
        for (const f of followers.get(car.id) || []) next.push({ car: f, depth: depth + 1 });
      }
      level = next;
    }
    trains.push(cars);
  }
  return trains;
}

/** A channel in words, with the minor a TargetKubernetesVersion profile stays on. */
function channelText(p) {
  const channel = p.channel || '—';
  return p.targetKubernetesVersion ? `${channel} ${p.targetKubernetesVersion}` : channel;
}

/** The soak's end: "moves at TIME (in 1h 20m)" while it runs, "moved at TIME" once past. */
function soakLine(ends, now) {
  const at = parseTime(ends);
  if (at === null) return h('span', { class: 'muted' }, 'soak end unknown');
  const past = at <= now;
  return h('span', { class: 'soak', dataset: { ends, state: past ? 'ended' : 'soaking' } },
    past ? 'moved at ' : 'moves at ', time(ends),
    past ? null : [' (', h('span', { class: 'countdown', role: 'timer' }, `in ${fmtDuration(at - now)}`), ')']);
}

/** Redraws the countdowns in place; answers whether a soak ended since the last tick. */
function tick(root, now) {
  let ended = false;
  for (const el of root.querySelectorAll('.soak[data-state="soaking"]')) {
    const at = parseTime(el.dataset.ends);
    if (at === null) continue;
    if (at <= now) {
      el.replaceWith(soakLine(el.dataset.ends, now));
      ended = true;
    } else {
      const countdown = el.querySelector('.countdown');
      if (countdown) countdown.textContent = `in ${fmtDuration(at - now)}`;
    }
  }
  return ended;
}

/** The last trigger of a profile and the newest run it made. */
function lastTrigger(status, run, fleet) {
  if (!status.lastTriggeredAt && !run) return h('p', { class: 'muted last-trigger' }, 'Not triggered yet.');
  const failed = status.lastTriggerStatus === 'Failed';
  const versions = status.lastTriggerUpgradeVersions || [];
  const runState = run?.properties?.status?.status?.state || 'NotStarted';
  return h('dl', { class: 'car-facts last-trigger' },
    status.lastTriggeredAt
      ? h('div', {}, h('dt', {}, 'Last trigger'), h('dd', {},
        time(status.lastTriggeredAt), ' ',
        h('span', { class: failed ? 'bad' : '' }, failed ? 'failed' : (status.lastTriggerStatus || '').toLowerCase()),
        versions.length ? `: ${versions.join(', ')}` : null))
      : null,
    failed && status.lastTriggerError?.message
      ? h('div', {}, h('dt', {}, 'Error'), h('dd', { class: 'bad' }, status.lastTriggerError.message))
      : null,
    run
      ? h('div', { class: 'last-run', dataset: { run: run.name } }, h('dt', {}, 'Run'), h('dd', {},
        h('a', { href: `#/fleets/${enc(fleet)}/runs/${enc(run.name)}` }, run.name), ' ', badge(runState)))
      : null);
}

/** What a downstream profile's upstream validated, and its soak. */
function upstreamBlock(car, now) {
  const p = car.profile.properties || {};
  const up = p.upstream;
  const standing = p.autoUpgradeProfileStatus?.upstream;
  const upId = parseProfileId(up.profileId);
  const follows = h('p', { class: 'follows' }, 'Follows ',
    upId ? h('strong', {}, `${upId.fleet} / ${upId.name}`) : h('code', {}, up.profileId),
    ` after a soak of ${fmtDuration((up.soakSeconds ?? 604800) * 1000)}.`);
  if (!standing) {
    return [follows, h('p', { class: 'muted validated', dataset: { validated: 'none' } }, 'Nothing validated upstream yet.')];
  }
  return [follows, h('dl', { class: 'car-facts validated' },
    h('div', {}, h('dt', {}, 'Validated'), h('dd', { class: 'validated-target' }, (standing.validatedTarget || []).join(', ') || '—')),
    h('div', {}, h('dt', {}, 'By'), h('dd', {}, runIdLink(standing.validatedBy, car.fleet), ' at ', time(standing.validatedAt))),
    h('div', {}, h('dt', {}, 'Soak'), h('dd', {}, soakLine(standing.soakEndsAt, now))))];
}

/** One fleet of a train. */
function carCard(car, members, run, now) {
  const p = car.profile.properties || {};
  const status = p.autoUpgradeProfileStatus || {};
  return h('li', { class: 'train-car', dataset: { fleet: car.fleet, profile: car.profile.name, depth: String(car.depth) } },
    h('h3', {}, h('a', { href: `#/fleets/${enc(car.fleet)}` }, car.fleet)),
    h('p', { class: 'profile-line' }, 'Profile ', h('strong', {}, car.profile.name), ` · ${channelText(p)}`,
      p.disabled ? h('span', { class: 'warn' }, ' · disabled') : null),
    h('p', { class: 'member-versions' }, members === null ? h('span', { class: 'error' }, 'members: could not read') : versionSummary(members)),
    p.upstream
      ? upstreamBlock(car, now)
      : h('p', { class: 'head-note' }, 'Head of the train: triggers on its channel\'s releases.'),
    lastTrigger(status, run, car.fleet));
}

export async function render(ctx) {
  const { main, signal } = ctx;
  const updated = h('span', { class: 'muted small' });
  const body = h('div', { id: 'trains' }, h('p', { class: 'muted' }, 'Reading the fleets…'));
  main.append(
    h('div', { class: 'title-row' }, h('h1', {}, 'Release trains'), updated),
    h('p', { class: 'muted small' }, 'Each profile with an upstream gets exactly what its upstream validated, once the soak after it has ended.'),
    body);

  let reading = false;
  /** Reads and redraws the trains; the first read's error is the route's (a 401 signs out). */
  async function refresh({ first = false } = {}) {
    if (reading) return;
    reading = true;
    try {
      const fleets = await listAll('/v1/fleets', { signal });
      const profiles = [];
      const unreadable = [];
      await eachLimited(fleets, FLEETS_AT_ONCE, async (fleet) => {
        try {
          for (const profile of await listAll(`/v1/fleets/${enc(fleet.name)}/autoUpgradeProfiles`, { signal })) {
            profiles.push({ id: profile.id || `/v1/fleets/${fleet.name}/autoUpgradeProfiles/${profile.name}`, fleet: fleet.name, profile });
          }
        } catch (e) {
          if (e.name === 'AbortError') throw e;
          unreadable.push(fleet.name);
        }
      });
      const trains = trainsOf(profiles);
      // Members and runs of the fleets in a train only, each fleet read once.
      const inTrains = [...new Set(trains.flat().map((car) => car.fleet))];
      const members = new Map();
      const runs = new Map();
      await eachLimited(inTrains, FLEETS_AT_ONCE, async (fleet) => {
        const [m, r] = await Promise.allSettled([
          listAll(`/v1/fleets/${enc(fleet)}/members`, { signal }),
          listAll(`/v1/fleets/${enc(fleet)}/updateRuns`, { signal }),
        ]);
        if (signal.aborted) return;
        members.set(fleet, m.status === 'fulfilled' ? m.value : null);
        runs.set(fleet, r.status === 'fulfilled' ? r.value : []);
      });
      if (signal.aborted) return;
      // A profile's newest run: the one it made last (runs made by a profile name it).
      const newestRun = (car) => (runs.get(car.fleet) || [])
        .filter((run) => run.properties?.autoUpgradeProfileId === car.id)
        .sort((a, b) => (b.properties?.status?.status?.startTime || '9').localeCompare(a.properties?.status?.status?.startTime || '9') || b.name.localeCompare(a.name))[0] || null;
      const now = Date.now();
      clear(body);
      if (unreadable.length) {
        body.append(h('p', { class: 'error', role: 'alert' }, `Could not read the profiles of ${unreadable.join(', ')}: trains through them are not shown.`));
      }
      if (!trains.length) {
        body.append(h('p', { id: 'no-trains' }, 'No release trains: a profile with an upstream makes one.'));
      }
      trains.forEach((cars, i) => {
        const names = cars.map((car) => `${car.fleet} / ${car.profile.name}`);
        const title = `train-${i}`;
        body.append(h('section', { class: 'train', 'aria-labelledby': title, dataset: { head: cars[0].id } },
          h('h2', { id: title }, names.join(' → ')),
          h('ol', { class: 'train-cars' }, cars.map((car) => carCard(car, members.get(car.fleet) ?? null, newestRun(car), now)))));
      });
      updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      if (first) {
        clear(body);
        throw e;
      }
      if (e.name === 'AbortError' || signal.aborted) return;
      // What was shown stays; the reason it is not current is said above it.
      updated.textContent = '';
      updated.append(h('span', { class: 'error' }, `Could not read the trains: ${e.message}`));
    } finally {
      reading = false;
    }
  }

  await refresh({ first: true });
  const refreshTimer = setInterval(() => { refresh(); }, REFRESH_MS);
  // A soak that ends is shown as moved at once; the promotion it starts is read a moment later.
  const tickTimer = setInterval(() => {
    if (tick(body, Date.now())) setTimeout(() => { if (!signal.aborted) refresh(); }, 3000);
  }, TICK_MS);
  return () => {
    clearInterval(refreshTimer);
    clearInterval(tickTimer);
  };
}

/**
 * A run's provenance (SEMANTICS §14) as entries of the run page's facts list: where a promoted
 * run's target comes from, and whether a Completed run a profile generated (`profileId`) validates
 * its target for the profiles downstream (and why not).
 */
export function trainFacts(status, fleet, profileId) {
  const facts = [];
  const from = status?.promotedFrom;
  if (from) {
    facts.push(h('div', { id: 'promoted-from' }, h('dt', {}, 'Promoted from'), h('dd', {},
      runIdLink(from.runId, fleet), ' (completed ', time(from.completedTime), ')',
      from.imagesPinned === false
        ? h('span', { class: 'warn', id: 'images-not-pinned' }, '; node images not pinned: the fleet\'s driver cannot pin them')
        : null)));
  }
  // Only a profile's runs can validate anything for the profiles that follow it.
  const ended = profileId ? status?.endedOn : null;
  if (ended) {
    const versions = [ended.kubernetesVersion, ...(ended.nodeImageVersions || []).map((i) => i.version)].filter(Boolean);
    facts.push(h('div', { id: 'ended-on', dataset: { validates: String(!!ended.validates) } },
      h('dt', {}, 'Ended on'), h('dd', {},
        versions.length ? `${versions.join(', ')}; ` : null,
        ended.validates
          ? h('span', { id: 'validates' }, 'Validates its target for downstream profiles')
          : h('span', { id: 'validates', class: 'warn' }, `Validates nothing downstream: ${ended.message || 'no reason given'}`))));
  }
  return facts;
}

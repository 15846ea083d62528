// Health and readiness check evaluations (SEMANTICS §10) as the run page shows them: a compact
// list per member, group, stage or gate (the latest evaluation of each check, its earlier
// failing ones folded behind it), a mark for a member's tile, which of a stage's or group's
// evaluations belong to which of its HealthCheck gates, and why a run stopped, in plain words.
// Only members that have evaluations cost anything: a run of 100,000 members without checks
// draws exactly as before.

import { h, time, fmtTime, parseTime } from './dom.js';

/** An evaluation's verdict: passed, failed, or could not be made (`passed: null`). */
export function verdict(result) {
  if (result.passed === true) return 'pass';
  if (result.passed === false) return 'fail';
  return 'unavailable';
}

export const VERDICTS = {
  pass: { glyph: '✓', label: 'passed' },
  fail: { glyph: '✕', label: 'failed' },
  unavailable: { glyph: '?', label: 'could not be evaluated' },
};

/** Worst first: a tile or a summary shows the worst of its checks' latest verdicts. */
const SEVERITY = { fail: 2, unavailable: 1, pass: 0 };

/**
 * What an evaluation found, without the check's name the engine's message starts with
 * (`check "errors": value 0.5 does not meet condition < 0.01` → `value 0.5 does not meet
 * condition < 0.01`). Only for display: a message in another shape is shown whole.
 */
export function finding(result) {
  const text = result.message || '';
  const prefix = `check ${JSON.stringify(result.name)}`;
  if (text.startsWith(prefix)) return text.slice(prefix.length).replace(/^:\s*/, '').trim();
  if (text) return text;
  return result.value !== undefined ? `value ${result.value}, ${VERDICTS[verdict(result)].label}` : VERDICTS[verdict(result)].label;
}

/** One evaluation as a sentence: `check errors: value 0.5 does not meet condition < 0.01`. */
export function sentence(result) {
  return `check ${result.name}${verdict(result) === 'unavailable' ? ' ' : ': '}${finding(result)}`;
}

const newestFirst = (a, b) => (parseTime(b.time) ?? 0) - (parseTime(a.time) ?? 0);

/** Evaluations by check, in the order the checks first appear: the latest and the rest, newest first. */
export function byCheck(results) {
  const checks = new Map();
  for (const r of results || []) {
    if (!checks.has(r.name)) checks.set(r.name, []);
    checks.get(r.name).push(r);
  }
  return [...checks].map(([name, all]) => {
    all.sort(newestFirst);
    return { name, latest: all[0], earlier: all.slice(1) };
  });
}

/** The worst verdict among the checks' latest evaluations, or null without any. */
export function worst(results) {
  let found = null;
  for (const { latest } of byCheck(results)) {
    const v = verdict(latest);
    if (found === null || SEVERITY[v] > SEVERITY[found]) found = v;
  }
  return found;
}

/** A tile's mark: the worst latest verdict and one line per check for its tooltip. */
export function tileMark(results) {
  if (!results?.length) return null;
  const lines = byCheck(results).map(({ latest }) => `${VERDICTS[verdict(latest)].glyph} ${sentence(latest)} (${fmtTime(latest.time)})`);
  return { verdict: worst(results), text: lines.join('\n') };
}

/** One evaluation: its verdict's glyph, the check, when, and what it found (below). */
function item(result) {
  const v = verdict(result);
  return h('li', {
    class: `check v-${v}`,
    dataset: { check: result.name, verdict: v, value: result.value ?? null },
    title: `${result.message || sentence(result)} — ${result.time}`,
  },
  h('span', { class: 'check-mark', 'aria-hidden': 'true' }, VERDICTS[v].glyph),
  h('span', { class: 'sr-only' }, `${VERDICTS[v].label}: `),
  h('span', { class: 'check-name' }, result.name),
  h('span', { class: 'check-time' }, time(result.time)),
  h('span', { class: 'check-finding' }, finding(result)));
}

/**
 * The evaluations as a compact list: each check's latest, and its earlier failing ones in a
 * fold (a gate that kept failing for an hour keeps every failing evaluation). Null without any.
 */
export function checkList(results, label) {
  const checks = byCheck(results);
  if (!checks.length) return null;
  return h('ul', { class: 'checks', 'aria-label': label },
    checks.map(({ latest, earlier }) => {
      const li = item(latest);
      if (earlier.length) {
        li.append(h('details', { class: 'check-earlier' },
          h('summary', {}, `${earlier.length} earlier`),
          h('ul', { class: 'checks' }, earlier.map((r) => item(r)))));
      }
      return li;
    }));
}

/** Whether an evaluation's time falls while a gate was being evaluated (reached → ended). */
function during(result, gate) {
  const t = parseTime(result.time);
  const from = parseTime(gate.status?.startTime);
  const to = parseTime(gate.status?.completedTime);
  return t !== null && from !== null && t >= from && (to === null || t <= to);
}

/**
 * Splits a stage's or group's evaluations between its HealthCheck gates: a gate's are those of
 * its checks made while it was being evaluated. Answers the evaluations of each gate (by gate
 * id) and those of no gate (a retry's earlier ones, say), shown on the stage or group itself.
 */
export function splitByGate(results, gates) {
  const of = new Map();
  const rest = [];
  for (const r of results || []) {
    const gate = gates.find(({ gate: g, definition }) => (!definition?.checks || definition.checks.some((c) => c.name === r.name)) && during(r, g));
    if (gate) {
      if (!of.has(gate.gate.gateId)) of.set(gate.gate.gateId, []);
      of.get(gate.gate.gateId).push(r);
    } else {
      rest.push(r);
    }
  }
  return { of, rest };
}

/** A stage's or group's HealthCheck gates with their strategy definitions. */
export function healthGates(node, definition, typeOf) {
  const gates = [];
  for (const [timing, list, defs] of [['Before', node.beforeGates, definition?.beforeGates], ['After', node.afterGates, definition?.afterGates]]) {
    (list || []).forEach((gate, i) => {
      if (typeOf(gate, defs, i) === 'HealthCheck') gates.push({ gate, definition: defs?.[i], timing });
    });
  }
  return gates;
}

/** Up to `most` failed members of a scope with their errors, as one clause. */
function failedMembers(groups, most = 3) {
  const failed = groups.flatMap((g) => (g.members || []).filter((m) => m.status?.state === 'Failed'));
  if (!failed.length) return '';
  const named = failed.slice(0, most).map((m) => `${m.name}: ${m.status?.error?.message || m.message || 'failed'}`);
  const more = failed.length > most ? `; and ${failed.length - most} more` : '';
  return ` — ${named.join('; ')}${more}`;
}

/**
 * Why a run that is Failed, Stopped or Stopping stopped, in plain words (SEMANTICS §4, §6,
 * §10), from its failed stage, group or gate and their evaluations. Answers `{text, detail,
 * target}` (`detail`: the engine's own words when the text says more; `target`: what to
 * select to see it), or null for a run that did not stop.
 */
export function stopReason(run, typeOf) {
  const status = run.properties?.status || {};
  const state = status.status?.state;
  const stages = status.stages || [];
  if (state === 'Stopped' || state === 'Stopping') {
    const stage = stages.find((s) => ['Stopped', 'Stopping'].includes(s.status?.state));
    const at = stage ? ` at stage ${stage.name}` : '';
    return {
      text: state === 'Stopping'
        ? `Stopping on request${at}: members in flight finish, nothing new starts.`
        : `Stopped on request${at}: nothing new starts until the run is started again.`,
      target: stage ? { kind: 'stage', stage: stage.name } : null,
    };
  }
  if (state !== 'Failed') return null;
  const error = status.status?.error;
  const stage = stages.find((s) => s.status?.state === 'Failed');
  if (!stage) return { text: `Failed: ${error?.message || 'no reason recorded'}`, target: null };
  const definition = (run.properties?.strategy?.stages || []).find((d) => d.name === stage.name);
  const where = `Failed at stage ${stage.name}`;

  // A failed HealthCheck gate: the stage's own, or one of its groups'.
  const scopes = [{ node: stage, definition, group: null }].concat((stage.groups || []).map((g) => ({ node: g, definition: definition?.groups?.find((d) => d.name === g.name), group: g.name })));
  for (const scope of scopes) {
    const gates = healthGates(scope.node, scope.definition, typeOf);
    const failed = gates.find(({ gate }) => gate.status?.state === 'Failed');
    if (!failed) continue;
    const { gate, timing } = failed;
    const whose = scope.group ? `group ${scope.group}` : 'the stage';
    const name = gate.displayName ? `the HealthCheck gate '${gate.displayName}'${scope.group ? ` ${timing.toLowerCase()} group ${scope.group}` : ''}` : `the HealthCheck gate ${timing.toLowerCase()} ${whose}`;
    // The latest evaluation of a check that did not pass says why; if every check's latest
    // passed (a before-gate whose soak did not finish in time), the engine's words do.
    const mine = splitByGate(scope.node.healthChecks, gates).of.get(gate.gateId) || [];
    const culprit = byCheck(mine).map(({ latest }) => latest).filter((r) => verdict(r) !== 'pass').sort((a, b) => SEVERITY[verdict(b)] - SEVERITY[verdict(a)])[0];
    const engine = scope.node.status?.error?.message || error?.message || '';
    return {
      text: `${where}: ${name} failed — ${culprit ? sentence(culprit) : engine || 'its checks did not pass'}`,
      detail: culprit && engine && engine !== culprit.message ? engine : null,
      target: { kind: 'gate', gateId: gate.gateId },
    };
  }

  const group = (stage.groups || []).find((g) => g.status?.state === 'Failed');
  if (group) {
    const why = group.status?.error?.message || 'failed';
    return { text: `${where}: group ${group.name} failed: ${why}${failedMembers([group])}`, detail: null, target: { kind: 'group', stage: stage.name, group: group.name } };
  }
  const why = stage.status?.error?.message || error?.message || 'failed';
  return { text: `${where}: the stage failed: ${why}${failedMembers(stage.groups || [])}`, detail: null, target: { kind: 'stage', stage: stage.name } };
}

/** What a member is doing, beyond its state: its soak (Running) or a readiness wait (Pending). */
export function activity(member) {
  const state = member.status?.state;
  const message = member.message || '';
  if (state === 'Running' && message.startsWith('verifying')) return 'verifying';
  if (state === 'Pending' && message.startsWith('waiting for readiness')) return 'readiness';
  return null;
}

export const ACTIVITIES = {
  verifying: { glyph: '◉', label: 'Verifying' },
  readiness: { glyph: '‖', label: 'Waiting for readiness' },
};

/** A check's type: as written, else as its data says (SEMANTICS §10). */
function checkType(c) {
  if (c.type) return c.type;
  if (c.query !== undefined || c.condition !== undefined) return 'Prometheus';
  if (c.path !== undefined || c.expectStatus !== undefined || c.bodyContains !== undefined) return 'Http';
  return 'Exec';
}

/** The check definitions of a gate or block, one line each, for the details panel: each names
 * its provider and what it asks of it. */
export function definitionList(checks) {
  if (!checks?.length) return null;
  return h('ul', { class: 'check-defs' }, checks.map((c) => {
    const type = checkType(c);
    const what = type === 'Prometheus' ? `${c.query} ${c.condition}` : type === 'Http' ? `GET ${c.path ?? '/'}${c.expectStatus ? ` → ${c.expectStatus}` : ''}` : (c.args || []).join(' ');
    const via = c.provider ? ` via ${c.provider}` : ' (written before check providers: never evaluated)';
    return h('li', { 'data-provider': c.provider ?? '' }, h('strong', {}, c.name), ` (${type}${via}) `, h('code', { class: 'wrap' }, what));
  }));
}

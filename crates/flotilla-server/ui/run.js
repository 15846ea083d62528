// One update run, live: stages left to right (stacked on narrow screens) with their groups and
// named member tiles, gates as checkpoints between them, waits as countdowns, thresholds
// against failure counts, the list of failed members, a filter by state, a details panel for
// whatever is clicked (a Pending member's says what holds it), a timeline of member upgrades
// and the event log. Health and readiness check evaluations (checks.js) show beside the member
// or gate they belong to, and a run that stopped says why at the top. A chained member
// (SEMANTICS §13) shows its hops: its versions on its tile (the hop in flight highlighted), a
// list in its details, and a segment per hop in the timeline; hop events re-read the run.
// The run's event stream (server-sent events) keeps it current: a member's event is applied to
// the run in place; an event that changes more than a member (a stage, a group, a wait, the
// run) makes the page read the run again, and a gate's event the gates too; evaluations of
// checks are read at most every few seconds (they come every interval, for every soaking
// member). A slow poll covers a dropped stream; a reconnected stream resumes after the last
// event seen.

import { api, listAll, enc, streamEvents, can, ApiError } from './api.js';
import { h, clear, badge, stateBar, countStates, time, fmtDuration, fmtTime, parseTime, STATES, TERMINAL } from './dom.js';
import { targetText, progress, progressBar } from './runs.js';
import { trainFacts } from './trains.js';
import { checkList, tileMark, splitByGate, healthGates, stopReason, activity, ACTIVITIES, VERDICTS, definitionList } from './checks.js';

/** Above this many members a group shows counts until expanded. */
const GROUP_COLLAPSE_MEMBERS = 100;
/** Above this many groups a stage shows each group as one summary line until expanded. */
const STAGE_COLLAPSE_GROUPS = 12;
/** A safety net only: the event stream keeps the page current. */
const POLL_MS = 30000;
const DEBOUNCE_MS = 250;
const MAX_EVENTS = 200;
/** The failures list names this many members; the rest are counted. */
const MAX_FAILURES_SHOWN = 50;
/** A tile's name longer than this keeps its start and its end (where fleets number clusters). */
const TILE_NAME_CHARS = 16;
/** The filter's choices, each with its count; other states join them while members are in them. */
const FILTERS = ['All', 'Running', 'Pending', 'Failed', 'Completed', 'Skipped', 'NotStarted'];
/** Where the details panel is below the pipeline (style.css's single-column layout). */
const STACKED = '(max-width: 1100px)';
/** A member's events and the state each leaves it in. */
const MEMBER_EVENTS = {
  MemberPending: 'Pending',
  MemberStarted: 'Running',
  MemberReattached: 'Running',
  MemberSucceeded: 'Completed',
  MemberFailed: 'Failed',
  MemberSkipped: 'Skipped',
  MemberStopped: 'Stopped',
  // Upgraded, and soaking under its health checks: still in flight (SEMANTICS §10).
  MemberVerifying: 'Running',
};
/** What a member or stage waits for (the forecast's waitsFor, a member's waitingFor), in words. */
/**
 * A chained member's hops (SEMANTICS §13) as a path of versions: where its first hop started,
 * then each hop's target, each with the state of the hop that goes there; the hop in flight is
 * the current one. Empty for a member upgraded without a chain.
 */
export function hopPath(m) {
  const hops = m.hops || [];
  if (!hops.length) return [];
  return [{ version: hops[0].from, state: 'Completed' }, ...hops.map((hop, i) => ({ version: hop.to, state: hop.state, hop, index: i }))];
}

/** `1.29.9 → 1.30.7 → 1.31.4`: a member's hop path in words. */
export function hopText(m) {
  return hopPath(m).map((p) => p.version).join(' → ');
}

const WAIT_WORDS = { Gate: 'a gate', Wait: 'a wait', Window: 'a maintenance window', Version: 'a version to arrive', Lock: 'another run', Slot: 'a free slot', Readiness: 'a readiness check', Freeze: 'a freeze', Budget: 'a disruption budget' };
/** Evaluations of checks make the page read the run at most this often, or one read per this many members in ms. */
const CHECKS_READ_MS = 2000;
const CHECKS_READ_MS_PER_MEMBER = 0.1;
/** The run's full forecast (stages, groups, members, waits) is asked again at most this often. */
const FORECAST_MS = 20000;

export async function render(ctx) {
  const { main, fleet, run: runName, me, notify, signal } = ctx;
  const base = `/v1/fleets/${enc(fleet)}`;
  const runPath = `${base}/updateRuns/${enc(runName)}`;

  const view = {
    run: null,
    gates: new Map(),
    expanded: new Map(),
    timelineOpen: new Set(),
    selected: null,
    /** Which members' tiles show: 'All' or a state. */
    filter: 'All',
    /** member name → {stage, group, member} of view.run, for events to find their member. */
    members: new Map(),
    /** While the run is being read: the member events that came meanwhile, applied on top. */
    replay: null,
    events: [],
    /** The run's forecast (POST …/forecast), and when it was asked for. */
    forecast: null,
    forecastAt: 0,
  };

  const live = h('span', { id: 'live', class: 'live', role: 'status' }, 'connecting…');
  /** The event stream's state; a run that has ended is not live, whatever the stream does. */
  let streamState = 'connecting';
  const head = h('section', { id: 'run-header', 'aria-label': 'Run summary' });
  const failures = h('section', { id: 'failures', class: 'failures', 'aria-label': 'Failed members', hidden: true });
  const filterBar = h('div', { id: 'state-filter', class: 'state-filter', role: 'radiogroup', 'aria-label': 'Show members by state' });
  const pipeline = h('ol', { id: 'pipeline', class: 'pipeline', 'aria-label': 'Stages, gates and waits in order' });
  const details = h('aside', { id: 'details', class: 'details', 'aria-live': 'polite', 'aria-label': 'Details' });
  const timeline = h('div', { id: 'timeline', class: 'timeline' });
  const events = h('ol', { id: 'events', class: 'events', reversed: true });
  main.append(
    h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: `#/fleets/${enc(fleet)}/runs` }, 'Runs'), ' / ', runName),
    head,
    failures,
    h('div', { class: 'run-body' },
      h('div', { class: 'pipeline-col' }, filterBar, h('div', { class: 'pipeline-wrap' }, pipeline)),
      details),
    h('section', { 'aria-labelledby': 'tl-title' }, h('h2', { id: 'tl-title' }, 'Timeline'), timeline),
    h('section', { 'aria-labelledby': 'ev-title' }, h('h2', { id: 'ev-title' }, 'Events'), events));

  // ------------------------------------------------------------------------------------------
  // Actions: each one is checked by the server too; buttons only appear for roles that may.

  async function act(label, path, body, method = 'POST') {
    try {
      await api(path, { method, body });
      notify(label, 'ok');
    } catch (e) {
      notify(`${label} failed: ${e.message}`, 'error');
    }
    await refresh();
  }
  const skip = (type, name) => act(`Skipped ${type} ${name}`, `${runPath}/skip`, { targets: [{ type, name }] });
  const approve = (gateId, name) => act(`Gate "${name}" approved by ${me.subject}`, `${base}/gates/${enc(gateId)}`, { properties: { state: 'Completed' } }, 'PATCH');

  /** A button whose action runs once at a time: it is disabled until the view re-renders. */
  function button(key, label, onclick, extra = {}) {
    const run = (event) => {
      event.currentTarget.disabled = true;
      onclick(event);
    };
    return h('button', { type: 'button', dataset: { key }, onclick: run, ...extra }, label);
  }

  // Only what the run's state allows is offered (the server's rules, SEMANTICS §5): nothing is
  // skipped or approved on a run that ended Completed or Skipped; a Failed run is started again
  // once no member is in flight.
  const runState = () => view.run?.properties?.status?.status?.state || 'NotStarted';
  const mayChange = () => !['Completed', 'Skipped'].includes(runState());
  const membersInFlight = () => [...view.members.values()].some(({ member }) => member.status?.state === 'Running');

  // ------------------------------------------------------------------------------------------
  // Rendering.

  /** Redraws `el` with `draw`, keeping the focus on the element with the same data-key. */
  function keepFocus(el, draw) {
    const focused = el.contains(document.activeElement) ? document.activeElement?.dataset?.key : null;
    draw();
    if (focused) el.querySelector(`[data-key="${CSS.escape(focused)}"]`)?.focus();
  }

  function renderHeader() {
    const run = view.run;
    const status = run.properties?.status || {};
    const state = status.status?.state || 'NotStarted';
    const p = progress(status);
    const images = status.nodeImageSelection?.selectedNodeImageVersions?.map((v) => v.version) || [];
    const actions = h('div', { class: 'actions', id: 'run-actions' });
    if (can(me, 'operator', fleet)) {
      // A run waiting at a gate (Pending) is running: starting it again is refused.
      if (!['Running', 'Pending', 'Stopping', 'Completed', 'Skipped'].includes(state)) {
        if (state === 'Failed' && membersInFlight()) {
          actions.append(h('span', { class: 'muted small', id: 'start-later' }, 'It can be started again once the members in flight finish.'));
        } else {
          actions.append(button('a:start', state === 'NotStarted' ? 'Start' : 'Start again', () => act('Run started', `${runPath}/start`), { class: 'primary', id: 'start-run' }));
        }
      }
      if (['Running', 'Pending'].includes(state)) {
        actions.append(button('a:stop', 'Stop', () => act('Run stopping', `${runPath}/stop`), { class: 'danger', id: 'stop-run' }));
      }
    }
    // An approver may roll a finished or stopped run back (SEMANTICS §15): its rollback run is
    // made and started behind an Approval gate, and opened here. The server decides whether
    // there is anything to roll back; a rollback run is not rolled back in turn.
    if (can(me, 'approver', fleet) && !status.rollbackOf && !status.rolledBackBy
        && ['Completed', 'Failed', 'Stopped'].includes(state)) {
      actions.append(button('a:rollback', 'Roll back', async () => {
        try {
          const made = await api(`${runPath}/rollback`, { method: 'POST' });
          notify(`Rollback run ${made.name} made; approve its gate to begin`, 'ok');
          location.hash = `#/fleets/${enc(fleet)}/runs/${enc(made.name)}`;
        } catch (e) {
          notify(`Roll back failed: ${e.message}`, 'error');
          await refresh();
        }
      }, { class: 'danger', id: 'rollback-run', title: 'Undo what this run changed, where the driver allows it' }));
    }
    const runLink = (name) => h('a', { href: `#/fleets/${enc(fleet)}/runs/${enc(name)}` }, name);
    const stageFailures = (status.stages || []).map((s) => `${s.name} ${s.failureCount}/${s.maxAllowedFailures}`).join(', ');
    clear(head).append(...[
      h('div', { class: 'title-row' },
        h('h1', {}, runName, ' ', h('span', { id: 'run-state' }, badge(state))),
        live,
        actions),
      h('dl', { class: 'facts' },
        h('div', {}, h('dt', {}, 'Target'), h('dd', {}, targetText(run))),
        images.length ? h('div', {}, h('dt', {}, 'Node images'), h('dd', {}, images.join(', '))) : null,
        h('div', {}, h('dt', {}, 'Progress'), h('dd', { id: 'run-progress' }, progressBar(p, 'Members done'))),
        h('div', {}, h('dt', {}, 'Failures'), h('dd', { id: 'run-failures', class: status.failureCount ? 'bad' : '' }, `${status.failureCount ?? 0}`, stageFailures ? h('span', { class: 'muted' }, ` (allowed per stage: ${stageFailures})`) : null)),
        h('div', {}, h('dt', {}, 'Started'), h('dd', {}, time(status.status?.startTime))),
        status.status?.completedTime
          ? h('div', {}, h('dt', {}, 'Finished'), h('dd', {}, time(status.status.completedTime)))
          : h('div', {}, h('dt', {}, 'Forecast end'), h('dd', { id: 'run-eta' }, etaText(status))),
        nextStage(status),
        status.rollbackOf ? h('div', { id: 'rollback-of' }, h('dt', {}, 'Rolls back'), h('dd', {}, runLink(status.rollbackOf))) : null,
        status.rolledBackBy ? h('div', { id: 'rolled-back-by' }, h('dt', {}, 'Rolled back by'), h('dd', {}, runLink(status.rolledBackBy))) : null,
        trainFacts(status, fleet, run.properties?.autoUpgradeProfileId)),
      reasonBanner(run),
    ].filter(Boolean));
    showLive();
  }

  /**
   * Why a Failed, Stopped or Stopping run stopped, in plain words, with a button that selects
   * what stopped it (checks.js's stopReason); the run's own error when nothing better is known.
   */
  function reasonBanner(run) {
    const state = runState();
    const reason = stopReason(run, gateType);
    if (!reason) {
      const error = run.properties?.status?.status?.error;
      return error ? h('p', { class: 'error' }, error.message) : null;
    }
    return h('div', { id: 'run-reason', class: `reason s-${state}`, role: 'status', dataset: { state } },
      h('p', { class: 'reason-text' },
        h('span', { class: 'reason-text-words' }, reason.text),
        reason.target ? [' ', button('a:reason', 'Show', () => selectTarget(reason.target), { class: 'link small', 'aria-label': 'Show what stopped the run' })] : null),
      reason.detail ? h('p', { class: 'reason-detail muted small' }, reason.detail) : null);
  }

  /** Selects what a reason points at: a gate, a group or a stage. */
  function selectTarget(target) {
    if (target.kind !== 'gate') {
      select(target);
      return;
    }
    const found = findGate(target.gateId);
    if (found) select({ kind: 'gate', gate: found.gate, type: found.type, where: found.where });
  }

  /**
   * A gate of the run as now read, by id: the gate, its type and definition, the stage or group
   * holding it (whose evaluations include the gate's) and that one's definition.
   */
  function findGate(gateId) {
    const definitions = view.run.properties?.strategy?.stages || [];
    for (const stage of view.run.properties?.status?.stages || []) {
      const definition = definitions.find((d) => d.name === stage.name);
      const scopes = [{ node: stage, nodeDefinition: definition, name: `stage ${stage.name}` }]
        .concat((stage.groups || []).map((g) => ({ node: g, nodeDefinition: definition?.groups?.find((d) => d.name === g.name), name: `group ${g.name}` })));
      for (const { node, nodeDefinition, name } of scopes) {
        for (const [timing, list, defs] of [['Before', node.beforeGates, nodeDefinition?.beforeGates], ['After', node.afterGates, nodeDefinition?.afterGates]]) {
          const i = (list || []).findIndex((g) => g.gateId === gateId);
          if (i >= 0) return { gate: list[i], type: gateType(list[i], defs, i), definition: defs?.[i], node, nodeDefinition, timing, where: `${timing} ${name}` };
        }
      }
    }
    return null;
  }

  /** The evaluations of a HealthCheck gate: its scope's, made while it was evaluated. */
  function gateResults(found) {
    if (!found?.node.healthChecks?.length) return [];
    return splitByGate(found.node.healthChecks, healthGates(found.node, found.nodeDefinition, gateType)).of.get(found.gate.gateId) || [];
  }

  // ------------------------------------------------------------------------------------------
  // Forecast (SEMANTICS §11): the end the run's status carries (the server's own, recomputed
  // when something changes it), and the full forecast asked for now and then, for the
  // predicted bars, each stage's end and what the next stage waits for.

  /** When the run is forecast to end: its status's forecast, else the full one's. */
  function predictedEnd(status) {
    if (status.forecast) return { at: status.forecast.completedTime ?? null, known: true };
    if (view.forecast) return { at: view.forecast.completedTime ?? null, known: true };
    return { at: null, known: false };
  }

  /** The Approval gates the forecast assumes approved now (its assumptions.pendingGates). */
  function assumedApprovals() {
    return (view.forecast?.assumptions?.pendingGates || []).filter((g) => g.type === 'Approval');
  }

  /** `gate "Canary looks healthy"`, `gates "a", "b"`. */
  function gateNames(gates) {
    const names = gates.map((g) => `"${g.displayName || g.gateId}"`);
    return `${names.length === 1 ? 'gate' : 'gates'} ${names.join(', ')}`;
  }

  function etaText(status) {
    if (status.status?.state === 'NotStarted') return h('span', { class: 'muted' }, 'not started');
    const end = predictedEnd(status);
    if (!end.known) return h('span', { class: 'muted' }, 'forecasting…');
    if (!end.at) return h('span', { class: 'warn' }, 'not within a year (it waits for something that does not come)');
    const left = parseTime(end.at) - Date.now();
    // A forecast end that has passed while the run goes on is overdue, never a time to come.
    if (left <= 0) return h('span', { class: 'warn', dataset: { overdue: 'true' } }, 'overdue (forecast for ', time(end.at), ')');
    const approvals = assumedApprovals();
    const approved = view.forecast?.assumptions?.approvals === 'IfApprovedAfterDelay' ? `approved ${fmtDuration(view.forecast.assumptions.approvalDelaySeconds * 1000)} from now` : 'approved now';
    return h('span', {}, time(end.at), h('span', { class: 'muted' }, ` (in about ${fmtDuration(left)}`,
      approvals.length ? h('span', { class: 'assumes' }, ` if ${gateNames(approvals)} ${approvals.length === 1 ? 'is' : 'are'} ${approved}`) : null, ')'));
  }

  /** One thing the forecast says a stage waits for (its waitsFor), in words. */
  function holdWords(hold) {
    const gate = `"${hold.displayName || hold.gateId}"`;
    switch (hold.kind) {
      case 'Approval': return `approval of gate ${gate}`;
      case 'ScheduledStart': return `scheduled gate ${gate}`;
      case 'HealthCheck': return `health checks of gate ${gate}`;
      case 'Wait': return `the wait after stage ${hold.stage}`;
      case 'Stage': return `stage ${hold.stage} to finish`;
      default: return `${WAIT_WORDS[hold.kind] || hold.kind} (${hold.members} ${hold.members === 1 ? 'member' : 'members'})`;
    }
  }
  /** The reasons of holds, in the words of members' waitsFor (a gate of any kind is Gate). */
  const HOLD_REASON = { Approval: 'Gate', ScheduledStart: 'Gate', HealthCheck: 'Gate' };

  /** The first stage that has not ended, and what the forecast says its start waits for. */
  function nextStage(status) {
    const stages = status.stages || [];
    const next = stages.find((s) => !TERMINAL.has(s.status?.state || 'NotStarted') && (s.status?.state || 'NotStarted') !== 'Running');
    if (!next || !view.forecast) return null;
    const predicted = (view.forecast.stages || []).find((s) => s.name === next.name);
    // Only what actually holds it, as the forecast says (SEMANTICS §11), each while it lasts.
    const now = Date.now();
    const holds = (predicted?.waitsFor || []).filter((w) => w.until === null || parseTime(w.until) > now || w.state === 'Pending');
    const reasons = [...new Set(holds.map((w) => HOLD_REASON[w.kind] || w.kind))];
    const start = parseTime(predicted?.startTime);
    const words = holds.map(holdWords);
    let when;
    if (!predicted?.startTime) when = ' does not start within a year';
    // A predicted start that has passed is not a time to come: it is waiting.
    else if (start <= now) when = words.length ? ' is waiting' : ' is due to start now';
    else when = [' starts ', time(predicted.startTime)];
    return h('div', {},
      h('dt', {}, 'Next stage'),
      h('dd', { id: 'next-stage', dataset: { stage: next.name, waits: reasons.join(','), overdue: String(start !== null && start <= now) } },
        h('strong', {}, next.name),
        when,
        words.length ? h('span', { class: 'muted' }, ` — waits for ${words.join(', ')}`) : null));
  }

  /** Asks for the run's forecast when the last one is old and the run has not ended. */
  async function refreshForecast() {
    const state = view.run?.properties?.status?.status?.state || 'NotStarted';
    if (TERMINAL.has(state) || Date.now() - view.forecastAt < FORECAST_MS) return;
    view.forecastAt = Date.now();
    try {
      view.forecast = await api(`${runPath}/forecast`, { method: 'POST', body: {}, signal });
    } catch (e) {
      // An ended run has nothing to forecast; anything else leaves the last forecast shown.
      if (e.name === 'AbortError') return;
      if (e instanceof ApiError && e.status === 409) view.forecast = null;
      return;
    }
    renderHeader();
    renderTimeline();
  }

  /** The strategy's gate definitions in the order of the status tree, for their types. */
  function gateType(gate, definitions, index) {
    return view.gates.get(gate.gateId)?.properties?.gateType || definitions?.[index]?.type || 'Approval';
  }

  /** The mark of a gate's type: approval, scheduled start, health check. */
  const GATE_MARKS = { Approval: '◆', ScheduledStart: '◷', HealthCheck: '♥' };

  /**
   * A gate between stages (or, compact, inside a group's card): its name, state, who approved
   * it, a countdown to a scheduled start, the approve button, and a HealthCheck gate's
   * evaluations (`results`).
   */
  function checkpoint(gate, type, where, compact, results = []) {
    const state = gate.status?.state || 'NotStarted';
    const resource = view.gates.get(gate.gateId)?.properties || {};
    const name = gate.displayName || `${type} gate`;
    const key = `g:${gate.gateId}`;
    const parts = [
      h('span', { class: 'gate-mark', 'aria-hidden': 'true' }, GATE_MARKS[type] || '◷'),
      h('button', { type: 'button', class: 'link gate-name', dataset: { key }, onclick: () => select({ kind: 'gate', gate, type, where }) }, name),
      badge(state),
    ];
    if (resource.approvedBy) {
      parts.push(h('span', { class: 'approved-by' }, `approved by ${resource.approvedBy}`, resource.approvedAt ? [' at ', time(resource.approvedAt)] : null));
    }
    const start = parseTime(resource.scheduledStartProperties?.absoluteStartTime);
    if (type !== 'Approval' && start && state === 'Pending') {
      parts.push(h('span', { class: 'countdown', dataset: { deadline: String(start) } }, ''));
    }
    // An approver may complete a pending HealthCheck gate by hand, recorded like an approval
    // (SEMANTICS §10).
    const byHand = type === 'Approval' || type === 'HealthCheck';
    if (byHand && state === 'Pending' && mayChange()) {
      if (can(me, 'approver', fleet)) {
        const title = type === 'HealthCheck' ? 'Complete the gate now, without waiting for its checks (recorded as your approval)' : null;
        parts.push(button(`a:approve:${gate.gateId}`, 'Approve', () => approve(gate.gateId, name), { class: 'primary approve', 'aria-label': `Approve gate: ${name}`, title }));
      } else {
        parts.push(h('span', { class: 'muted' }, type === 'HealthCheck' ? 'waiting for its checks or an approver' : 'waiting for an approver'));
      }
    }
    const checks = checkList(results, `Evaluations of gate ${name}`);
    if (checks) parts.push(checks);
    return h(compact ? 'div' : 'li', {
      class: `checkpoint s-${state}${compact ? ' compact' : ''}${checks ? ' has-checks' : ''}`,
      dataset: { gate: gate.gateId, state, type },
      role: 'group',
      'aria-label': `${where} ${type} gate ${name}: ${state}`,
    }, parts);
  }

  function waitItem(stage) {
    const wait = stage.afterStageWaitStatus;
    const state = wait.status?.state || 'NotStarted';
    const started = parseTime(wait.status?.startTime);
    const parts = [h('span', { class: 'gate-mark', 'aria-hidden': 'true' }, '◔'), h('span', { class: 'gate-name' }, `Wait ${fmtDuration(wait.waitDurationInSeconds * 1000)}`), badge(state)];
    if (state === 'Running' && started) {
      // A scaled wait (a `sim` fleet's timeScale) says when it ends; any other ends its length after its start.
      const ends = parseTime(wait.endsAt) || started + wait.waitDurationInSeconds * 1000;
      parts.push(h('span', { class: 'countdown', dataset: { deadline: String(ends) } }, ''));
    }
    const stageOver = ['Completed', 'Skipped'].includes(stage.status?.state);
    if (can(me, 'operator', fleet) && mayChange() && !stageOver && ['NotStarted', 'Running', 'Pending'].includes(state)) {
      parts.push(button(`a:skipwait:${stage.name}`, 'Skip wait', () => skip('AfterStageWait', stage.name), { class: 'small' }));
    }
    return h('li', { class: `checkpoint wait s-${state}`, dataset: { wait: stage.name, state }, 'aria-label': `Wait after stage ${stage.name}: ${state}` }, parts);
  }

  /**
   * What holds a Pending member (API.md's waitingFor), as a small tag: its kind and the name of
   * the run, freeze or budget where there is one ("Budget: prod-per-region"), until when in its
   * tooltip where that is known.
   */
  function waitTag(waitingFor) {
    if (!waitingFor?.kind) return null;
    const text = waitingFor.name ? `${waitingFor.kind}: ${waitingFor.name}` : waitingFor.kind;
    return h('span', {
      class: 'tag wait-tag',
      dataset: { kind: waitingFor.kind },
      title: `Waiting for ${WAIT_WORDS[waitingFor.kind] || waitingFor.kind}${waitingFor.until ? ` until ${fmtTime(waitingFor.until)}` : ''}`,
    }, text);
  }

  /** A long name keeps its start and its end: clusters are told apart by their numbers. */
  function shortName(name) {
    return name.length <= TILE_NAME_CHARS ? name : `${name.slice(0, TILE_NAME_CHARS - 7)}…${name.slice(-6)}`;
  }

  const filteredOut = (state) => view.filter !== 'All' && state !== view.filter;

  /**
   * A member's tile: its state's glyph and its name, or the glyph alone in a dense group. A
   * member in its soak reads Verifying, one waiting for readiness says so; a member with check
   * evaluations carries a mark of the worst latest one, and its tooltip lists them.
   */
  function tile(stage, group, m, named) {
    const state = m.status?.state || 'NotStarted';
    const doing = activity(m);
    const label = doing ? ACTIVITIES[doing].label : STATES[state]?.label || state;
    const message = m.status?.error?.message || m.message || '';
    const mark = m.healthChecks?.length ? tileMark(m.healthChecks) : null;
    const key = `m:${stage.name}/${group.name}/${m.name}`;
    const selected = view.selected?.kind === 'member' && view.selected.name === m.name;
    const path = hopPath(m);
    const hops = path.length ? hopText(m) : null;
    return h('li', { hidden: filteredOut(state) },
      h('button', {
        type: 'button',
        class: `tile s-${state}${named ? ' named' : ''}${named && hops ? ' has-hops' : ''}${selected ? ' selected' : ''}${doing ? ` a-${doing}` : ''}${mark ? ` checked v-${mark.verdict}` : ''}`,
        dataset: { member: m.name, state, key, activity: doing, checks: mark?.verdict, waiting: state === 'Pending' ? m.waitingFor?.kind : null, hops },
        title: `${m.name}: ${label}${message ? ` — ${message}` : ''}${hops ? `\nhops: ${hops}` : ''}${mark ? `\n${mark.text}` : ''}`,
        'aria-label': `${m.name}: ${label}${message ? `. ${message}` : ''}${hops ? `. Hops ${hops}` : ''}${mark ? `. Checks ${VERDICTS[mark.verdict].label}` : ''}`,
        'aria-pressed': selected ? 'true' : 'false',
        onclick: () => select({ kind: 'member', stage: stage.name, group: group.name, name: m.name }),
      },
      h('span', { class: 'glyph', 'aria-hidden': 'true' }, doing ? ACTIVITIES[doing].glyph : STATES[state]?.glyph || '?'),
      named ? h('span', { class: 'tile-name', 'aria-hidden': 'true' }, shortName(m.name)) : null,
      mark && named ? h('span', { class: 'tile-check', 'aria-hidden': 'true' }, VERDICTS[mark.verdict].glyph) : null,
      named && hops ? hopLine(path) : null));
  }

  /** A named tile's line of versions, the hop in flight highlighted, a failed one struck. */
  function hopLine(path) {
    const parts = [];
    path.forEach((p, i) => {
      if (i) parts.push(h('span', { class: 'hop-arrow' }, ' → '));
      parts.push(h('span', { class: `hop-version h-${p.state}${p.state === 'Running' ? ' hop-current' : ''}`, dataset: { hopState: p.index === undefined ? null : p.state } }, p.version));
    });
    return h('span', { class: 'tile-hops', 'aria-hidden': 'true' }, parts);
  }

  function limits(node, members) {
    const running = members.filter((m) => m.status?.state === 'Running').length;
    // A member in its soak holds its slot (SEMANTICS §10): counted, and said.
    const verifying = running ? members.filter((m) => activity(m) === 'verifying').length : 0;
    const over = node.failureCount > node.maxAllowedFailures;
    return h('p', { class: 'limits' },
      // The ceiling that can bind: no more at once than there are members.
      h('span', { title: 'members upgrading or verifying now / resolved maxConcurrency (at most the members)' }, `${running} / ${Math.min(node.maxConcurrency ?? Infinity, members.length)} at once`, verifying ? ` (${verifying} verifying)` : ''),
      ' · ',
      h('span', { class: over ? 'bad' : node.failureCount ? 'warn' : '', title: 'failures / resolved maxAllowedFailures' }, `failures ${node.failureCount} / ${node.maxAllowedFailures} allowed`));
  }

  function groupCard(stage, group, definition, collapsedByDefault) {
    const members = group.members || [];
    const state = group.status?.state || 'NotStarted';
    const key = `${stage.name}/${group.name}`;
    const expanded = view.expanded.has(key) ? view.expanded.get(key) : !collapsedByDefault && members.length <= GROUP_COLLAPSE_MEMBERS;
    const done = members.filter((m) => TERMINAL.has(m.status?.state)).length;
    const toggle = h('button', {
      type: 'button',
      class: 'toggle',
      'aria-expanded': String(expanded),
      dataset: { key: `t:${key}` },
      'aria-label': `${expanded ? 'Collapse' : 'Expand'} group ${group.name} (${members.length} members)`,
      onclick: () => { view.expanded.set(key, !expanded); renderPipeline(); },
    }, expanded ? '▾' : '▸');
    const card = h('article', { class: `group s-${state}${expanded ? '' : ' collapsed'}`, dataset: { group: group.name, state }, 'aria-label': `Group ${group.name}: ${state}` },
      h('header', {},
        toggle,
        h('button', { type: 'button', class: 'link name', dataset: { key: `gr:${key}` }, onclick: () => select({ kind: 'group', stage: stage.name, group: group.name }) }, group.name),
        badge(state),
        expanded ? null : stateBar(countStates(members), members.length),
        h('span', { class: 'counts done' }, `${done}/${members.length}`)));
    const beforeGates = group.beforeGates || [];
    const afterGates = group.afterGates || [];
    const checks = evaluationsOf(group, definition);
    beforeGates.forEach((g, i) => card.append(checkpoint(g, gateType(g, definition?.beforeGates, i), `Before group ${group.name}`, true, checks.of.get(g.gateId))));
    if (checks.rest.length) card.append(checkList(checks.rest, `Evaluations of group ${group.name}`));
    if (expanded) {
      card.append(limits(group, members));
      // A failed group's message is its error's: said once.
      if (group.message && group.message !== group.status?.error?.message) card.append(h('p', { class: 'muted small' }, group.message));
      if (group.status?.error) card.append(h('p', { class: 'error small' }, group.status.error.message));
      // Up to a hundred members a tile carries its name; a larger group, expanded on purpose, is
      // a dense map of glyphs (the name is in each tile's label and tooltip).
      const named = members.length <= GROUP_COLLAPSE_MEMBERS;
      card.append(h('ul', { class: named ? 'tiles named' : 'tiles dense', 'aria-label': `Members of ${group.name}` }, members.map((m) => tile(stage, group, m, named))));
      if (view.filter !== 'All' && members.every((m) => filteredOut(m.status?.state || 'NotStarted'))) {
        card.append(h('p', { class: 'muted small filtered' }, `No ${(STATES[view.filter]?.label || view.filter).toLowerCase()} members here.`));
      }
    }
    afterGates.forEach((g, i) => card.append(checkpoint(g, gateType(g, definition?.afterGates, i), `After group ${group.name}`, true, checks.of.get(g.gateId))));
    return card;
  }

  /** A stage's or group's evaluations, by HealthCheck gate and the rest; nothing to do without any. */
  function evaluationsOf(node, definition) {
    if (!node.healthChecks?.length) return { of: new Map(), rest: [] };
    return splitByGate(node.healthChecks, healthGates(node, definition, gateType));
  }

  function stageCard(stage, definition) {
    const state = stage.status?.state || 'NotStarted';
    const groups = stage.groups || [];
    const members = groups.flatMap((g) => g.members || []);
    const many = groups.length > STAGE_COLLAPSE_GROUPS;
    // A stage's share of the row grows with its members (gently): named tiles need room, and a
    // canary of two should not take as much as production.
    const weight = Math.max(1, Math.sqrt(members.length) / 2).toFixed(2);
    return h('li', { class: `stage s-${state}`, dataset: { stage: stage.name, state }, style: { '--weight': weight } },
      h('section', { 'aria-label': `Stage ${stage.name}: ${state}` },
        h('header', {},
          h('h2', {}, h('button', { type: 'button', class: 'link name', dataset: { key: `st:${stage.name}` }, onclick: () => select({ kind: 'stage', stage: stage.name }) }, stage.name)),
          badge(state)),
        limits(stage, members),
        stateBar(countStates(members), members.length),
        stage.message && stage.message !== stage.status?.error?.message ? h('p', { class: 'muted small' }, stage.message) : null,
        stage.status?.error ? h('p', { class: 'error small' }, stage.status.error.message) : null,
        checkList(evaluationsOf(stage, definition).rest, `Evaluations of stage ${stage.name}`),
        many ? h('p', { class: 'muted small' }, `${groups.length} groups: expand one to see its members.`) : null,
        h('div', { class: many ? 'groups many' : 'groups' }, groups.map((g) => groupCard(stage, g, definition?.groups?.find((d) => d.name === g.name), many)))));
  }

  function renderPipeline() {
    const focused = document.activeElement?.dataset?.key;
    const run = view.run;
    const status = run.properties?.status || {};
    const definitions = run.properties?.strategy?.stages || [];
    clear(pipeline);
    for (const stage of status.stages || []) {
      const definition = definitions.find((d) => d.name === stage.name);
      const checks = evaluationsOf(stage, definition);
      (stage.beforeGates || []).forEach((g, i) => pipeline.append(checkpoint(g, gateType(g, definition?.beforeGates, i), `Before stage ${stage.name}`, false, checks.of.get(g.gateId))));
      pipeline.append(stageCard(stage, definition));
      (stage.afterGates || []).forEach((g, i) => pipeline.append(checkpoint(g, gateType(g, definition?.afterGates, i), `After stage ${stage.name}`, false, checks.of.get(g.gateId))));
      if (stage.afterStageWaitStatus) pipeline.append(waitItem(stage));
    }
    if (focused) pipeline.querySelector(`[data-key="${CSS.escape(focused)}"]`)?.focus();
    tick();
  }

  function find(selection) {
    if (selection.name) return view.members.get(selection.name) || {};
    const stages = view.run.properties?.status?.stages || [];
    const stage = stages.find((s) => s.name === selection.stage);
    return { stage, group: stage?.groups?.find((g) => g.name === selection.group) };
  }

  function select(selection) {
    view.selected = selection;
    renderDetails();
    renderPipeline();
    renderFailures();
    // Stacked on a narrow screen, the details are below the pipeline: bring them into view.
    if (matchMedia(STACKED).matches) details.scrollIntoView({ block: 'nearest' });
  }

  /** Every Failed member with where it is and why, each selectable; hidden while there is none. */
  function renderFailures() {
    const failed = [...view.members.values()].filter(({ member }) => member.status?.state === 'Failed');
    keepFocus(failures, () => {
      clear(failures);
      failures.hidden = !failed.length;
      if (!failed.length) return;
      const selected = view.selected?.kind === 'member' ? view.selected.name : null;
      failures.append(...[
        h('h2', {}, `Failures (${failed.length})`),
        h('ul', { class: 'failures-list', id: 'failures-list' }, failed.slice(0, MAX_FAILURES_SHOWN).map(({ stage, group, member }) => {
          const error = member.status?.error?.message || member.message;
          return h('li', { dataset: { member: member.name } },
            h('button', {
              type: 'button',
              class: 'link name',
              dataset: { key: `fl:${member.name}` },
              'aria-pressed': selected === member.name ? 'true' : 'false',
              onclick: () => select({ kind: 'member', stage: stage.name, group: group.name, name: member.name }),
            }, member.name),
            h('span', { class: 'muted' }, ` ${stage.name} / ${group.name}`),
            error ? h('span', { class: 'error' }, ` — ${error}`) : null);
        })),
        failed.length > MAX_FAILURES_SHOWN
          ? h('p', { class: 'muted small' }, `and ${failed.length - MAX_FAILURES_SHOWN} more: show the Failed members to see them all.`)
          : null,
      ].filter(Boolean));
    });
  }

  /** Choices (one at a time: radio buttons) that show only the members in one state, with counts. */
  function renderFilter() {
    const counts = new Map(FILTERS.map((f) => [f, 0]));
    for (const { member } of view.members.values()) {
      const state = member.status?.state || 'NotStarted';
      counts.set(state, (counts.get(state) || 0) + 1);
    }
    counts.set('All', view.members.size);
    const shown = [...counts.keys()].filter((f) => FILTERS.includes(f) || counts.get(f) || f === view.filter);
    keepFocus(filterBar, () => clear(filterBar).append(
      h('span', { class: 'muted small', 'aria-hidden': 'true' }, 'Show'),
      ...shown.map((f) => h('label', { class: `filter s-${f}${view.filter === f ? ' on' : ''}`, dataset: { filter: f, count: String(counts.get(f) || 0) } },
        h('input', {
          type: 'radio',
          name: 'state-filter',
          value: f,
          checked: view.filter === f,
          dataset: { key: `f:${f}` },
          onchange: () => {
            view.filter = f;
            renderFilter();
            renderPipeline();
          },
        }),
        f === 'All' ? 'All' : STATES[f]?.label || f, ' ', h('span', { class: 'counts' }, String(counts.get(f) || 0))))));
  }

  function renderDetails() {
    const focused = document.activeElement?.dataset?.key;
    clear(details);
    const sel = view.selected;
    if (!sel) {
      details.append(h('h2', {}, 'Details'), h('p', { class: 'muted' }, 'Click a member, group, stage or gate to see its times, messages and actions.'),
        h('div', { class: 'legend', 'aria-label': 'Legend' }, Object.entries(STATES).map(([s, v]) => h('span', { class: `tile-legend s-${s}` }, h('span', { class: 'tile', 'aria-hidden': 'true' }, v.glyph), ` ${v.label}`))));
      return;
    }
    const rows = [];
    const row = (k, v) => rows.push(h('dt', {}, k), h('dd', {}, v ?? '—'));
    let title = '';
    const actions = h('div', { class: 'actions' });
    /** Evaluations of checks, below the facts: the latest of each check, earlier failing ones folded. */
    const extra = [];
    const checks = (results, label) => {
      const list = checkList(results, label);
      if (list) extra.push(h('h3', { class: 'checks-title' }, 'Checks'), list);
    };
    if (sel.kind === 'member') {
      const { member } = find(sel);
      if (!member) { view.selected = null; renderDetails(); return; }
      const state = member.status?.state;
      const doing = activity(member);
      title = member.name;
      row('State', [badge(state), doing ? h('span', { class: 'activity' }, ` ${ACTIVITIES[doing].label.toLowerCase()}`) : null]);
      row('Stage / group', `${sel.stage} / ${sel.group}`);
      row('Started', time(member.status?.startTime));
      row('Finished', time(member.status?.completedTime));
      const start = parseTime(member.status?.startTime);
      if (start) row('Took', fmtDuration((parseTime(member.status?.completedTime) ?? Date.now()) - start));
      // A Pending member's message names what holds it; waitingFor says it in brief beside it.
      const waiting = state === 'Pending' ? waitTag(member.waitingFor) : null;
      if (member.message || waiting) row('Message', [waiting, member.message]);
      // An error applied from the member's event has no code until the run is read again.
      const error = member.status?.error;
      if (error) row('Error', h('span', { class: 'error' }, error.code ? `${error.code}: ${error.message}` : error.message));
      if (member.hops?.length) {
        row('Hops', h('ol', { class: 'hops' }, member.hops.map((hop) => {
          const s = parseTime(hop.startTime);
          const e = parseTime(hop.completedTime);
          return h('li', { class: `hop h-${hop.state}`, dataset: { state: hop.state } },
            `${hop.from} → ${hop.to} `, badge(hop.state), s !== null && e !== null ? h('span', { class: 'muted' }, ` ${fmtDuration(e - s)}`) : null);
        })));
      }
      // Where the run found it, and whether a rollback took it back there (SEMANTICS §15).
      if (member.before) {
        const pools = (member.before.nodePools || []).map((p) => `${p.name} ${p.nodeImageVersion || ''}`.trim());
        row('Before', [member.before.kubernetesVersion, pools.length ? h('span', { class: 'muted' }, ` (${pools.join(', ')})`) : null]);
      }
      if (member.rolledBack !== undefined) {
        row('Rolled back', h('span', { id: 'member-rolled-back', class: member.rolledBack ? '' : 'bad' }, member.rolledBack ? 'yes' : 'no'));
      }
      row('Operation', member.operationId);
      row('Cluster', h('code', { class: 'wrap' }, member.clusterResourceId));
      checks(member.healthChecks, `Evaluations of ${member.name}`);
      if (can(me, 'operator', fleet) && mayChange() && ['NotStarted', 'Pending'].includes(state)) actions.append(button(`a:skipm:${member.name}`, 'Skip member', () => skip('Member', member.name)));
    } else if (sel.kind === 'group') {
      const { group } = find(sel);
      if (!group) { view.selected = null; renderDetails(); return; }
      title = `Group ${group.name}`;
      row('State', badge(group.status?.state));
      row('Members', stateBar(countStates(group.members || []), (group.members || []).length));
      row('maxConcurrency', String(group.maxConcurrency));
      row('Failures', `${group.failureCount} of ${group.maxAllowedFailures} allowed`);
      row('Started', time(group.status?.startTime));
      row('Finished', time(group.status?.completedTime));
      if (group.message) row('Message', group.message);
      if (group.status?.error) row('Error', h('span', { class: 'error' }, group.status.error.message));
      checks(group.healthChecks, `Evaluations of group ${group.name}`);
      if (can(me, 'operator', fleet) && mayChange() && !TERMINAL.has(group.status?.state)) actions.append(button(`a:skipg:${group.name}`, 'Skip group', () => skip('Group', group.name)));
    } else if (sel.kind === 'stage') {
      const { stage } = find(sel);
      if (!stage) { view.selected = null; renderDetails(); return; }
      title = `Stage ${stage.name}`;
      row('State', badge(stage.status?.state));
      row('Groups', String((stage.groups || []).length));
      row('maxConcurrency', String(stage.maxConcurrency));
      row('Failures', `${stage.failureCount} of ${stage.maxAllowedFailures} allowed`);
      row('Started', time(stage.status?.startTime));
      row('Finished', time(stage.status?.completedTime));
      if (stage.message) row('Message', stage.message);
      if (stage.status?.error) row('Error', h('span', { class: 'error' }, stage.status.error.message));
      checks(stage.healthChecks, `Evaluations of stage ${stage.name}`);
      if (can(me, 'operator', fleet) && mayChange() && !TERMINAL.has(stage.status?.state)) actions.append(button(`a:skips:${stage.name}`, 'Skip stage', () => skip('Stage', stage.name)));
    } else if (sel.kind === 'gate') {
      // The gate as last read (the selection keeps the one clicked, which may be older).
      const found = findGate(sel.gate.gateId);
      const gate = found?.gate || sel.gate;
      const resource = view.gates.get(gate.gateId)?.properties || {};
      title = gate.displayName || `${sel.type} gate`;
      row('Where', sel.where);
      row('Type', sel.type);
      // The run's tree, as just read, before the gate resource (read with gate events only).
      row('State', badge(gate.status?.state || resource.state));
      row('Reached', time(gate.status?.startTime));
      row('Completed', time(gate.status?.completedTime));
      if (resource.approvedBy) row('Approved by', resource.approvedBy);
      if (resource.approvedAt) row('Approved at', time(resource.approvedAt));
      if (resource.scheduledStartProperties?.absoluteStartTime) row('Opens at', time(resource.scheduledStartProperties.absoluteStartTime));
      const definition = found?.definition;
      if (sel.type === 'HealthCheck' && definition) {
        // The strategy's timings, defaults as SEMANTICS §10 gives them.
        const secs = (v, d) => fmtDuration((v ?? d) * 1000);
        row('Passes after', `${secs(definition.soakSeconds, 600)} of passing evaluations, one every ${secs(definition.intervalSeconds, 60)}`);
        if (found.timing === 'Before') row('Fails after', secs(definition.timeoutSeconds, 3600));
        row('Checks', definitionList(definition.checks));
      }
      row('Gate id', h('code', {}, gate.gateId));
      checks(gateResults(found), `Evaluations of gate ${title}`);
    }
    details.append(
      h('div', { class: 'title-row' }, h('h2', {}, title), button('d:close', 'Close', () => { view.selected = null; renderDetails(); renderPipeline(); }, { class: 'link', 'aria-label': 'Close details' })),
      h('dl', { class: 'kv' }, rows),
      ...extra,
      actions);
    if (focused) details.querySelector(`[data-key="${CSS.escape(focused)}"]`)?.focus();
  }

  function renderTimeline() {
    const status = view.run.properties?.status || {};
    const t0 = parseTime(status.status?.startTime);
    clear(timeline);
    if (!t0) {
      timeline.append(h('p', { class: 'muted' }, 'The run has not started.'));
      return;
    }
    const ended = parseTime(status.status?.completedTime);
    // A run that has not ended is drawn to its forecast end, predicted bars behind the actual.
    const forecast = ended === null ? view.forecast : null;
    const predictedEndAt = parseTime(forecast?.completedTime);
    const now = Date.now();
    const t1 = Math.max(ended ?? Math.max(now, predictedEndAt ?? now), t0 + 1000);
    const span = t1 - t0;
    const predictedOf = new Map();
    for (const st of forecast?.stages || []) {
      predictedOf.set(`s:${st.name}`, st);
      for (const g of st.groups || []) {
        predictedOf.set(`g:${st.name}/${g.name}`, g);
        for (const m of g.members || []) predictedOf.set(`m:${m.name}`, m);
      }
    }
    const predictedBar = (key, label) => {
      const p = predictedOf.get(key);
      const s = parseTime(p?.startTime);
      const e = parseTime(p?.completedTime);
      if (s === null || e === null) return null;
      return h('span', {
        class: 'bar predicted',
        style: { left: `${(100 * (Math.max(s, t0) - t0)) / span}%`, width: `${Math.max((100 * (e - Math.max(s, t0))) / span, 0.3)}%` },
        title: `${label}, forecast: ${fmtTime(p.startTime)} → ${fmtTime(p.completedTime)}`,
      });
    };
    const bar = (node, label, key) => {
      const s = parseTime(node.status?.startTime);
      const state = node.status?.state || 'NotStarted';
      const behind = key ? predictedBar(key, label) : null;
      if (s === null) return h('div', { class: 'track' }, behind);
      const e = parseTime(node.status?.completedTime) ?? Math.min(now, t1);
      const left = (100 * (s - t0)) / span;
      const width = Math.max((100 * (e - s)) / span, 0.3);
      return h('div', { class: 'track' }, behind, h('span', {
        class: `bar s-${state}`,
        style: { left: `${left}%`, width: `${width}%` },
        title: `${label}: ${STATES[state]?.label || state}, ${fmtTime(node.status?.startTime)} → ${node.status?.completedTime ? fmtTime(node.status.completedTime) : 'now'} (${fmtDuration(e - s)})`,
      }));
    };
    /** A stage's or group's forecast end, for its label while it has not ended. */
    const eta = (node, key) => {
      const end = predictedOf.get(key)?.completedTime;
      if (!end || node.status?.completedTime) return null;
      return h('span', { class: 'muted eta', dataset: { eta: key } }, ` · ends ~${fmtTime(end)}`);
    };
    const endLabel = status.status?.completedTime ? fmtTime(status.status.completedTime) : predictedEndAt !== null ? `forecast ${fmtTime(forecast.completedTime)}` : 'now';
    const rows = [h('div', { class: 'axis', 'aria-hidden': 'true' }, h('span', {}, fmtTime(new Date(t0).toISOString())), h('span', {}, fmtDuration(span)), h('span', {}, endLabel))];
    if (forecast) {
      rows.push(h('p', { class: 'muted legend' }, h('span', { class: 'bar predicted swatch', 'aria-hidden': 'true' }), ' forecast, behind what happened'));
    }
    for (const stage of status.stages || []) {
      rows.push(h('div', { class: 'tl-row stage-row', dataset: { stage: stage.name } }, h('span', { class: 'tl-label' }, stage.name, eta(stage, `s:${stage.name}`)), bar(stage, `Stage ${stage.name}`, `s:${stage.name}`)));
      for (const group of stage.groups || []) {
        const key = `${stage.name}/${group.name}`;
        const open = view.timelineOpen.has(key);
        const det = h('details', { open: open || null },
          h('summary', { class: 'tl-row' }, h('span', { class: 'tl-label' }, `${group.name} (${(group.members || []).length})`, eta(group, `g:${key}`)), bar(group, `Group ${group.name}`, `g:${key}`)));
        if (open) {
          for (const m of group.members || []) {
            if (!m.status?.startTime && !predictedOf.has(`m:${m.name}`)) continue;
            const track = bar(m, m.name, `m:${m.name}`);
            // A chained member: each hop a segment over the member's bar (SEMANTICS §13).
            if (m.hops?.length) {
              track.querySelector('.bar:not(.predicted)')?.classList.add('under');
              m.hops.forEach((hop, i) => {
                const s = parseTime(hop.startTime);
                if (s === null) return;
                const e = parseTime(hop.completedTime) ?? Math.min(now, t1);
                track.append(h('span', {
                  class: `bar hop s-${hop.state}`,
                  dataset: { hop: String(i + 1), to: hop.to },
                  style: { left: `${(100 * (s - t0)) / span}%`, width: `${Math.max((100 * (e - s)) / span, 0.3)}%` },
                  title: `${m.name}, hop ${i + 1} of ${m.hops.length}: ${hop.from} → ${hop.to}, ${STATES[hop.state]?.label || hop.state}, ${fmtTime(hop.startTime)} → ${hop.completedTime ? fmtTime(hop.completedTime) : 'now'} (${fmtDuration(e - s)})`,
                }));
              });
            }
            det.append(h('div', { class: 'tl-row member-row', dataset: { member: m.name } }, h('span', { class: 'tl-label' }, m.name), track));
          }
        }
        det.addEventListener('toggle', () => {
          if (det.open === open) return;
          if (det.open) view.timelineOpen.add(key); else view.timelineOpen.delete(key);
          renderTimeline();
        });
        rows.push(det);
      }
    }
    timeline.append(...rows);
  }

  function renderEvents() {
    clear(events);
    for (const e of view.events.slice(-MAX_EVENTS).reverse()) {
      const where = [e.stage, e.group, e.member, e.gate].filter(Boolean).join(' / ');
      events.append(h('li', { class: `event t-${e.type}`, dataset: e.id ? { id: e.id } : null }, time(e.time), ' ', h('strong', {}, e.type), where ? ` ${where}` : '', e.message ? h('span', { class: 'muted' }, ` — ${e.message}`) : '', e.error?.message ? h('span', { class: 'error' }, ` — ${e.error.message}`) : ''));
    }
    if (!view.events.length) events.append(h('li', { class: 'muted' }, 'No events yet.'));
  }

  /** Countdowns tick every second without a re-read. */
  function tick() {
    for (const el of main.querySelectorAll('[data-deadline]')) {
      const left = Number(el.dataset.deadline) - Date.now();
      el.textContent = left > 0 ? `${fmtDuration(left)} left` : 'due now';
    }
  }

  // ------------------------------------------------------------------------------------------
  // Data.

  /** Every member of the run by name, for events and the views that list members. */
  function indexMembers() {
    view.members = new Map();
    for (const stage of view.run.properties?.status?.stages || []) {
      for (const group of stage.groups || []) {
        for (const member of group.members || []) view.members.set(member.name, { stage, group, member });
      }
    }
  }

  /**
   * Applies a member's event to the run in place: its state, times, message and error, and on
   * a failure the failure counts of its group, its stage and the run (SEMANTICS §4). Answers
   * whether anything changed. The stream's backlog replays what the run as read already shows:
   * an event older than the member's last change, or as old and of the state it is in, is
   * skipped, so that a failure is never counted twice.
   */
  function applyMember(event) {
    const state = MEMBER_EVENTS[event.type];
    const found = view.members.get(event.member);
    if (!state || !found) return false;
    const { stage, group, member } = found;
    const status = member.status || (member.status = {});
    const at = parseTime(event.time);
    const latest = Math.max(parseTime(status.startTime) ?? -Infinity, parseTime(status.completedTime) ?? -Infinity);
    // A soak begins in flight at the instant the upgrade ended (or the attempt began, for a
    // member found at target): at that instant only its message is new, and an end at the
    // same instant is later.
    const seen = event.type === 'MemberVerifying' ? !['Running', 'NotStarted', 'Pending'].includes(status.state) : status.state === state;
    if (at !== null && (at < latest || (at === latest && seen))) return false;
    status.state = state;
    // waitingFor explains the message beside it and no event carries it: a new message, or a
    // state other than Pending, drops it until the run is read again.
    if (event.type !== 'MemberPending' || event.message !== member.message) delete member.waitingFor;
    switch (event.type) {
      case 'MemberStarted':
        // A new attempt: what the last one left is gone (the engine clears it too).
        status.startTime = event.time;
        delete status.completedTime;
        delete status.error;
        delete member.message;
        delete member.operationId;
        break;
      case 'MemberPending':
      case 'MemberVerifying':
        member.message = event.message;
        break;
      case 'MemberSucceeded':
        status.completedTime = event.time;
        break;
      case 'MemberSkipped':
        status.completedTime = event.time;
        if (event.message) member.message = event.message;
        break;
      case 'MemberFailed': {
        status.completedTime = event.time;
        status.error = { code: event.error?.code || '', message: event.error?.message || event.message || 'failed' };
        const run = view.run.properties.status;
        for (const node of [group, stage, run]) node.failureCount = (node.failureCount || 0) + 1;
        break;
      }
      default:
        break;
    }
    return true;
  }

  /** Draws everything the run's status shows (not the event log). */
  function renderRun() {
    renderHeader();
    renderFailures();
    renderFilter();
    renderPipeline();
    renderDetails();
    renderTimeline();
    main.dataset.updated = String(Date.now());
  }

  // Member events redraw once per frame: a stream's backlog can hold thousands of them.
  let renderQueued = false;
  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => {
      renderQueued = false;
      if (!signal.aborted) renderRun();
    });
  }

  /**
   * Reads the run again, and the run's gates when asked (they change only with gate events
   * and actions). A call while a read is under way asks for one more read after it, with the
   * gates if any caller wanted them.
   */
  let inFlight = null;
  let again = null;
  async function refresh({ gates = true } = {}) {
    if (inFlight) {
      again = { gates: gates || !!again?.gates };
      return inFlight;
    }
    inFlight = (async () => {
      const replay = [];
      view.replay = replay;
      try {
        const [run, gateList] = await Promise.all([
          api(runPath, { signal }),
          gates ? listAll(`${base}/gates`, { signal }) : null,
        ]);
        view.run = run;
        indexMembers();
        if (gateList) view.gates = new Map(gateList.filter((g) => g.properties?.target?.updateRunProperties?.name === runName).map((g) => [g.name, g]));
        // Member events that came while the run was read may be newer than what it shows.
        for (const event of replay) applyMember(event);
        renderRun();
        refreshForecast();
      } catch (e) {
        if (e.name !== 'AbortError' && !(e instanceof ApiError && e.status === 404)) notify(`Could not refresh: ${e.message}`, 'error');
        if (e instanceof ApiError && e.status === 404) throw e;
      } finally {
        view.replay = null;
        inFlight = null;
      }
      if (again && !signal.aborted) {
        const next = again;
        again = null;
        await refresh(next);
      }
    })();
    return inFlight;
  }

  let debounce = null;
  let debounceGates = false;
  function scheduleRefresh(gates) {
    debounceGates = debounceGates || gates;
    if (debounce) return;
    debounce = setTimeout(() => {
      debounce = null;
      const withGates = debounceGates;
      debounceGates = false;
      refresh({ gates: withGates });
    }, DEBOUNCE_MS);
  }

  // An evaluation changes a member's, group's or stage's list of evaluations, which only the
  // run's status carries in full: read it again, but not for each of them (a soak evaluates
  // every member in it every interval), and less often the larger the run.
  let checksRead = null;
  function scheduleChecksRead() {
    if (checksRead) return;
    checksRead = setTimeout(() => {
      checksRead = null;
      scheduleRefresh(false);
    }, Math.max(CHECKS_READ_MS, view.members.size * CHECKS_READ_MS_PER_MEMBER));
  }

  /** What an event changes on the page, beyond the log. */
  function onRunEvent(event) {
    if (event.type === 'HealthCheckEvaluated') {
      scheduleChecksRead();
    } else if (MEMBER_EVENTS[event.type]) {
      view.replay?.push(event);
      if (applyMember(event)) scheduleRender();
    } else if (event.type.startsWith('Gate')) {
      scheduleRefresh(true);
    } else if (event.type !== 'ActionRejected' && event.type !== 'Unparsed') {
      // A stage, group, wait or the run itself: its state, counts, messages, what comes next.
      scheduleRefresh(false);
    }
  }

  function showLive() {
    const s = TERMINAL.has(runState()) ? 'ended' : streamState;
    const words = { live: '● live', closed: 'not live', ended: 'ended', connecting: 'connecting…' };
    live.textContent = words[s] || 'reconnecting…';
    live.dataset.state = s;
  }

  await refresh();
  if (!view.run) throw new Error(`update run ${runName} could not be read`);
  renderEvents();
  let eventsQueued = false;
  streamEvents(`${runPath}/events`, {
    signal,
    onEvent: (event, id) => {
      event.id = id;
      view.events.push(event);
      if (view.events.length > MAX_EVENTS * 2) view.events.splice(0, view.events.length - MAX_EVENTS);
      // A stream's backlog can hold thousands of events: draw the log once per frame.
      if (!eventsQueued) {
        eventsQueued = true;
        requestAnimationFrame(() => { eventsQueued = false; renderEvents(); });
      }
      onRunEvent(event);
    },
    // A reconnected stream resumes after the last event it delivered (Last-Event-ID): the log
    // is kept as it is, and continues.
    onState: (s) => {
      streamState = s;
      showLive();
    },
  });
  const poll = setInterval(() => refresh(), POLL_MS);
  const ticker = setInterval(tick, 1000);
  return () => {
    clearInterval(poll);
    clearInterval(ticker);
    clearTimeout(debounce);
    clearTimeout(checksRead);
  };
}

// The dashboard in a real browser: Debian's headless Chromium driven by playwright-core, against
// `flotilla demo` (60 simulated clusters, a canary stage, a wait, an approval gate, production).
// The tests run in order on one demo: a run moving live, the fleet page (with the demo's coming
// freeze and its budget's partitions), the link with a token the demo prints, a dropped event
// stream that resumes, a reader who cannot approve (neither on the page nor through the API), an
// approver who approves the gate from the page and sees production start, the budget's
// partitions filling up, the fleets page, the failed members and the filter by state, an 800 px
// wide window, and a large fleet; then, on small fleets of their own, health checks the server
// evaluates for real against stand-ins served here, a freeze and a budget that hold members,
// and a chained run whose members show their hops. Screenshots go to target/browser-artifacts/.
//
// Environment: FLOTILLA_BIN (the binary), CHROMIUM (default /usr/bin/chromium),
// ARTIFACTS (default ../../target/browser-artifacts).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const here = new URL('.', import.meta.url).pathname;
const BIN = process.env.FLOTILLA_BIN || resolve(here, '../../target/release/flotilla');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = process.env.ARTIFACTS || resolve(here, '../../target/browser-artifacts');
// Simulated seconds per real second: a member's upgrade takes about ten seconds, so the canary
// stage is still running when the page first loads and its tiles can be seen changing.
const TIME_SCALE = '60';

let demo;
let demoLog = '';
let workdir;
let browser;
let base;
let adminToken;
let approverToken;
// The run the demo's auto-upgrade profile starts when the simulated feed publishes 1.31.2.
let runName;

function waitForLine(pattern, deadlineMs) {
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error(`the demo printed no ${pattern} within ${deadlineMs} ms:\n${demoLog}`)), deadlineMs);
    const check = () => {
      const match = demoLog.match(pattern);
      if (match) {
        clearTimeout(timer);
        resolvePromise(match);
      }
    };
    demo.stdout.on('data', check);
    demo.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the demo exited with ${code}:\n${demoLog}`));
    });
    check();
  });
}

async function apiCall(path, tokenValue, { method = 'GET', body } = {}) {
  const response = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${tokenValue}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

async function newPage(name) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    // A run that ends between the page's read of it and its forecast request is answered 409
    // (API.md: a forecast is for a run that has not ended), which the page expects and handles
    // by showing no forecast; Chromium logs the status all the same. Anything else counts.
    if (/status of 409/.test(m.text()) && m.location().url.endsWith('/forecast')) return;
    errors.push(`${m.text()} (${m.location().url})`);
  });
  page.errors = errors;
  page.shot = async (label, options = {}) => {
    await page.screenshot({ path: join(ARTIFACTS, `${name}-${label}.png`), fullPage: true, ...options });
  };
  return page;
}

/** Polls fn until it returns a truthy value; fails with `what` after the deadline. */
async function eventually(what, fn, deadlineMs = 30000) {
  const end = Date.now() + deadlineMs;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out after ${deadlineMs} ms waiting for ${what} (last: ${JSON.stringify(last)})`);
}

/**
 * The boxes of the elements the selectors name, measured together at one instant. The run page
 * redraws its pipeline when the run changes, so a locator's boundingBox can race a redraw (the
 * element it found is gone by the time it is measured); this waits until every selector names
 * an element of the page as drawn and measures them in the same task.
 */
async function boxesOf(page, selectors) {
  return eventually(`the boxes of ${selectors.join(', ')}`, () => page.evaluate((sels) => {
    const boxes = sels.map((s) => {
      const e = document.querySelector(s);
      if (!e || !e.checkVisibility()) return null;
      const r = e.getBoundingClientRect();
      return { x: r.x, y: r.y, width: r.width, height: r.height };
    });
    return boxes.every(Boolean) ? boxes : null;
  }, selectors));
}

/**
 * Waits until `list` has not grown for `ms` (at most `deadlineMs` in all: a page that keeps
 * asking is measured as it is by whatever follows).
 */
async function quiet(list, ms = 2000, deadlineMs = 15000) {
  const end = Date.now() + deadlineMs;
  let length = list.length;
  let since = Date.now();
  while (Date.now() < end && Date.now() - since < ms) {
    await new Promise((r) => setTimeout(r, 100));
    if (list.length !== length) {
      length = list.length;
      since = Date.now();
    }
  }
}

/** The run page of the demo's run, signed in by the link with a token. */
const runLink = (tokenValue) => `${base}/#/fleets/demo/runs/${runName}?token=${tokenValue}`;

/** The tiles shown (not filtered out) and their states, read in one go. */
const visibleTiles = (page) => page.$$eval('#pipeline .tile[data-member]', (tiles) => tiles.filter((t) => t.checkVisibility()).map((t) => [t.dataset.member, t.dataset.state]));

const tileStates = (page) => page.$$eval('#pipeline .tile[data-member]', (tiles) => Object.fromEntries(tiles.map((t) => [t.dataset.member, t.dataset.state])));

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  workdir = mkdtempSync(join(tmpdir(), 'flotilla-browser-'));
  demo = spawn(BIN, ['demo', '--listen', '127.0.0.1:0', '--database', join(workdir, 'flotilla.db'), '--time-scale', TIME_SCALE], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG || 'warn' },
  });
  demo.stdout.setEncoding('utf8');
  demo.stderr.setEncoding('utf8');
  demo.stdout.on('data', (d) => { demoLog += d; });
  demo.stderr.on('data', (d) => { demoLog += d; });
  [, base] = await waitForLine(/dashboard:\s+(http:\/\/127\.0\.0\.1:\d+)\//, 60000);
  [, adminToken] = await waitForLine(/admin token:\s+(flt_\S+)/, 5000);
  [, approverToken] = await waitForLine(/approver token:\s+(flt_\S+)/, 5000);
  [, runName] = await waitForLine(/watch it live:\s+http:\/\/127\.0\.0\.1:\d+\/#\/fleets\/demo\/runs\/(\S+)/, 60000);
  // launch() gives Chromium a fresh user-data-dir of its own (a new temporary profile each
  // run; Playwright refuses a --user-data-dir argument), so nothing carries over between runs.
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
  if (demo && demo.exitCode === null) {
    demo.kill('SIGTERM');
    await new Promise((r) => { demo.once('exit', r); setTimeout(r, 5000); });
  }
  writeFileSync(join(ARTIFACTS, 'demo.log'), demoLog);
  if (workdir) rmSync(workdir, { recursive: true, force: true });
});

// First, while the demo's canary stage is still running (its two members take about 23 s at
// this time scale, from when the run starts): the tiles can only be seen changing before then.
test('the run page shows tiles changing state live, without a reload', async () => {
  const page = await newPage('live');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.waitForURL(/#\/fleets\/demo$/);
  await page.goto(`${base}/#/fleets/demo/runs/${runName}`);
  await page.locator('#pipeline .tile[data-member]').first().waitFor();
  await eventually('the event stream to be live', async () => (await page.locator('#live').getAttribute('data-state')) === 'live');
  await page.evaluate(() => { window.notReloaded = true; });
  const first = await tileStates(page);
  assert.equal(Object.keys(first).length, 60, 'a tile per member');
  await page.shot('before');
  const changed = await eventually('a tile to change state', async () => {
    const now = await tileStates(page);
    const moved = Object.keys(first).filter((m) => now[m] !== first[m]);
    return moved.length ? { moved, now } : null;
  }, 60000);
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  // The canary members move first: at least one of them changed, and they end Completed.
  assert.ok(changed.moved.some((m) => m === 'east-store-01' || m === 'east-store-02'), `moved: ${changed.moved}`);
  await eventually('both canary members Completed', async () => {
    const now = await tileStates(page);
    return now['east-store-01'] === 'Completed' && now['east-store-02'] === 'Completed';
  }, 60000);
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  assert.ok((await page.locator('#events li.event').count()) >= 4, 'the event log fills from the stream');
  const tile = page.locator('.tile[data-member="east-store-01"]');
  assert.match(await tile.getAttribute('aria-label'), /east-store-01: Completed/);
  await tile.click();
  assert.match(await page.locator('#details').innerText(), /east-store-01[\s\S]*Completed[\s\S]*canary \/ canary/);
  await page.shot('canary-done');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the page is served with a strict content security policy and asks for a token', async () => {
  const response = await fetch(`${base}/`);
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/html/);
  assert.match(response.headers.get('content-security-policy'), /script-src 'self'/);
  const page = await newPage('signin');
  await page.goto(`${base}/`);
  await page.getByLabel('Bearer token').waitFor();
  await page.getByLabel('Bearer token').fill('flt_not_a_real_token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByText('That token was not accepted.').waitFor({ timeout: 10000 });
  await page.shot('rejected');
  assert.deepEqual(page.errors.filter((e) => !e.includes('401')), []);
  await page.context().close();
});

test('the fleet page shows the demo fleet: 60 members with group, region, version, windows and run', async () => {
  const page = await newPage('fleet');
  await page.goto(`${base}/`);
  await page.getByLabel('Bearer token').fill(approverToken);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(/#\/fleets\/demo$/);
  await eventually('60 member rows', async () => (await page.locator('#members tbody tr').count()) === 60);
  const row = page.locator('#members tbody tr[data-member="east-store-03"]');
  const cells = await row.locator('td').allInnerTexts();
  assert.equal(cells[0], 'prod-eastus', 'group');
  assert.match(cells[1], /env=prod/, 'labels');
  assert.equal(cells[2], 'eastus', 'region');
  assert.match(cells[3], /^1\.3[01]\.\d+$/, 'Kubernetes version');
  assert.match(cells[4], /system: AKSUbuntu-2204gen2containerd-/, 'node images');
  assert.match(cells[5], /Kubernetes: (opens|open)/, 'the maintenance window with its next opening');
  assert.ok(cells[6].includes(runName), `the run it is in: ${cells[6]}`);
  // The demo's fleet rules (SEMANTICS §12): a freeze coming in a few days, none in force...
  const freeze = page.locator('#freezes li[data-freeze="retail-peak"]');
  assert.equal(await freeze.getAttribute('data-state'), 'coming');
  assert.equal(await page.locator('#freezes li[data-state="active"]').count(), 0, 'no freeze in force');
  assert.match(await freeze.innerText(), /^Coming retail-peak — retail peak weekend\n.+ → .+ \(in [23]d \d+h\)\nholds minor upgrades of members with env=prod$/);
  // ...and a budget of a fifth of each region's prod stores, a partition per region with its
  // resolved limit, its members and how many are in flight (the canary's are not covered).
  const budget = page.locator('#budgets li[data-budget="prod-per-region"]');
  assert.match(await budget.locator('div').first().innerText(), /^prod-per-region at most 20% in flight per region, of members with env=prod$/);
  const partitions = await budget.locator('li.partition').evaluateAll((items) => items.map((li) => ({ ...li.dataset, text: li.querySelector('.counts').innerText, label: li.querySelector('.partition-value').innerText })));
  assert.deepEqual(partitions.map((p) => [p.value, p.label, p.max, p.members]).sort(), [['eastus', 'eastus', '4', '22'], ['southeastasia', 'southeastasia', '3', '16'], ['westeurope', 'westeurope', '4', '20']]);
  for (const p of partitions) {
    assert.ok(Number(p.disrupted) <= Number(p.max), JSON.stringify(p));
    assert.equal(p.text, `${p.disrupted} / ${p.max} in flight, ${p.members} members`);
  }
  assert.match(await page.locator('#me').innerText(), /demo-approver \(approver\)/);
  // The token stays out of the address bar and in session storage only.
  assert.ok(!page.url().includes('flt_'));
  assert.equal(await page.evaluate(() => sessionStorage.getItem('flotilla.token')), approverToken);
  await page.locator('#member-filter').fill('westeurope');
  await eventually('the filter to leave 20 rows', async () => (await page.locator('#members tbody tr:not([hidden])').count()) === 20);
  await page.locator('#member-filter').fill('');
  await page.shot('members');
  await page.getByRole('link', { name: 'Runs', exact: true }).click();
  await page.locator(`#runs tbody tr[data-run="${runName}"]`).waitFor();
  // Running, or Pending at the approval gate once the canary is done.
  assert.match(await page.locator(`#runs tbody tr[data-run="${runName}"]`).innerText(), /(Running|Pending)[\s\S]*Full · Kubernetes 1\.31\.2[\s\S]*\/ 60/);
  await page.shot('runs');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the demo prints a link that signs in and opens its run; the token leaves the address bar', async () => {
  const [, link] = await waitForLine(/or signed in:\s+(http:\/\/\S+)/, 5000);
  assert.equal(link, runLink(approverToken), 'the run page with the approver token');
  const page = await newPage('deeplink');
  await page.goto(link);
  await page.locator('#pipeline .tile[data-member]').first().waitFor();
  // Signed in, on the page the link named, and the token gone from the address (and history).
  assert.equal(new URL(page.url()).hash, `#/fleets/demo/runs/${runName}`);
  assert.ok(!page.url().includes('flt_'), page.url());
  assert.equal(await page.evaluate(() => sessionStorage.getItem('flotilla.token')), approverToken);
  assert.match(await page.locator('#me').innerText(), /demo-approver/);
  assert.ok((await page.locator('#run-header h1').innerText()).startsWith(runName));
  // Each tile names its member, in a compact tile.
  const tile = page.locator('.tile[data-member="east-store-01"]');
  assert.match(await tile.innerText(), /east-store-01/);
  const [box] = await boxesOf(page, ['.tile[data-member="east-store-01"]']);
  assert.ok(box.width < 160 && box.height <= 22, `a tile of ${box.width}×${box.height}px`);
  const names = await page.$$eval('#pipeline .tile[data-member]', (tiles) => tiles.filter((t) => !t.innerText.includes(t.dataset.member)).map((t) => t.dataset.member));
  assert.deepEqual(names, [], 'every tile shows its name');
  // Nothing failed yet: no failures list.
  assert.equal(await page.locator('#failures').isHidden(), true);
  // Another page of the same tab, by a link with a token: the runs page.
  await page.goto(`${base}/#/fleets/demo/runs?token=${approverToken}`);
  await page.locator(`#runs tbody tr[data-run="${runName}"]`).waitFor();
  assert.equal(new URL(page.url()).hash, '#/fleets/demo/runs');
  await page.shot('run');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

/** The run's event stream as the server sends it for `ms`, cut after its last whole event. */
async function streamPrefix(tokenValue, ms) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), ms);
  let text = '';
  try {
    const response = await fetch(`${base}/v1/fleets/demo/updateRuns/${runName}/events`, {
      headers: { Authorization: `Bearer ${tokenValue}`, Accept: 'text/event-stream' },
      signal: controller.signal,
    });
    const decoder = new TextDecoder();
    for await (const chunk of response.body) text += decoder.decode(chunk, { stream: true });
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  } finally {
    clearTimeout(timer);
  }
  return text.slice(0, text.lastIndexOf('\n\n') + 2);
}

test('a dropped event stream reconnects with Last-Event-ID and the event log carries on', async () => {
  // The page's first stream is the server's own first events, then it ends as a dropped
  // connection does; every later stream goes to the server.
  const served = await streamPrefix(approverToken, 1500);
  const servedIds = [...served.matchAll(/^id: ?(\d+)$/gm)].map((m) => m[1]);
  assert.ok(servedIds.length >= 4, `events to serve: ${served}`);
  const page = await newPage('resume');
  let dropped = false;
  await page.route(`**/updateRuns/${runName}/events`, async (route) => {
    if (dropped) return route.continue();
    dropped = true;
    return route.fulfill({ status: 200, headers: { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-store' }, body: served });
  });
  const streams = [];
  page.on('request', (r) => {
    if (r.url().endsWith(`/updateRuns/${runName}/events`)) streams.push(r.headers());
  });
  const ids = () => page.$$eval('#events li.event', (items) => items.map((li) => li.dataset.id));
  await page.goto(runLink(approverToken));
  await eventually('a second stream', async () => streams.length >= 2, 20000);
  await eventually('the event stream to be live again', async () => (await page.locator('#live').getAttribute('data-state')) === 'live', 20000);
  assert.equal(streams[0]['last-event-id'], undefined, 'the first stream starts from the beginning');
  assert.equal(streams[1]['last-event-id'], servedIds.at(-1), 'the second resumes after the last event the first delivered');
  // The log kept what the first stream brought, and holds every event of the run once: as
  // many as the run's log has, none twice.
  const all = await eventually('the log to hold every event', async () => {
    const [shown, log] = [await ids(), (await apiCall(`/v1/fleets/demo/updateRuns/${runName}/events`, approverToken)).body.value];
    return shown.length === log.length ? shown : null;
  }, 15000);
  assert.ok(servedIds.every((id) => all.includes(id)), 'the log was not cleared on reconnecting');
  assert.equal(new Set(all).size, all.length, `no event twice: ${all}`);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the run page forecasts the end of the run and of each stage, draws predicted bars, and says what production waits for', async () => {
  const page = await newPage('forecast');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.waitForURL(/#\/fleets\/demo$/);
  await page.goto(`${base}/#/fleets/demo/runs/${runName}`);
  // The end the run's status carries (the server's own forecast), shown as a time.
  const eta = page.locator('#run-eta');
  await eventually('the forecast end', async () => (await eta.locator('time').count()) > 0, 30000);
  // The run's status carries the server's own forecast (made at most once a minute per fleet).
  const forecast = await eventually('the forecast in the run\'s status', async () => (await apiCall(`/v1/fleets/demo/updateRuns/${runName}`, approverToken)).body.properties.status.forecast, 90000);
  assert.ok(forecast.completedTime >= forecast.computedAt, JSON.stringify(forecast));
  // The next stage is production, behind the canary's wait and the approval gate.
  const next = page.locator('#next-stage');
  await eventually('what the next stage waits for', async () => (await next.count()) > 0 && (await next.getAttribute('data-stage')) === 'production', 30000);
  const waits = (await next.getAttribute('data-waits')).split(',');
  assert.ok(waits.includes('Gate'), `production waits for its gate: ${waits}`);
  // A start time while it is still to come; once it has passed (the gate pending, assumed
  // approved at the forecast's now), it is waiting, never "starts" at a past time.
  const nextText = await next.innerText();
  assert.match(nextText, /production (starts .+|is waiting) — waits for .*approval of gate "Canary looks healthy: go to production"/);
  if ((await next.getAttribute('data-overdue')) === 'true') assert.doesNotMatch(nextText, / starts /, nextText);
  // Only what the run's state allows: a run waiting at its gate cannot be started again.
  assert.equal(await page.locator('#start-run').count(), 0, 'no start button on a running run');
  // Predicted bars behind the actual ones, and production's forecast end on its row.
  assert.ok((await page.locator('#timeline .bar.predicted').count()) >= 2, 'predicted bars on the timeline');
  assert.match(await page.locator('#timeline .eta[data-eta="s:production"]').innerText(), /ends ~/);
  await page.locator('#tl-title').scrollIntoViewIfNeeded();
  await page.shot('forecast');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a reader sees the pending gate without an approve button, and the API refuses the reader (403)', async () => {
  const created = await apiCall('/v1/tokens', adminToken, { method: 'POST', body: { role: 'reader', subject: 'demo-reader' } });
  assert.equal(created.status, 201);
  const readerToken = created.body.token;
  const page = await newPage('reader');
  await page.goto(`${base}/#token=${readerToken}`);
  await page.waitForURL(/#\/fleets\/demo$/);
  await page.goto(`${base}/#/fleets/demo/runs/${runName}`);
  const gate = page.locator('#pipeline li.checkpoint[data-gate]');
  await eventually('the production gate to be Pending', async () => (await gate.getAttribute('data-state')) === 'Pending', 90000);
  await page.getByText('waiting for an approver').waitFor();
  // Issue #42: with the gate pending, the forecast end says it assumes the gate approved now,
  // the next stage says it waits for that gate alone and shows no start time that has passed,
  // and the 2-member canary group shows its real ceiling, not the stage's 50.
  const eta = page.locator('#run-eta');
  await eventually('the forecast end to name its assumption', async () => /if gate "Canary looks healthy: go to production" is approved now|overdue/.test(await eta.innerText()), 40000);
  const next = page.locator('#next-stage');
  await eventually('production to wait for its gate', async () => (await next.count()) > 0 && (await next.getAttribute('data-waits')) === 'Gate', 40000);
  const nextText = await next.innerText();
  assert.match(nextText, /waits for approval of gate "Canary looks healthy: go to production"/);
  assert.doesNotMatch(nextText, /wait after|maintenance window|stage canary/, `only what holds it: ${nextText}`);
  if ((await next.getAttribute('data-overdue')) === 'true') assert.doesNotMatch(nextText, / starts /, `no start in the past: ${nextText}`);
  const canaryLimits = await page.locator('#pipeline li.stage[data-stage="canary"] .limits').first().innerText();
  assert.match(canaryLimits, /\/ 2 at once/, `the canary's two members bound it: ${canaryLimits}`);
  assert.equal(await page.locator('button.approve').count(), 0, 'no approve button for a reader');
  assert.equal(await page.locator('#stop-run').count(), 0, 'no stop button for a reader');
  assert.equal(await page.getByRole('button', { name: /skip/i }).count(), 0, 'no skip button for a reader');
  assert.match(await page.locator('#me').innerText(), /demo-reader \(reader\)/);
  await page.shot('pending-gate');
  const gateId = await gate.getAttribute('data-gate');
  const refused = await apiCall(`/v1/fleets/demo/gates/${gateId}`, readerToken, { method: 'PATCH', body: { properties: { state: 'Completed' } } });
  assert.equal(refused.status, 403, JSON.stringify(refused.body));
  const still = await apiCall(`/v1/fleets/demo/gates/${gateId}`, readerToken);
  assert.equal(still.body.properties.state, 'Pending', 'the refused approval changed nothing');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an approver approves the gate from the page, the approver is shown, and production starts', async () => {
  const page = await newPage('approve');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.waitForURL(/#\/fleets\/demo$/);
  await page.goto(`${base}/#/fleets/demo/runs/${runName}`);
  const approve = page.getByRole('button', { name: /^Approve gate: Canary looks healthy/ });
  await approve.waitFor({ timeout: 90000 });
  await page.evaluate(() => { window.notReloaded = true; });
  const production = page.locator('#pipeline li.stage[data-stage="production"]');
  assert.ok(['NotStarted', 'Pending'].includes(await production.getAttribute('data-state')), 'production waits at the gate');
  await page.shot('before');
  await approve.click();
  const gate = page.locator('#pipeline li.checkpoint[data-gate]');
  // Its state comes with the run, its approver with the gates: both drawn, in either order.
  await eventually('the gate Completed, approved by demo-approver', async () => (await gate.getAttribute('data-state')) === 'Completed' && /approved by demo-approver/.test(await gate.innerText()), 15000);
  await eventually('the production stage to run', async () => (await production.getAttribute('data-state')) === 'Running', 15000);
  await eventually('a production member to start', async () => {
    const states = await production.locator('.tile[data-member]').evaluateAll((tiles) => tiles.map((t) => t.dataset.state));
    return states.some((s) => s === 'Running' || s === 'Completed' || s === 'Pending');
  }, 30000);
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  const gateId = await gate.getAttribute('data-gate');
  const recorded = await apiCall(`/v1/fleets/demo/gates/${gateId}`, adminToken);
  assert.equal(recorded.body.properties.approvedBy, 'demo-approver');
  await page.locator('#pipeline li.checkpoint[data-gate] button.gate-name').click();
  assert.match(await page.locator('#details').innerText(), /Approved by\s+demo-approver/);
  await page.shot('production-running');
  await page.setViewportSize({ width: 2560, height: 1200 });
  await page.shot('wide');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('while production runs, the fleet page shows the budget\'s partitions filling up, refreshed in place', async () => {
  const page = await newPage('budget');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.waitForURL(/#\/fleets\/demo$/);
  await page.evaluate(() => { window.notReloaded = true; });
  const partitions = () => page.$$eval('#budgets li[data-budget="prod-per-region"] li.partition', (items) => items.map((li) => ({
    value: li.dataset.value,
    disrupted: Number(li.dataset.disrupted),
    max: Number(li.dataset.max),
    width: li.querySelector('.budgetbar > span').getBoundingClientRect().width,
    bar: li.querySelector('.budgetbar').getBoundingClientRect().width,
    text: li.querySelector('.counts').innerText,
  })));
  // Production members in flight fill their region's partition (a region's group upgrades at
  // most 3 at once, within the budget: it never holds the demo's run).
  const filling = await eventually('a partition with members in flight', async () => {
    const now = await partitions();
    return now.some((p) => p.disrupted > 0) ? now : null;
  }, 40000);
  for (const p of filling) {
    assert.ok(p.disrupted <= p.max, `${p.value}: ${p.text}`);
    assert.match(p.text, new RegExp(`^${p.disrupted} / ${p.max} in flight, \\d+ members$`));
    // The bar is as full as the partition: disrupted of maxUnavailable.
    assert.ok(Math.abs(p.width - (p.bar * p.disrupted) / p.max) <= 1, `${p.value}: a bar ${p.width}px of ${p.bar}px for ${p.text}`);
  }
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  // The demo's budget never holds its run: no member waits for it.
  const run = (await apiCall(`/v1/fleets/demo/updateRuns/${runName}`, approverToken)).body;
  const held = run.properties.status.stages.flatMap((st) => st.groups.flatMap((g) => g.members)).filter((m) => m.waitingFor?.kind === 'Budget');
  assert.deepEqual(held.map((m) => m.name), [], 'no member held by the demo\'s budget');
  await page.locator('#budgets').scrollIntoViewIfNeeded();
  await page.shot('filling');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('member events update the tiles in place: no re-read of the run or the gates for them', async () => {
  const page = await newPage('inplace');
  const reads = [];
  page.on('request', (r) => {
    const path = new URL(r.url()).pathname;
    if (r.method() === 'GET' && path === `/v1/fleets/demo/updateRuns/${runName}`) reads.push('run');
    if (r.method() === 'GET' && path === '/v1/fleets/demo/gates') reads.push('gates');
  });
  const logged = () => page.$$eval('#events li.event', (items) => items.map((li) => ({ id: li.dataset.id, type: li.className.replace(/^event t-/, ''), time: li.querySelector('time').getAttribute('datetime') })));
  // Member events at moments at least two seconds apart (event times are whole seconds): each
  // such moment would have cost a read of the run, were member events to ask for one.
  const moments = (events) => {
    let count = 0;
    let last = -Infinity;
    for (const t of events.map((e) => Date.parse(e.time)).sort((a, b) => a - b)) {
      if (t - last >= 2000) {
        count += 1;
        last = t;
      }
    }
    return count;
  };
  await page.goto(runLink(approverToken));
  await eventually('the event stream to be live', async () => (await page.locator('#live').getAttribute('data-state')) === 'live');
  // The backlog's gate and stage events asked for reads (a debounce later, and slower on a
  // loaded machine): once no read has come for two seconds, count from there.
  await quiet(reads);
  const seen = new Set((await logged()).map((e) => e.id));
  reads.length = 0;
  await eventually('member events from production at three moments', async () => {
    const fresh = (await logged()).filter((e) => !seen.has(e.id));
    return moments(fresh.filter((e) => e.type.startsWith('Member'))) >= 3 ? fresh : null;
  }, 60000);
  // A read the last moment asked for comes a debounce later; then count (soon: the safety poll
  // every 30 s is allowed once in the window).
  await quiet(reads, 1500, 5000);
  const all = (await logged()).filter((e) => !seen.has(e.id));
  const others = all.filter((e) => !e.type.startsWith('Member'));
  const gateEvents = others.filter((e) => e.type.startsWith('Gate'));
  // At most one read more than the events that change more than a member: the safety poll.
  const runReads = reads.filter((r) => r === 'run').length;
  const gateReads = reads.filter((r) => r === 'gates').length;
  assert.ok(runReads <= others.length + 1, `${runReads} reads of the run for ${all.length} events: ${JSON.stringify(all)}`);
  assert.ok(gateReads <= gateEvents.length + 1, `${gateReads} reads of the gates for ${gateEvents.length} gate events`);
  // What the events drew is what the server says: every tile, and the failure count.
  await eventually('the tiles to match the run', async () => {
    const run = (await apiCall(`/v1/fleets/demo/updateRuns/${runName}`, approverToken)).body;
    const states = {};
    for (const stage of run.properties.status.stages) for (const group of stage.groups) for (const m of group.members) states[m.name] = m.status.state;
    const shown = await tileStates(page);
    const failures = await page.locator('#run-failures').innerText();
    return JSON.stringify(shown) === JSON.stringify(states) && failures.startsWith(String(run.properties.status.failureCount));
  }, 20000);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the fleets page shows each fleet with its driver, member count and active runs', async () => {
  // A second fleet, so that the page lists the fleets instead of going to the only one.
  const clusters = { '/c/spare-1': { region: 'eastus', kubernetesVersion: '1.30.5', nodePools: [] }, '/c/spare-2': { region: 'eastus', kubernetesVersion: '1.30.5', nodePools: [] } };
  const driver = { type: 'sim', timeScale: 1, catalog: { eastus: { kubernetes: [{ version: '1.30.5' }] } }, clusters };
  assert.equal((await apiCall('/v1/fleets/spare', adminToken, { method: 'PUT', body: { properties: { driver } } })).status, 201);
  for (const i of [1, 2]) {
    assert.ok((await apiCall(`/v1/fleets/spare/members/s${i}`, adminToken, { method: 'PUT', body: { properties: { clusterResourceId: `/c/spare-${i}` } } })).status < 300);
  }
  const page = await newPage('fleets');
  await page.goto(`${base}/#token=${approverToken}`);
  const demoRow = page.locator('#fleets tbody tr[data-fleet="demo"]');
  await demoRow.waitFor();
  assert.equal(new URL(page.url()).hash, '#/', 'no redirect with two fleets');
  await eventually('the member counts', async () => (await demoRow.locator('td[data-members]').getAttribute('data-members')) === '60');
  const cells = await demoRow.locator('td').allInnerTexts();
  assert.equal(cells[0], 'sim', 'driver');
  assert.equal(cells[1], '60', 'members');
  await eventually('the demo\'s active run', async () => (await demoRow.locator(`li[data-run="${runName}"]`).count()) === 1);
  assert.match(await demoRow.locator(`li[data-run="${runName}"]`).innerText(), /Running|Pending/);
  const spareRow = page.locator('#fleets tbody tr[data-fleet="spare"]');
  await eventually('the spare fleet\'s count', async () => (await spareRow.locator('td[data-members]').getAttribute('data-members')) === '2');
  assert.match(await spareRow.innerText(), /none/);
  await page.shot('list');
  await demoRow.getByRole('link', { name: runName }).click();
  await page.waitForURL(new RegExp(`#/fleets/demo/runs/${runName}$`));
  await page.locator('#pipeline .tile[data-member]').first().waitFor();
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the run page lists the failed members with their errors, and clicking one selects it', async () => {
  const page = await newPage('failures');
  await page.goto(runLink(approverToken));
  // Two demo stores fail their upgrade (a node drain that times out) once production runs.
  await page.locator('#failures-list li').first().waitFor({ timeout: 150000 });
  const name = await page.locator('#failures-list li').first().getAttribute('data-member');
  assert.ok(['west-store-11', 'sout-store-05'].includes(name), name);
  // That member's entry by name: the list is redrawn in stage and group order, so the other
  // store failing meanwhile may come first.
  const first = page.locator(`#failures-list li[data-member="${name}"]`);
  assert.match(await first.innerText(), new RegExp(`^${name} production / prod-\\w+ — .*node drain timed out`));
  assert.match(await page.locator('#failures h2').innerText(), /^Failures \(\d\)$/);
  assert.equal(await page.locator(`.tile[data-member="${name}"]`).getAttribute('data-state'), 'Failed');
  assert.notEqual(await page.locator('#run-failures').innerText(), '0');
  await first.getByRole('button', { name }).click();
  assert.match(await page.locator('#details').innerText(), new RegExp(`${name}[\\s\\S]*Failed[\\s\\S]*production / prod-[\\s\\S]*node drain timed out`));
  assert.equal(await page.locator(`.tile[data-member="${name}"]`).getAttribute('aria-pressed'), 'true');
  await page.shot('failed');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the filter by state shows only the tiles of the state chosen, with counts', async () => {
  const page = await newPage('filter');
  await page.goto(runLink(approverToken));
  await page.locator('#pipeline .tile[data-member]').first().waitFor();
  const choices = await page.$$eval('#state-filter [data-filter]', (labels) => labels.map((l) => l.dataset.filter));
  for (const f of ['All', 'Running', 'Pending', 'Failed', 'Completed', 'Skipped', 'NotStarted']) assert.ok(choices.includes(f), `${f} in ${choices}`);
  assert.equal(await page.locator('#state-filter [data-filter="All"]').getAttribute('data-count'), '60');
  assert.equal(await page.getByRole('radio', { name: /^All 60$/ }).isChecked(), true);
  for (const state of ['Completed', 'Skipped', 'Failed']) {
    await page.locator(`#state-filter [data-filter="${state}"]`).click();
    assert.equal(await page.locator(`#state-filter input[value="${state}"]`).isChecked(), true);
    // The tiles and the count, read together (members move while the test reads).
    const { shown, count } = await page.evaluate((s) => ({
      shown: [...document.querySelectorAll('#pipeline .tile[data-member]')].filter((t) => t.checkVisibility()).map((t) => t.dataset.state),
      count: Number(document.querySelector(`#state-filter [data-filter="${s}"]`).dataset.count),
    }), state);
    assert.ok(shown.length > 0, `some ${state} members (the canary's, the skipped stores, the failed ones)`);
    assert.ok(shown.every((s) => s === state), `only ${state} tiles: ${shown}`);
    assert.equal(shown.length, count, `${state}: as many tiles as the count says`);
    if (state === 'Skipped') await page.shot('skipped');
  }
  await page.locator('#state-filter [data-filter="All"]').click();
  assert.equal((await visibleTiles(page)).length, 60);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('at 800 px wide the stages stack, the details come below, and nothing scrolls sideways', async () => {
  const page = await newPage('narrow');
  await page.setViewportSize({ width: 800, height: 900 });
  const noSidewaysScroll = async (what) => {
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 800, `${what}: the page is ${width}px wide`);
  };
  await page.goto(runLink(approverToken));
  const production = page.locator('#pipeline li.stage[data-stage="production"]');
  await production.locator('.tile[data-member]').first().waitFor();
  await noSidewaysScroll('the run');
  const stages = ['#pipeline li.stage[data-stage="production"]', '#pipeline li.stage[data-stage="canary"]'];
  const [box, canary] = await boxesOf(page, stages);
  assert.ok(box.x >= 0 && box.x + box.width <= 800, `production spans ${box.x}..${box.x + box.width}px`);
  assert.ok(canary.y + canary.height <= box.y, 'canary above production');
  await page.shot('run');
  await page.locator('.tile[data-member="east-store-01"]').click();
  // The details come into view, below the pipeline (once drawn).
  await page.locator('#details').waitFor({ state: 'visible' });
  const [details, after] = await boxesOf(page, ['#details', stages[0]]);
  assert.ok(details.y >= after.y + after.height, 'the details below the pipeline');
  assert.ok(details.y < 900, 'the details in view');
  assert.ok(details.x + details.width <= 800);
  await page.shot('details', { fullPage: false });
  for (const [hash, ready] of [['#/', '#fleets tbody tr'], ['#/fleets/demo', '#members tbody tr'], ['#/fleets/demo/runs', '#runs tbody tr']]) {
    await page.goto(`${base}/${hash}`);
    await page.locator(ready).first().waitFor();
    await noSidewaysScroll(hash);
  }
  await page.goto(`${base}/#/`);
  await page.locator('#fleets td[data-members="60"]').waitFor();
  await page.shot('fleets');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a stage of 50 groups and a group of 1,000 members collapse into summaries and fit the screen', async () => {
  // A second fleet beside the demo's, 1,000 members in 50 groups of 20: run "wide" has one
  // stage of the 50 groups; run "deep" has no strategy, so one stage with one group of 1,000.
  const clusters = {};
  for (let i = 0; i < 1000; i++) {
    clusters[`/c/big-${i}`] = { region: 'eastus', kubernetesVersion: '1.30.5', nodePools: [] };
  }
  const driver = { type: 'sim', timeScale: 1, catalog: { eastus: { kubernetes: [{ version: '1.30.5' }, { version: '1.31.1' }] } }, clusters };
  assert.equal((await apiCall('/v1/fleets/big', adminToken, { method: 'PUT', body: { properties: { driver } } })).status, 201);
  const puts = [];
  for (let i = 0; i < 1000; i++) {
    const body = { properties: { clusterResourceId: `/c/big-${i}`, group: `g${String(i % 50).padStart(2, '0')}` } };
    puts.push(apiCall(`/v1/fleets/big/members/m${String(i).padStart(4, '0')}`, adminToken, { method: 'PUT', body }));
    if (puts.length === 50) assert.ok((await Promise.all(puts.splice(0))).every((r) => r.status < 300));
  }
  assert.ok((await Promise.all(puts)).every((r) => r.status < 300));
  const groups = Array.from({ length: 50 }, (_, g) => ({ name: `g${String(g).padStart(2, '0')}` }));
  const upgrade = { upgrade: { type: 'Full', kubernetesVersion: '1.31.1' } };
  for (const [name, properties] of [
    ['wide', { strategy: { stages: [{ name: 'wide', groups }] }, managedClusterUpdate: upgrade }],
    ['deep', { managedClusterUpdate: upgrade }],
  ]) {
    const run = await apiCall(`/v1/fleets/big/updateRuns/${name}`, adminToken, { method: 'PUT', body: { properties } });
    assert.ok(run.status < 300, JSON.stringify(run.body));
  }

  const page = await newPage('large');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  const noSidewaysScroll = async (what) => {
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `${what}: the page is ${overflow}px wider than the window`);
  };
  for (const width of [1366, 2560]) {
    await page.setViewportSize({ width, height: 900 });
    await page.goto(`${base}/#/fleets/big/runs/wide`);
    const wide = page.locator('#pipeline li.stage[data-stage="wide"]');
    await wide.waitFor();
    assert.equal(await wide.locator('article.group').count(), 50);
    assert.equal(await wide.locator('.tile').count(), 0, 'a stage of 50 groups shows summaries, not tiles');
    assert.equal(await wide.locator('article.group .statebar').count(), 50);
    assert.match(await wide.locator('article.group[data-group="g07"] .statebar-wrap').innerText(), /20 not started/);
    await noSidewaysScroll(`wide at ${width}px`);
    const height = await wide.evaluate((el) => el.getBoundingClientRect().height);
    assert.ok(height < 1600, `50 collapsed groups take ${height}px`);
    await page.shot(`wide-${width}`);
    await page.goto(`${base}/#/fleets/big/runs/deep`);
    const deep = page.locator('#pipeline li.stage[data-stage="default"]');
    await deep.waitFor();
    assert.equal(await deep.locator('.tile').count(), 0, 'a group of 1,000 starts collapsed');
    assert.match(await deep.locator('article.group .counts.done').innerText(), /^0\/1000$/);
    await deep.getByRole('button', { name: 'Expand group default (1000 members)' }).click();
    await eventually('1,000 tiles', async () => (await deep.locator('.tile').count()) === 1000);
    await noSidewaysScroll(`deep at ${width}px`);
    const tilesHeight = await deep.locator('ul.tiles').evaluate((el) => el.getBoundingClientRect().height);
    assert.ok(tilesHeight < 800, `1,000 tiles take ${tilesHeight}px`);
    await page.shot(`deep-${width}`);
  }
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

// ---------------------------------------------------------------------------------------------
// Health checks (SEMANTICS §10), evaluated for real by the server: a stand-in health endpoint
// served here answers 200 for every member but c-bad, whose connection it cuts (the evaluation
// cannot be made), and a stand-in Prometheus whose every query finds 0.5; an unreachable
// Prometheus is a port nobody listens on.

let healthz;
/** The stand-in health endpoint's base URL, started once. */
async function healthEndpoint() {
  if (!healthz) {
    healthz = createServer((request, response) => {
      const path = new URL(request.url, 'http://healthz').pathname;
      if (path === '/api/v1/query') {
        response.setHeader('Content-Type', 'application/json');
        response.end(JSON.stringify({ status: 'success', data: { resultType: 'vector', result: [{ metric: {}, value: [Date.now() / 1000, '0.5'] }] } }));
        return;
      }
      if (path.endsWith('/c-bad')) {
        request.socket.destroy();
        return;
      }
      response.end('ok');
    });
    await new Promise((r) => healthz.listen(0, '127.0.0.1', r));
  }
  return `http://127.0.0.1:${healthz.address().port}`;
}
after(() => healthz?.close());

/**
 * A fleet over the sim driver whose upgrades take a second (or `durationSeconds`), with members
 * name → group, and labels name → {key: value}.
 */
async function simFleet(fleet, members, { durationSeconds = 1, labels = {} } = {}) {
  const clusters = {};
  for (const name of Object.keys(members)) {
    clusters[`/c/${fleet}-${name}`] = { region: 'eastus', kubernetesVersion: '1.30.5', nodePools: [], sim: { durationSeconds } };
  }
  const driver = { type: 'sim', timeScale: 1, catalog: { eastus: { kubernetes: [{ version: '1.30.5' }, { version: '1.31.1' }] } }, clusters };
  assert.equal((await apiCall(`/v1/fleets/${fleet}`, adminToken, { method: 'PUT', body: { properties: { driver } } })).status, 201);
  for (const [name, group] of Object.entries(members)) {
    const put = await apiCall(`/v1/fleets/${fleet}/members/${name}`, adminToken, { method: 'PUT', body: { properties: { clusterResourceId: `/c/${fleet}-${name}`, group, labels: labels[name] } } });
    assert.ok(put.status < 300, JSON.stringify(put.body));
  }
}

/** Declares the check providers these tests name (SEMANTICS §10: an admin declares where
 * checks go): the stand-ins above, and a Prometheus nobody listens for. */
let providersDeclared;
async function declareProviders() {
  if (!providersDeclared) {
    const endpoint = await healthEndpoint();
    for (const [name, properties] of Object.entries({
      unreachable: { type: 'Prometheus', endpoint: 'http://127.0.0.1:9' },
      'stand-in-prom': { type: 'Prometheus', endpoint },
      healthz: { type: 'Http', baseUrl: endpoint },
    })) {
      const put = await apiCall(`/v1/checkProviders/${name}`, adminToken, { method: 'PUT', body: { properties } });
      assert.ok(put.status < 300, JSON.stringify(put.body));
    }
    providersDeclared = true;
  }
}

/** A HealthCheck gate whose Prometheus is unreachable: its evaluations cannot be made. */
const unreachableGate = (timeoutSeconds) => ({
  type: 'HealthCheck',
  displayName: 'fleet error rate',
  checks: [{ name: 'fleet-errors', provider: 'unreachable', query: 'max(flotilla_error_ratio)', condition: '< 0.05' }],
  soakSeconds: 1,
  intervalSeconds: 1,
  timeoutSeconds,
});

async function createAndStart(fleet, run, strategy) {
  await declareProviders();
  const properties = { strategy, managedClusterUpdate: { upgrade: { type: 'ControlPlaneOnly', kubernetesVersion: '1.31.1' } } };
  const created = await apiCall(`/v1/fleets/${fleet}/updateRuns/${run}`, adminToken, { method: 'PUT', body: { properties } });
  assert.ok(created.status < 300, JSON.stringify(created.body));
  const started = await apiCall(`/v1/fleets/${fleet}/updateRuns/${run}/start`, adminToken, { method: 'POST' });
  assert.ok(started.status < 300, JSON.stringify(started.body));
}

test('a HealthCheck gate that cannot be evaluated fails the run: the page shows the evaluations and says why the run stopped', async () => {
  await simFleet('health', { 'c-ok': 'canary', 'c-bad': 'canary', 'p-1': 'prod' });
  await createAndStart('health', 'gate-unreachable', {
    stages: [
      {
        name: 'canary',
        maxAllowedFailures: '1',
        groups: [{ name: 'canary', maxAllowedFailures: '1' }],
        memberHealthChecks: { checks: [{ name: 'healthz', provider: 'healthz', path: '/healthz/{member}' }], soakSeconds: 2, intervalSeconds: 1, unavailableAfterSeconds: 2 },
      },
      { name: 'prod', groups: [{ name: 'prod' }], beforeGates: [unreachableGate(3)] },
    ],
  });
  const page = await newPage('health-gate');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.goto(`${base}/#/fleets/health/runs/gate-unreachable`);
  const reason = page.locator('#run-reason');
  await reason.waitFor({ timeout: 60000 });
  assert.equal(await page.locator('#run-state .badge.s-Failed').count(), 1, 'the run Failed');
  // Why, in plain words: the gate, the check and what its last evaluation found; and the
  // engine's own words (the timeout).
  assert.match(await reason.locator('.reason-text').innerText(), /^Failed at stage prod: the HealthCheck gate 'fleet error rate' failed — check fleet-errors could not be evaluated: .+/);
  assert.match(await reason.locator('.reason-detail').innerText(), /the checks did not pass for 1 s within 3 s/);
  // The run has ended: the live dot is off.
  await eventually('the live mark to say the run ended', async () => (await page.locator('#live').getAttribute('data-state')) === 'ended');
  assert.doesNotMatch(await page.locator('#live').innerText(), /live/);
  // The gate, Failed, with its evaluations (none could be made) beside it.
  const gate = page.locator('#pipeline li.checkpoint[data-type="HealthCheck"]');
  assert.equal(await gate.getAttribute('data-state'), 'Failed');
  const evaluation = gate.locator('.check[data-check="fleet-errors"]').first();
  assert.equal(await evaluation.getAttribute('data-verdict'), 'unavailable');
  // What went wrong, without the URL (one may carry credentials or tokens).
  const finding = await evaluation.locator('.check-finding').innerText();
  assert.match(finding, /^could not be evaluated: .*Connection refused/);
  assert.doesNotMatch(finding, /127\.0\.0\.1:9/);
  assert.match(await evaluation.getAttribute('title'), /^check "fleet-errors" could not be evaluated: .*Connection refused/);
  assert.equal(await gate.locator('button.approve').count(), 0, 'a failed gate cannot be approved');
  // The member whose checks could not be made for 2 s failed (tolerated), and says why; the
  // other passed its soak. Each tile carries its checks' mark.
  const bad = page.locator('.tile[data-member="c-bad"]');
  assert.equal(await bad.getAttribute('data-state'), 'Failed');
  assert.equal(await bad.getAttribute('data-checks'), 'unavailable');
  assert.match(await bad.getAttribute('aria-label'), /c-bad: Failed\. check "healthz" could not be evaluated for 2 s: .*Checks could not be evaluated/);
  const ok = page.locator('.tile[data-member="c-ok"]');
  assert.equal(await ok.getAttribute('data-state'), 'Completed');
  assert.equal(await ok.getAttribute('data-checks'), 'pass');
  assert.match(await page.locator('#failures-list li[data-member="c-bad"]').innerText(), /^c-bad canary \/ canary — check "healthz" could not be evaluated for 2 s/);
  // A member's evaluations are in its details.
  await bad.click();
  const details = page.locator('#details');
  assert.match(await details.innerText(), /HealthCheckFailed: check "healthz" could not be evaluated for 2 s/);
  assert.equal(await details.locator('.check[data-check="healthz"]').first().getAttribute('data-verdict'), 'unavailable');
  await ok.click();
  assert.equal(await details.locator('.check[data-check="healthz"]').first().getAttribute('data-verdict'), 'pass');
  // The gate's resource says Failed too (the page and API clients read gates there).
  const resource = await apiCall(`/v1/fleets/health/gates/${await gate.getAttribute('data-gate')}`, approverToken);
  assert.equal(resource.body.properties.state, 'Failed', JSON.stringify(resource.body));
  // The reason's button shows the gate: its checks, timings and evaluations.
  await reason.getByRole('button', { name: 'Show what stopped the run' }).click();
  assert.match(await details.innerText(), /fleet error rate[\s\S]*HealthCheck[\s\S]*Failed[\s\S]*Fails after\s+3s[\s\S]*max\(flotilla_error_ratio\) < 0\.05/);
  // Each check's definition names the provider it goes through, never a URL.
  assert.match(await details.locator('.check-defs li[data-provider="unreachable"]').innerText(), /^fleet-errors \(Prometheus via unreachable\)/);
  assert.doesNotMatch(await details.innerText(), /127\.0\.0\.1:9/);
  assert.ok((await details.locator('.check[data-verdict="unavailable"]').count()) >= 1, 'the gate\'s evaluations in its details');
  // The event log has the evaluations and the gate's failure.
  assert.ok((await page.locator('#events li.t-HealthCheckEvaluated').count()) >= 2);
  assert.equal(await page.locator('#events li.t-GateFailed').count(), 1);
  await page.shot('failed');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an approver completes a pending HealthCheck gate by hand; a member in its soak reads Verifying', async () => {
  await simFleet('health-hand', { 'h-1': 'prod' });
  await createAndStart('health-hand', 'by-hand', {
    stages: [{
      name: 'prod',
      groups: [{ name: 'prod' }],
      beforeGates: [unreachableGate(600)],
      memberHealthChecks: { checks: [{ name: 'healthz', provider: 'healthz', path: '/healthz/{member}' }], soakSeconds: 6, intervalSeconds: 1 },
    }],
  });
  const page = await newPage('health-hand');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.goto(`${base}/#/fleets/health-hand/runs/by-hand`);
  const gate = page.locator('#pipeline li.checkpoint[data-type="HealthCheck"]');
  await eventually('the gate Pending with an evaluation', async () => (await gate.getAttribute('data-state')) === 'Pending' && (await gate.locator('.check[data-verdict="unavailable"]').count()) > 0, 30000);
  assert.equal(await page.locator('#run-reason').count(), 0, 'a run waiting at a gate has not stopped');
  await page.shot('pending');
  await page.getByRole('button', { name: 'Approve gate: fleet error rate' }).click();
  await eventually('the gate Completed by hand, approved by demo-approver', async () => (await gate.getAttribute('data-state')) === 'Completed' && /approved by demo-approver/.test(await gate.innerText()), 15000);
  // Upgraded, the member soaks: in flight, read as verifying.
  const tile = page.locator('.tile[data-member="h-1"]');
  // The tile and its stage's limits, read together as drawn (the page redraws as it goes).
  const verifying = await eventually('the member verifying', () => page.evaluate(() => {
    const t = document.querySelector('.tile[data-member="h-1"]');
    const limits = document.querySelector('#pipeline li.stage[data-stage="prod"] .limits');
    return t?.dataset.activity === 'verifying' ? { state: t.dataset.state, label: t.getAttribute('aria-label'), limits: limits?.innerText } : null;
  }), 20000);
  assert.equal(verifying.state, 'Running');
  assert.match(verifying.label, /^h-1: Verifying\. verifying: health checks until/);
  assert.match(verifying.limits, /1 \/ \d+ at once \(1 verifying\)/);
  await page.shot('verifying');
  await eventually('the member Completed after its soak', async () => (await tile.getAttribute('data-state')) === 'Completed', 30000);
  await eventually('its passing evaluations', async () => (await tile.getAttribute('data-checks')) === 'pass', 10000);
  await eventually('the run Completed', async () => (await page.locator('#run-state .badge.s-Completed').count()) === 1, 10000);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a group\'s HealthCheck after-gate that sees a bad value stops the run, and the page says which value broke which condition', async () => {
  await simFleet('health-value', { 'v-1': 'edge' });
  const gate = {
    type: 'HealthCheck',
    displayName: 'error budget',
    checks: [{ name: 'errors', provider: 'stand-in-prom', query: 'max(flotilla_error_ratio{group="{group}"})', condition: '< 0.05' }],
    soakSeconds: 5,
    intervalSeconds: 1,
  };
  await createAndStart('health-value', 'bad-value', { stages: [{ name: 'edge', groups: [{ name: 'edge', afterGates: [gate] }] }] });
  const page = await newPage('health-value');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.goto(`${base}/#/fleets/health-value/runs/bad-value`);
  const reason = page.locator('#run-reason');
  await reason.waitFor({ timeout: 60000 });
  assert.equal(await reason.locator('.reason-text-words').innerText(), "Failed at stage edge: the HealthCheck gate 'error budget' after group edge failed — check errors: value 0.5 does not meet condition < 0.05");
  // The gate, in its group's card, Failed, with the failing evaluation (once the page has
  // drawn the status that failed it).
  await page.locator('article.group[data-group="edge"][data-state="Failed"] .checkpoint[data-type="HealthCheck"][data-state="Failed"] .check[data-check="errors"][data-verdict="fail"]').first().waitFor();
  await page.locator('.tile[data-member="v-1"][data-state="Completed"]').waitFor();
  const checkpoint = page.locator('article.group[data-group="edge"] .checkpoint[data-type="HealthCheck"]');
  assert.equal(await checkpoint.getAttribute('data-state'), 'Failed');
  const evaluation = checkpoint.locator('.check[data-check="errors"]').first();
  assert.equal(await evaluation.getAttribute('data-verdict'), 'fail');
  assert.equal(await evaluation.getAttribute('data-value'), '0.5');
  assert.equal(await evaluation.locator('.check-finding').innerText(), 'value 0.5 does not meet condition < 0.05');
  // The member upgraded; the group and its stage failed with the gate.
  assert.equal(await page.locator('.tile[data-member="v-1"]').getAttribute('data-state'), 'Completed');
  assert.equal(await page.locator('article.group[data-group="edge"]').getAttribute('data-state'), 'Failed');
  await page.shot('failed');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

// ---------------------------------------------------------------------------------------------
// Fleet-wide rules (SEMANTICS §12) that hold members, on a small fleet of its own: a budget of
// one member in flight, and a freeze in force over one member.

test('a freeze in force and a full budget hold members: the fleet page shows them, the run page says what each member waits for', async () => {
  await simFleet('rules', { 'r-1': 'g', 'r-2': 'g', 'r-3': 'g' }, { durationSeconds: 300, labels: { 'r-3': { hold: 'yes' } } });
  const page = await newPage('rules');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.goto(`${base}/#/fleets/rules`);
  // Without rules, each section says so quietly.
  await page.locator('#no-freezes').waitFor();
  assert.equal(await page.locator('#no-freezes').innerText(), 'No freeze in force or coming.');
  assert.equal(await page.locator('#no-budgets').innerText(), 'No disruption budgets.');
  await page.evaluate(() => { window.notReloaded = true; });

  // The freeze's reason is the API's text, shown as text: markup in it stays words.
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString().replace(/\.\d+Z$/, 'Z');
  const reason = 'held <b>for</b> the test';
  for (const [path, properties] of [
    ['disruptionBudgets/one-at-a-time', { maxUnavailable: '1' }],
    ['freezes/hold-r3', { start: iso(now - 3600e3), end: iso(now + 2 * 3600e3), selector: { byLabel: 'hold=yes' }, scope: 'AllUpgrades', reason }],
  ]) {
    const put = await apiCall(`/v1/fleets/rules/${path}`, adminToken, { method: 'PUT', body: { properties } });
    assert.equal(put.status, 201, JSON.stringify(put.body));
  }
  await createAndStart('rules', 'held', { stages: [{ name: 'all', groups: [{ name: 'g', maxConcurrency: '3' }] }] });
  // One member upgrades (the budget's one place), the next waits for the budget, r-3 for the
  // freeze (looked at before budgets): each with waitingFor beside its message.
  const members = await eventually('one member in flight, one held by the budget, r-3 by the freeze', async () => {
    const run = (await apiCall('/v1/fleets/rules/updateRuns/held', approverToken)).body;
    const all = run.properties.status.stages[0].groups[0].members;
    const byName = Object.fromEntries(all.map((m) => [m.name, m]));
    const running = all.filter((m) => m.status.state === 'Running');
    const budget = all.filter((m) => m.status.state === 'Pending' && m.waitingFor?.kind === 'Budget');
    return running.length === 1 && budget.length === 1 && byName['r-3'].waitingFor?.kind === 'Freeze' ? { running: running[0].name, held: budget[0].name, byName } : null;
  }, 30000);
  assert.equal(members.byName['r-3'].waitingFor.name, 'hold-r3');
  assert.equal(members.byName[members.held].waitingFor.name, 'one-at-a-time');

  // The fleet page, refreshed by its own timer: the freeze in force with its end, the budget's
  // one partition full.
  const freeze = page.locator('#freezes li[data-freeze="hold-r3"]');
  await freeze.waitFor({ timeout: 20000 });
  assert.equal(await freeze.getAttribute('data-state'), 'active');
  assert.match(await freeze.innerText(), /^In force hold-r3 — held <b>for<\/b> the test\nuntil .+ \(1h \d+m left\)\nholds all upgrades of members with hold=yes$/);
  assert.equal(await freeze.locator('b').count(), 0, 'no markup from the API');
  const partition = page.locator('#budgets li[data-budget="one-at-a-time"] li.partition');
  await eventually('the budget\'s partition full', async () => (await partition.count()) === 1 && (await partition.getAttribute('data-disrupted')) === '1', 20000);
  assert.match(await partition.getAttribute('class'), /\bfull\b/);
  assert.equal(await partition.locator('.counts').innerText(), '1 / 1 in flight, 3 members');
  assert.equal(await partition.locator('.partition-value').innerText(), 'all');
  assert.match(await page.locator('#budgets li[data-budget="one-at-a-time"] > div').first().innerText(), /^one-at-a-time at most 1 in flight, of every member$/);
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  await page.shot('fleet');

  // The run page: each held member's tile and details say what holds it.
  await page.goto(`${base}/#/fleets/rules/runs/held`);
  const held = page.locator(`.tile[data-member="${members.held}"]`);
  await held.waitFor();
  assert.equal(await held.getAttribute('data-state'), 'Pending');
  assert.equal(await held.getAttribute('data-waiting'), 'Budget');
  assert.equal(await page.locator('.tile[data-member="r-3"]').getAttribute('data-waiting'), 'Freeze');
  assert.equal(await page.locator(`.tile[data-member="${members.running}"]`).getAttribute('data-waiting'), null);
  await held.click();
  const tag = page.locator('#details .wait-tag');
  assert.equal(await tag.innerText(), 'Budget: one-at-a-time');
  assert.equal(await tag.getAttribute('data-kind'), 'Budget');
  assert.match(await page.locator('#details').innerText(), /Message\s+Budget: one-at-a-time\s*disruption budget "one-at-a-time"/);
  await page.locator('.tile[data-member="r-3"]').click();
  assert.equal(await tag.innerText(), 'Freeze: hold-r3');
  assert.match(await tag.getAttribute('title'), /^Waiting for a freeze until /);
  await page.shot('held');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a chained member shows its hops on its tile, the hop in flight highlighted, and each hop in the timeline', async () => {
  // Two members on 1.29.9, a ControlPlaneOnly run to 1.31.4 with chainMinorVersions: each is
  // walked through 1.30.7 (the newest generally available 1.30; 1.30.8 is a preview), one hop
  // of four simulated seconds at a time.
  const clusters = {};
  for (const name of ['ch-1', 'ch-2']) {
    clusters[`/c/chain-${name}`] = { region: 'eastus', kubernetesVersion: '1.29.9', nodePools: [], sim: { durationSeconds: 4 } };
  }
  const catalog = { eastus: { kubernetes: [{ version: '1.29.9' }, { version: '1.30.7' }, { version: '1.30.8', preview: true }, { version: '1.31.4' }] } };
  const fleet = await apiCall('/v1/fleets/chain', adminToken, { method: 'PUT', body: { properties: { driver: { type: 'sim', timeScale: 1, catalog, clusters } } } });
  assert.equal(fleet.status, 201, JSON.stringify(fleet.body));
  for (const name of ['ch-1', 'ch-2']) {
    const put = await apiCall(`/v1/fleets/chain/members/${name}`, adminToken, { method: 'PUT', body: { properties: { clusterResourceId: `/c/chain-${name}`, group: 'g' } } });
    assert.ok(put.status < 300, JSON.stringify(put.body));
  }
  const properties = {
    strategy: { stages: [{ name: 'all', groups: [{ name: 'g', maxConcurrency: '1' }] }] },
    managedClusterUpdate: { upgrade: { type: 'ControlPlaneOnly', kubernetesVersion: '1.31.4' } },
    chainMinorVersions: true,
  };
  const created = await apiCall('/v1/fleets/chain/updateRuns/catch-up', adminToken, { method: 'PUT', body: { properties } });
  assert.ok(created.status < 300, JSON.stringify(created.body));
  const page = await newPage('chain');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.goto(`${base}/#/fleets/chain/runs/catch-up`);
  await page.locator('.tile[data-member="ch-1"]').waitFor();
  const started = await apiCall('/v1/fleets/chain/updateRuns/catch-up/start', adminToken, { method: 'POST' });
  assert.ok(started.status < 300, JSON.stringify(started.body));

  // While a hop is in flight, the tile shows the path so far with that hop's target highlighted.
  const inFlight = await eventually('a hop in flight on a tile', () => page.evaluate(() => {
    const tile = document.querySelector('#pipeline .tile[data-hops] .hop-current');
    if (!tile) return null;
    const button = tile.closest('.tile');
    return { member: button.dataset.member, hops: button.dataset.hops, current: tile.textContent, line: button.querySelector('.tile-hops').textContent };
  }), 30000);
  assert.match(inFlight.hops, /^1\.29\.9 → 1\.30\.7( → 1\.31\.4)?$/, JSON.stringify(inFlight));
  assert.ok(['1.30.7', '1.31.4'].includes(inFlight.current), JSON.stringify(inFlight));
  assert.equal(inFlight.line, inFlight.hops, 'the tile draws the path it names');
  await page.shot('hop-in-flight');

  // At the end: both walked 1.29.9 → 1.30.7 → 1.31.4, nothing highlighted, the preview never used.
  await eventually('the run completed on the page', async () => (await page.locator('#run-state .badge.s-Completed').count()) === 1, 40000);
  await eventually('both tiles with their whole path', async () => {
    const hops = await page.$$eval('#pipeline .tile[data-member]', (tiles) => tiles.map((t) => t.dataset.hops));
    return hops.length === 2 && hops.every((x) => x === '1.29.9 → 1.30.7 → 1.31.4');
  }, 20000);
  assert.equal(await page.locator('#pipeline .hop-current').count(), 0, 'no hop in flight');

  // The details list each hop with its state.
  await page.locator('.tile[data-member="ch-2"]').click();
  const rows = await page.$$eval('#details .hops li', (items) => items.map((li) => [li.textContent.replace(/\s+/g, ' ').trim(), li.dataset.state]));
  assert.equal(rows.length, 2, JSON.stringify(rows));
  assert.match(rows[0][0], /^1\.29\.9 → 1\.30\.7 ✓ Completed \d+s$/);
  assert.match(rows[1][0], /^1\.30\.7 → 1\.31\.4 ✓ Completed \d+s$/);

  // The timeline, its group opened: each member's row has one segment per hop, in order.
  await page.locator('#timeline details summary').first().click();
  const segments = await eventually('hop segments in the timeline', () => page.evaluate(() => {
    const row = document.querySelector('#timeline .member-row[data-member="ch-1"]');
    if (!row) return null;
    return [...row.querySelectorAll('.bar.hop')].map((b) => ({ hop: b.dataset.hop, to: b.dataset.to, left: parseFloat(b.style.left), title: b.title }));
  }), 10000);
  assert.deepEqual(segments.map((x) => [x.hop, x.to]), [['1', '1.30.7'], ['2', '1.31.4']]);
  assert.ok(segments[0].left <= segments[1].left, 'the second hop starts after the first');
  assert.match(segments[1].title, /hop 2 of 2: 1\.30\.7 → 1\.31\.4, Completed/);
  await page.shot('hops-timeline');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an approver rolls a finished run back from its page: the rollback run opens, approved it takes the cluster back, and each run links to the other', async () => {
  // One member on 1.30.5 whose simulated cluster offers to undo an upgrade for seven days.
  const clusters = { '/c/rb-1': { region: 'eastus', kubernetesVersion: '1.30.5', nodePools: [], sim: { durationSeconds: 2, rollback: { untilSeconds: 604800 } } } };
  const catalog = { eastus: { kubernetes: [{ version: '1.30.5' }, { version: '1.31.1' }] } };
  const fleet = await apiCall('/v1/fleets/undo', adminToken, { method: 'PUT', body: { properties: { driver: { type: 'sim', timeScale: 1, catalog, clusters } } } });
  assert.equal(fleet.status, 201, JSON.stringify(fleet.body));
  const put = await apiCall('/v1/fleets/undo/members/rb-1', adminToken, { method: 'PUT', body: { properties: { clusterResourceId: '/c/rb-1', group: 'g' } } });
  assert.ok(put.status < 300, JSON.stringify(put.body));
  const properties = { managedClusterUpdate: { upgrade: { type: 'ControlPlaneOnly', kubernetesVersion: '1.31.1' } } };
  const created = await apiCall('/v1/fleets/undo/updateRuns/up', adminToken, { method: 'PUT', body: { properties } });
  assert.ok(created.status < 300, JSON.stringify(created.body));
  const started = await apiCall('/v1/fleets/undo/updateRuns/up/start', adminToken, { method: 'POST' });
  assert.ok(started.status < 300, JSON.stringify(started.body));

  // A reader sees no button.
  const token = await apiCall('/v1/tokens', adminToken, { method: 'POST', body: { role: 'reader', subject: 'rollback-reader' } });
  assert.equal(token.status, 201);
  const readerToken = token.body.token;
  const reader = await newPage('rollback-reader');
  await reader.goto(`${base}/#token=${readerToken}`);
  await reader.locator('#me').waitFor();
  await reader.goto(`${base}/#/fleets/undo/runs/up`);
  await eventually('the run completed for the reader', async () => (await reader.locator('#run-state .badge.s-Completed').count()) === 1, 30000);
  assert.equal(await reader.locator('#rollback-run').count(), 0, 'no Roll back button for a reader');
  await reader.context().close();

  const page = await newPage('rollback');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.goto(`${base}/#/fleets/undo/runs/up`);
  await eventually('the run completed on the page', async () => (await page.locator('#run-state .badge.s-Completed').count()) === 1, 30000);
  await page.locator('#rollback-run').click();
  // The rollback run's page opens, waiting at its Approval gate, and names what it rolls back.
  await eventually('the rollback run opened', async () => page.evaluate(() => location.hash.endsWith('/runs/rollback-of-up')), 10000);
  await page.locator('#rollback-of a').waitFor();
  assert.match(await page.locator('.facts').textContent(), /back to each member's state before up/);
  assert.equal(await page.locator('#rollback-of a').textContent(), 'up');
  assert.equal(await page.locator('#rollback-run').count(), 0, 'a rollback run is not rolled back in turn');
  const approve = page.locator('button.approve');
  await approve.waitFor();
  await page.shot('rollback-run-at-its-gate');
  await approve.click();
  await eventually('the rollback run completed', async () => (await page.locator('#run-state .badge.s-Completed').count()) === 1, 30000);
  await page.locator('.tile[data-member="rb-1"]').click();
  assert.equal(await page.locator('#member-rolled-back').textContent(), 'yes');
  const member = await apiCall('/v1/fleets/undo/members/rb-1', readerToken);
  assert.equal(member.body.properties.status.cluster.kubernetesVersion, '1.30.5', JSON.stringify(member.body));
  // The original names its rollback run, and offers no second rollback.
  await page.goto(`${base}/#/fleets/undo/runs/up`);
  await page.locator('#rolled-back-by a').waitFor();
  assert.equal(await page.locator('#rolled-back-by a').textContent(), 'rollback-of-up');
  assert.equal(await page.locator('#rollback-run').count(), 0);
  await page.shot('rolled-back-run');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

/**
 * A sim fleet for a release train: members name → Kubernetes version, each with a node pool on
 * an image the catalog has an update for, upgrades of a second.
 */
async function trainFleet(fleet, members) {
  const family = 'AKSUbuntu-2204gen2containerd';
  const clusters = {};
  for (const [name, version] of Object.entries(members)) {
    clusters[`/c/${fleet}-${name}`] = { region: 'eastus', kubernetesVersion: version, nodePools: [{ name: 'sys', family, os: 'Linux', nodeImageVersion: '202602.10.0' }], sim: { durationSeconds: 1 } };
  }
  const catalog = { eastus: { kubernetes: [{ version: '1.30.5' }, { version: '1.31.1' }], nodeImages: { [family]: [{ version: '202602.10.0' }, { version: '202603.01.0' }] } } };
  const made = await apiCall(`/v1/fleets/${fleet}`, adminToken, { method: 'PUT', body: { properties: { driver: { type: 'sim', timeScale: 1, catalog, clusters } } } });
  assert.equal(made.status, 201, JSON.stringify(made.body));
  for (const name of Object.keys(members)) {
    const put = await apiCall(`/v1/fleets/${fleet}/members/${name}`, adminToken, { method: 'PUT', body: { properties: { clusterResourceId: `/c/${fleet}-${name}` } } });
    assert.ok(put.status < 300, JSON.stringify(put.body));
  }
}

test('the release train view shows each fleet of a train in order, what its upstream validated and the soak counting down; runs show their provenance', async () => {
  // train-dev's Rapid profile upgrades it at once; train-prod follows it after an hour's soak
  // (soaking all through this test); train-edge follows it after a second (promoted at once).
  await trainFleet('train-dev', { d1: '1.30.5' });
  await trainFleet('train-prod', { p1: '1.30.5', p2: '1.30.5', p3: '1.31.1' });
  await trainFleet('train-edge', { e1: '1.30.5' });
  const profile = (fleet, properties) => apiCall(`/v1/fleets/${fleet}/autoUpgradeProfiles/rapid`, adminToken, { method: 'PUT', body: { properties } });
  const head = await profile('train-dev', { channel: 'Rapid' });
  assert.ok(head.status < 300, JSON.stringify(head.body));

  // A profile that nobody follows makes no train yet.
  const page = await newPage('trains');
  await page.goto(`${base}/#token=${approverToken}`);
  await page.locator('#me').waitFor();
  await page.locator('#nav-trains').click();
  await page.locator('#no-trains').waitFor();
  assert.equal(await page.locator('#no-trains').textContent(), 'No release trains: a profile with an upstream makes one.');
  assert.equal(await page.locator('#nav-trains').getAttribute('aria-current'), 'page');

  const upstream = { profileId: '/v1/fleets/train-dev/autoUpgradeProfiles/rapid' };
  for (const [fleet, soakSeconds] of [['train-prod', 3600], ['train-edge', 1]]) {
    const put = await profile(fleet, { channel: 'Rapid', upstream: { ...upstream, soakSeconds } });
    assert.ok(put.status < 300, JSON.stringify(put.body));
  }
  const devRun = await eventually('train-dev\'s run to complete', async () => {
    const runs = (await apiCall('/v1/fleets/train-dev/updateRuns', adminToken)).body.value;
    return runs.find((r) => r.properties.autoUpgradeProfileId === upstream.profileId && r.properties.status?.status?.state === 'Completed');
  }, 60000);
  const standing = await eventually('train-prod soaking', async () => {
    const got = (await apiCall('/v1/fleets/train-prod/autoUpgradeProfiles/rapid', adminToken)).body;
    return got.properties.autoUpgradeProfileStatus?.upstream?.soakEndsAt ? got.properties.autoUpgradeProfileStatus.upstream : null;
  }, 30000);
  assert.ok(Date.parse(standing.soakEndsAt) > Date.now() + 3000 * 1000, JSON.stringify(standing));
  const edgeRun = await eventually('train-edge\'s promoted run to complete', async () => {
    const runs = (await apiCall('/v1/fleets/train-edge/updateRuns', adminToken)).body.value;
    return runs.find((r) => r.properties.status?.promotedFrom && r.properties.status?.status?.state === 'Completed');
  }, 60000);

  // The train: train-dev heads it, its two followers after it; train-prod soaks, counting down.
  await page.reload();
  const train = page.locator('section.train', { has: page.locator('li.train-car[data-fleet="train-prod"]') });
  await train.waitFor();
  assert.equal(await train.locator('h2').textContent(), 'train-dev / rapid → train-edge / rapid → train-prod / rapid');
  assert.deepEqual(await train.locator('li.train-car').evaluateAll((cars) => cars.map((c) => [c.dataset.fleet, c.dataset.depth])), [['train-dev', '0'], ['train-edge', '1'], ['train-prod', '1']]);
  const dev = train.locator('li.train-car[data-fleet="train-dev"]');
  assert.match(await dev.locator('.head-note').textContent(), /^Head of the train/);
  assert.equal(await dev.locator('.member-versions').textContent(), '1 member: 1.31.1 ×1');
  assert.equal(await dev.locator('.last-run a').textContent(), devRun.name);
  const prod = train.locator('li.train-car[data-fleet="train-prod"]');
  assert.equal(await prod.locator('.member-versions').textContent(), '3 members: 1.30.5 ×2, 1.31.1 ×1');
  assert.equal(await prod.locator('.validated-target').textContent(), standing.validatedTarget.join(', '));
  assert.match(await prod.locator('.validated-target').textContent(), /^1\.31\.1, AKSUbuntu-2204gen2containerd-202603\.01\.0$/);
  assert.equal(await prod.locator('.validated a').getAttribute('href'), `#/fleets/train-dev/runs/${devRun.name}`);
  assert.equal(await prod.locator('.last-trigger').textContent(), 'Not triggered yet.');
  const countdown = prod.locator('.soak[data-state="soaking"] .countdown');
  const first = await countdown.textContent();
  assert.match(first, /^in (59m \d\ds|1h 00m)$/);
  assert.match(await prod.locator('.soak').textContent(), /^moves at .+ \(in /);
  await eventually('the countdown to tick', async () => (await countdown.textContent()) !== first, 5000);
  // train-edge's one-second soak is over: it says it moved, never a time to come.
  const edge = train.locator('li.train-car[data-fleet="train-edge"]');
  assert.match(await edge.locator('.soak[data-state="ended"]').textContent(), /^moved at /);
  assert.equal(await edge.locator('.soak .countdown').count(), 0);
  assert.equal(await edge.locator('.last-run a').textContent(), edgeRun.name);
  await page.shot('train');

  // Narrow: the cards stack and nothing scrolls sideways.
  await page.setViewportSize({ width: 400, height: 900 });
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= document.documentElement.clientWidth), 'no sideways scroll at 400 px');
  await page.shot('train-narrow');
  await page.setViewportSize({ width: 1366, height: 900 });

  // The upstream run validates its target; the promoted run says where it comes from.
  await prod.locator('.validated a').click();
  await page.locator('#ended-on #validates').waitFor();
  assert.equal(await page.locator('#ended-on #validates').textContent(), 'Validates its target for downstream profiles');
  assert.match(await page.locator('#ended-on dd').textContent(), /^1\.31\.1, AKSUbuntu-2204gen2containerd-202603\.01\.0; /);
  await page.shot('train-upstream-run');
  await page.goto(`${base}/#/fleets/train-edge/runs/${edgeRun.name}`);
  await page.locator('#promoted-from a').waitFor();
  assert.equal(await page.locator('#promoted-from a').textContent(), `train-dev / ${devRun.name}`);
  assert.match(await page.locator('#promoted-from dd').textContent(), /^train-dev \/ \S+ \(completed .+\)$/);
  assert.equal(await page.locator('#images-not-pinned').count(), 0, 'the sim driver pins node images');
  await page.shot('train-promoted-run');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

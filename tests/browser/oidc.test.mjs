// Signing in to the dashboard through a real OpenID provider: oidc-provider (tests/oidc, pinned
// in its package-lock.json) on loopback, and `flotilla serve` configured with it in its
// configuration file. In headless Chromium, alice (release-managers: approver on prod-*) signs
// in through the provider's own login and consent pages (authorization code with PKCE), sees the
// run's approval gate and approves it from the page, and the gate records her; bob (developers:
// a reader) sees no approve button, and his session's direct API call is refused (403); a write
// without the session's CSRF token is refused too; signing out ends the session.
//
// Environment: FLOTILLA_BIN, CHROMIUM, ARTIFACTS (as dashboard.test.mjs).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const here = new URL('.', import.meta.url).pathname;
const BIN = process.env.FLOTILLA_BIN || resolve(here, '../../target/release/flotilla');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = process.env.ARTIFACTS || resolve(here, '../../target/browser-artifacts');
const PROVIDER = resolve(here, '../oidc/provider.mjs');

let workdir;
let idp;
let server;
let serverLog = '';
let browser;
let base;
let issuer;
let adminToken;

function freePort() {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolvePort(port));
    });
  });
}

async function eventually(what, fn, deadlineMs = 30000) {
  const end = Date.now() + deadlineMs;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out after ${deadlineMs} ms waiting for ${what} (last: ${JSON.stringify(last)})\n${serverLog}`);
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
  page.errors = errors;
  page.shot = (label) => page.screenshot({ path: join(ARTIFACTS, `oidc-${name}-${label}.png`), fullPage: true });
  return page;
}

/** Signs in through the provider's own pages: the dashboard's link, login, consent. */
async function signIn(page, user) {
  await page.goto(`${base}/`);
  await page.getByRole('link', { name: 'Sign in with test-idp' }).click();
  // The provider's development login page (oidc-provider's own), then its consent page.
  await page.waitForURL((url) => url.href.startsWith(issuer));
  await page.locator('input[name="login"]').fill(user);
  await page.locator('input[name="password"]').fill('any');
  await page.shot(`${user}-provider-login`);
  await page.locator('button[type="submit"]').click();
  await page.waitForLoadState();
  if (page.url().startsWith(issuer)) {
    await page.shot(`${user}-provider-consent`);
    await page.locator('button[type="submit"]').first().click();
  }
  await page.waitForURL((url) => url.href.startsWith(base));
  await page.locator('#me').waitFor({ timeout: 15000 });
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  workdir = mkdtempSync(join(tmpdir(), 'flotilla-oidc-browser-'));
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  idp = spawn(process.execPath, [PROVIDER], {
    env: { ...process.env, PORT: '0', AUDIENCE: 'urn:flotilla', REDIRECT_URIS: `${base}/auth/callback` },
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const first = await new Promise((resolveLine, reject) => {
    createInterface({ input: idp.stdout }).once('line', resolveLine);
    idp.once('exit', (code) => reject(new Error(`the provider exited with ${code}`)));
  });
  idp.stdout.resume();
  issuer = JSON.parse(first).issuer;

  const database = join(workdir, 'flotilla.db');
  adminToken = execFileSync(BIN, ['token', 'create', '--role', 'admin', '--subject', 'break-glass', '--database', database]).toString().trim();
  const config = join(workdir, 'flotilla.toml');
  writeFileSync(config, `listen = "127.0.0.1:${port}"
database = "${database}"

[[identity-provider]]
name = "test-idp"
issuer = "${issuer}"
audience = "urn:flotilla"
clientId = "flotilla-dashboard"
clientSecret = { env = "FLOTILLA_TEST_DASHBOARD_SECRET" }
userClaim = "preferred_username"
scopes = ["groups"]
roles = [
  { groups = ["everyone"], role = "reader" },
  { groups = ["release-managers"], role = "approver", fleets = ["prod-*"] },
]
`);
  server = spawn(BIN, ['serve', '--config', config], {
    env: { ...process.env, FLOTILLA_TEST_DASHBOARD_SECRET: 'dashboard-secret-for-tests', FLOTILLA_LOG: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  server.stdout.on('data', (d) => { serverLog += d; });
  server.stderr.on('data', (d) => { serverLog += d; });
  await eventually('the server to be ready', async () => {
    try {
      return (await fetch(`${base}/readyz`)).ok;
    } catch {
      return false;
    }
  });

  // A production fleet whose run waits at an approval gate before its one stage.
  const clusters = { '/c/a': { region: 'eastus', kubernetesVersion: '1.30.5', nodePools: [], sim: { durationSeconds: 1 } } };
  const driver = { type: 'sim', timeScale: 1, catalog: { eastus: { kubernetes: [{ version: '1.30.5' }, { version: '1.31.1' }] } }, clusters };
  assert.equal((await apiCall('/v1/fleets/prod-eu', adminToken, { method: 'PUT', body: { properties: { driver } } })).status, 201);
  const member = await apiCall('/v1/fleets/prod-eu/members/a', adminToken, { method: 'PUT', body: { properties: { clusterResourceId: '/c/a', group: 'g' } } });
  assert.ok(member.status < 300, JSON.stringify(member.body));
  const run = { properties: {
    strategy: { stages: [{ name: 'production', beforeGates: [{ type: 'Approval', displayName: 'Release managers approve' }], groups: [{ name: 'g' }] }] },
    managedClusterUpdate: { upgrade: { type: 'ControlPlaneOnly', kubernetesVersion: '1.31.1' } },
  } };
  const put = await apiCall('/v1/fleets/prod-eu/updateRuns/r1', adminToken, { method: 'PUT', body: run });
  assert.ok(put.status < 300, JSON.stringify(put.body));
  const started = await apiCall('/v1/fleets/prod-eu/updateRuns/r1/start', adminToken, { method: 'POST' });
  assert.equal(started.status, 200, JSON.stringify(started.body));

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
  server?.kill();
  idp?.kill();
  if (workdir) rmSync(workdir, { recursive: true, force: true });
  writeFileSync(join(ARTIFACTS, 'oidc-server.log'), serverLog);
});

test('a reader signed in through the provider sees no approve button, and the API refuses the approval (403)', async () => {
  const page = await newPage('bob');
  await signIn(page, 'bob');
  assert.match(await page.locator('#me').innerText(), /bob \(http:\/\/127\.0\.0\.1:\d+\) \(reader\)/);
  // The session is a cookie the page cannot read: no token in storage, none in document.cookie.
  assert.equal(await page.evaluate(() => sessionStorage.getItem('flotilla.token')), null);
  assert.equal(await page.evaluate(() => document.cookie), '');
  const cookie = (await page.context().cookies()).find((c) => c.name === 'flotilla_session');
  assert.ok(cookie?.httpOnly, 'the session cookie is HttpOnly');
  assert.equal(cookie.sameSite, 'Lax');
  await page.goto(`${base}/#/fleets/prod-eu/runs/r1`);
  const gate = page.locator('#pipeline li.checkpoint[data-gate]');
  await eventually('the gate to be Pending', async () => (await gate.getAttribute('data-state')) === 'Pending');
  assert.equal(await page.locator('button.approve').count(), 0, 'no approve button for a reader');
  await page.shot('no-approve');
  const gateId = await gate.getAttribute('data-gate');
  // The session's own call, with its CSRF token: the role is too low.
  const direct = await page.evaluate(async (id) => {
    const me = await (await fetch('/v1/me')).json();
    const response = await fetch(`/v1/fleets/prod-eu/gates/${id}`, {
      method: 'PATCH',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': me.csrfToken },
      body: JSON.stringify({ properties: { state: 'Completed' } }),
    });
    return response.status;
  }, gateId);
  assert.equal(direct, 403);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a release manager signs in through the provider\'s login page and approves the gate', async () => {
  const page = await newPage('alice');
  await signIn(page, 'alice');
  assert.match(await page.locator('#me').innerText(), /alice .*approver on prod-\*/);
  await page.goto(`${base}/#/fleets/prod-eu/runs/r1`);
  const gate = page.locator('#pipeline li.checkpoint[data-gate]');
  const gateId = await eventually('the gate', async () => gate.getAttribute('data-gate'));
  // A write with the session cookie but without its CSRF token is refused.
  const forged = await page.evaluate(async (id) => {
    const response = await fetch(`/v1/fleets/prod-eu/gates/${id}`, {
      method: 'PATCH',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ properties: { state: 'Completed' } }),
    });
    return { status: response.status, body: await response.json() };
  }, gateId);
  assert.equal(forged.status, 403, 'no CSRF token, no write');
  assert.match(forged.body.error.message, /X-CSRF-Token: a write made with the session cookie must carry its CSRF token/, JSON.stringify(forged.body));
  const approve = page.getByRole('button', { name: /^Approve gate: Release managers approve/ });
  await approve.waitFor({ timeout: 30000 });
  await page.shot('before-approve');
  await approve.click();
  await eventually('the gate Completed, approved by alice', async () => (await gate.getAttribute('data-state')) === 'Completed' && /approved by alice/.test(await gate.innerText()), 15000);
  await page.shot('approved');
  const recorded = await apiCall(`/v1/fleets/prod-eu/gates/${gateId}`, adminToken);
  assert.equal(recorded.body.properties.approvedBy, `alice (${issuer})`);
  const audit = await apiCall('/v1/audit', adminToken);
  assert.ok(audit.body.value.some((e) => e.subject === `alice (${issuer})` && e.method === 'PATCH'), JSON.stringify(audit.body.value.slice(-3)));

  // Signing out ends the session on the server: the old cookie, replayed, is refused.
  const old = (await page.context().cookies(base)).find((c) => c.name === 'flotilla_session');
  assert.ok(old && old.value, 'a session cookie before signing out');
  const before = await fetch(`${base}/v1/me`, { headers: { Cookie: `flotilla_session=${old.value}` } });
  assert.equal(before.status, 200, 'the old cookie works before signing out');
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByText('Signed out.').waitFor();
  const after = await fetch(`${base}/v1/me`, { headers: { Cookie: `flotilla_session=${old.value}` } });
  assert.equal(after.status, 401, 'the session ended on the server');
  assert.equal((await page.context().cookies(base)).find((c) => c.name === 'flotilla_session'), undefined, 'the browser dropped the cookie');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

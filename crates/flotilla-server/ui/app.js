// The dashboard's entry: sign-in (through an identity provider, which opens a session held in
// an HttpOnly cookie, or with a bearer token), the header, and hash routes
//   #/                      fleets (straight to the fleet when there is one)
//   #/fleets/F              the fleet's members
//   #/fleets/F/runs         its update runs
//   #/fleets/F/runs/R       one run, live
//   #/trains                release trains across the fleets (trains.js)
// Any route may carry ?token=flt_… (a link that signs in and opens that page), as may the bare
// #token=flt_…; the token is taken into session storage and dropped from the address.
// Each view renders into <main> and returns a function that stops its timers and streams.

import { api, token, session, ApiError, listAll, enc } from './api.js';
import { h, clear } from './dom.js';
import * as fleetView from './fleet.js';
import * as runsView from './runs.js';
import * as runView from './run.js';
import * as trainsView from './trains.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const notice = document.getElementById('notice');

let me = null;
let stopView = () => {};

/** A short message at the top of the page; errors stay until dismissed or replaced. */
export function notify(message, kind = 'info') {
  clear(notice);
  notice.className = `notice ${kind}`;
  notice.append(h('span', {}, message), h('button', { type: 'button', class: 'link', 'aria-label': 'Dismiss', onclick: () => { notice.hidden = true; } }, '×'));
  notice.hidden = false;
  if (kind !== 'error') {
    const shown = notice.textContent;
    setTimeout(() => { if (notice.textContent === shown) notice.hidden = true; }, 6000);
  }
}

/** The hash split into its route (`/fleets/F/runs/R`) and its query (`token=…`). */
function fragment() {
  const text = location.hash.replace(/^#/, '');
  // The bare sign-in link, #token=…, is a query on the root route.
  if (text.startsWith('token=')) return { path: '/', query: new URLSearchParams(text) };
  const at = text.indexOf('?');
  return at < 0
    ? { path: text, query: new URLSearchParams() }
    : { path: text.slice(0, at), query: new URLSearchParams(text.slice(at + 1)) };
}

const hasToken = () => fragment().query.has('token');

function takeTokenFromFragment() {
  // `flotilla demo` prints sign-in links with #token=… and #/fleets/F/runs/R?token=…; the
  // fragment never reaches the server (or its logs). The token leaves the address bar (and the
  // history entry) before anything else happens, and the page lands on the route it named.
  const { path, query } = fragment();
  const value = query.get('token');
  if (value === null) return;
  if (/^[A-Za-z0-9_]+$/.test(value)) token.set(value);
  query.delete('token');
  const rest = query.toString();
  history.replaceState(null, '', `${location.pathname}${location.search}#${path || '/'}${rest ? `?${rest}` : ''}`);
}

function signInForm(message, extra) {
  clear(nav);
  clear(who);
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, placeholder: 'flt_…', spellcheck: 'false', size: 60 });
  // The identity providers people sign in with: each a link to the server's /auth/login, which
  // sends the browser on to the provider's own sign-in page.
  const providers = h('div', { class: 'providers' });
  const form = h('form', { class: 'signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in'),
    message ? h('p', { class: 'error', role: 'alert' }, message) : null,
    extra || null,
    providers,
    h('p', {}, 'Or paste an API token (', h('code', {}, 'flotilla token create'), '). It is kept in this tab only, in session storage.'),
    h('label', { for: 'token' }, 'Bearer token'),
    input,
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    token.set(input.value.trim());
    start();
  });
  clear(main).append(form);
  input.focus();
  fetch('/auth/providers', { cache: 'no-store' })
    .then((r) => (r.ok ? r.json() : { value: [] }))
    .then((list) => {
      for (const p of (list.value || []).filter((x) => x.dashboard)) {
        providers.append(h('p', {}, h('a', { class: 'button primary', href: `/auth/login?provider=${enc(p.name)}`, 'data-provider': p.name }, `Sign in with ${p.name}`)));
      }
    })
    .catch(() => {});
}

async function signOut() {
  const wasSession = !token.get() && session.csrf();
  token.clear();
  me = null;
  stopView();
  stopView = () => {};
  let extra = null;
  let message = 'Signed out.';
  if (wasSession) {
    // The server clears the cookie whatever it answers; a refusal is shown, since the session
    // may then live on on the server until it expires.
    try {
      const response = await fetch('/auth/logout', { method: 'POST', headers: { 'X-CSRF-Token': session.csrf() }, cache: 'no-store' });
      if (response.ok) {
        const answer = await response.json();
        if (answer.endSessionUrl) extra = h('p', {}, h('a', { href: answer.endSessionUrl, id: 'provider-sign-out' }, 'Sign out of the identity provider too'));
      } else {
        const reason = (await response.text()).trim();
        message = `Sign-out failed on the server (${response.status}${reason ? `: ${reason}` : ''}); the session ends when it expires.`;
      }
    } catch (e) {
      message = `Sign-out failed: the server could not be reached (${e.message}); the session ends when it expires.`;
    }
    session.setCsrf(null);
  }
  signInForm(message, extra);
}

/** The role shown beside the name: the role on every fleet, and those on fleet patterns. */
function roles() {
  const patterns = (me.grants || []).filter((g) => g.fleets !== '*').map((g) => `${g.role} on ${g.fleets}`);
  return [me.role].concat(patterns).join('; ');
}

function header(fleet) {
  clear(who).append(
    h('span', { id: 'me', 'data-role': me.role }, 'Signed in as ', h('strong', {}, me.subject), ` (${roles()})`),
    h('button', { type: 'button', class: 'link', onclick: signOut }, 'Sign out'));
  clear(nav);
  if (fleet) {
    const here = location.hash;
    const link = (href, text) => h('a', { href, 'aria-current': here === href ? 'page' : null }, text);
    nav.append(h('span', { class: 'fleet-name' }, fleet), link(`#/fleets/${enc(fleet)}`, 'Fleet'), link(`#/fleets/${enc(fleet)}/runs`, 'Runs'));
  }
  nav.append(h('a', { href: '#/trains', id: 'nav-trains', 'aria-current': location.hash === '#/trains' ? 'page' : null }, 'Trains'));
}

async function route() {
  stopView();
  stopView = () => {};
  const parts = fragment().path.replace(/^\//, '').split('/').filter(Boolean).map(decodeURIComponent);
  // Each route renders into its own container and owns an abort signal, so a view still
  // loading when the user moves on cannot draw into the next one or keep its streams open.
  const controller = new AbortController();
  const container = h('div', { class: 'view' });
  clear(main).append(container);
  const ctx = { main: container, me, notify, signal: controller.signal };
  let stop = () => {};
  stopView = () => {
    controller.abort();
    stop?.();
  };
  try {
    if (parts[0] === 'fleets' && parts[1]) {
      ctx.fleet = parts[1];
      header(ctx.fleet);
      if (parts[2] === 'runs' && parts[3]) {
        ctx.run = parts[3];
        document.title = `${ctx.run} · Flotilla`;
        stop = await runView.render(ctx);
      } else if (parts[2] === 'runs') {
        document.title = `Runs · ${ctx.fleet} · Flotilla`;
        stop = await runsView.render(ctx);
      } else {
        document.title = `${ctx.fleet} · Flotilla`;
        stop = await fleetView.render(ctx);
      }
    } else if (parts[0] === 'trains') {
      header(null);
      document.title = 'Release trains · Flotilla';
      stop = await trainsView.render(ctx);
    } else {
      header(null);
      document.title = 'Flotilla';
      const fleets = await listAll('/v1/fleets', { signal: ctx.signal });
      if (fleets.length === 1) {
        location.replace(`#/fleets/${enc(fleets[0].name)}`);
        return;
      }
      stop = await fleetView.renderList(ctx, fleets);
    }
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      const hadToken = !!token.get();
      token.clear();
      signInForm(hadToken ? 'That token was not accepted.' : 'The session has ended; sign in again.');
      return;
    }
    if (e?.name !== 'AbortError') {
      ctx.main.append(h('p', { class: 'error', role: 'alert' }, `Could not load: ${e.message}`));
    }
  }
  if (controller.signal.aborted) stop?.();
}

async function start() {
  takeTokenFromFragment();
  if (!token.get()) {
    // Without a token, a session cookie from an identity provider sign-in may be there (the
    // page cannot read it: it asks the server).
    try {
      const live = await (await fetch('/auth/session', { cache: 'no-store' })).json();
      if (!live.signedIn) {
        signInForm();
        return;
      }
      me = await api('/v1/me');
      session.setCsrf(me.csrfToken);
    } catch (e) {
      signInForm(e instanceof ApiError && e.status === 403 ? e.message : undefined);
      return;
    }
    await route();
    return;
  }
  try {
    me = await api('/v1/me');
  } catch (e) {
    token.clear();
    signInForm(e instanceof ApiError && e.status === 401 ? 'That token was not accepted.' : `Could not reach the server: ${e.message}`);
    return;
  }
  await route();
}

window.addEventListener('hashchange', () => {
  if (hasToken()) start();
  else if (me) route();
});
start();

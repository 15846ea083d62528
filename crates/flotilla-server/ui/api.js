// The API client: the bearer token lives in this tab's session storage, every request carries
// it in the Authorization header, and live events are read from a fetch() stream (EventSource
// cannot send headers, and a token in a URL would be logged). Signed in through an identity
// provider instead, the page holds no token: the session is an HttpOnly cookie the browser
// sends, and every write carries the session's CSRF token (from /v1/me) in X-CSRF-Token.

const KEY = 'flotilla.token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

let csrf = null;
/** The CSRF token of the identity provider session (null with a bearer token). */
export const session = {
  setCsrf: (value) => { csrf = value || null; },
  csrf: () => csrf,
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = { Accept: 'application/json' };
  const secret = token.get();
  if (secret) headers.Authorization = `Bearer ${secret}`;
  else if (csrf && method !== 'GET') headers['X-CSRF-Token'] = csrf;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: 'no-store',
  });
  const text = await response.text();
  let value = null;
  try {
    value = text ? JSON.parse(text) : null;
  } catch {
    value = null;
  }
  if (!response.ok) {
    const error = value?.error || {};
    throw new ApiError(response.status, error.code || String(response.status), error.message || text || response.statusText);
  }
  return value;
}

/**
 * Every item of a list, following nextLink, `top` a page: most lists serve up to 1,000 at once,
 * a fleet's freezes and disruption budgets up to 100 (a larger $top is a 400).
 */
export async function listAll(path, { signal, top = 1000 } = {}) {
  const items = [];
  let next = path + (path.includes('?') ? '&' : '?') + `$top=${top}`;
  for (let pages = 0; next && pages < 1000; pages++) {
    const page = await api(next, { signal });
    items.push(...(page?.value || []));
    next = page?.nextLink || null;
  }
  return items;
}

/**
 * How many items a list holds. The API has no count: this pages through the list with the
 * largest page it serves ($top=1000), one request per thousand items, keeping none of them.
 */
export async function countAll(path, { signal } = {}) {
  let count = 0;
  let next = path + (path.includes('?') ? '&' : '?') + '$top=1000';
  for (let pages = 0; next && pages < 1000; pages++) {
    const page = await api(next, { signal });
    count += page?.value?.length || 0;
    next = page?.nextLink || null;
  }
  return count;
}

export const enc = encodeURIComponent;

/**
 * Reads a server-sent event stream with the bearer token; calls onEvent(parsedData, id) for each
 * event and onState('live' | 'reconnecting' | 'closed') as the connection changes. Reconnects
 * with a growing delay until the signal aborts, sending the last event id seen as
 * Last-Event-ID so that the server resumes after it: nothing is missed and nothing repeated.
 */
export async function streamEvents(path, { signal, onEvent, onState }) {
  let delay = 500;
  let lastId = null;
  while (!signal.aborted) {
    try {
      const headers = { Accept: 'text/event-stream' };
      const secret = token.get();
      if (secret) headers.Authorization = `Bearer ${secret}`;
      if (lastId !== null) headers['Last-Event-ID'] = lastId;
      const response = await fetch(path, { headers, signal, cache: 'no-store' });
      if (!response.ok || !response.body) throw new ApiError(response.status, 'Stream', response.statusText);
      onState('live');
      delay = 500;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, '\n');
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = parseBlock(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          // An id counts once its whole event has arrived, as EventSource does.
          if (block.id !== null) lastId = block.id;
          if (!block.data) continue; // keep-alive comments
          let event;
          try {
            event = JSON.parse(block.data);
          } catch {
            event = { type: 'Unparsed', message: block.data };
          }
          onEvent(event, block.id ?? lastId);
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && (e.status === 401 || e.status === 403 || e.status === 404)) {
        onState('closed');
        return;
      }
    }
    if (signal.aborted) return;
    onState('reconnecting');
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

/** One event's fields: its `id:` (null when it has none) and its `data:` lines joined. */
function parseBlock(block) {
  let id = null;
  const data = [];
  for (const line of block.split('\n')) {
    const colon = line.indexOf(':');
    if (colon === 0) continue; // a comment
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
    if (field === 'data') data.push(value);
    // An id with a NUL is ignored (the SSE specification); it could not be sent back as a header.
    else if (field === 'id' && !value.includes('\0')) id = value;
  }
  return { id, data: data.join('\n') };
}

export const ROLES = ['reader', 'operator', 'approver', 'admin'];

/** Whether a fleet pattern of a grant (`*` any run of characters) matches a fleet. */
function matches(pattern, fleet) {
  const escaped = pattern.toLowerCase().split('*').map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  return new RegExp(`^${escaped.join('.*')}$`).test(fleet.toLowerCase());
}

/**
 * Whether the caller has `role` — on `fleet` when given (an identity provider's grants are per
 * fleet pattern; the server decides all the same, this only hides what it would refuse).
 */
export function can(me, role, fleet) {
  if (!me) return false;
  let held = ROLES.indexOf(me.role);
  if (fleet && Array.isArray(me.grants)) {
    for (const grant of me.grants) {
      if (matches(grant.fleets, fleet)) held = Math.max(held, ROLES.indexOf(grant.role));
    }
  }
  return held >= ROLES.indexOf(role);
}

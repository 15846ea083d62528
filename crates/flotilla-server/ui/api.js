// The API client: the bearer token lives in this tab's session storage, every request carries
// it in the Authorization header, and live events are read from a fetch() stream (EventSource
// cannot send headers, and a token in a URL would be logged).

const KEY = 'flotilla.token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
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

/** Every item of a list, following nextLink. */
export async function listAll(path, { signal } = {}) {
  const items = [];
  let next = path + (path.includes('?') ? '&' : '?') + '$top=1000';
  for (let pages = 0; next && pages < 1000; pages++) {
    const page = await api(next, { signal });
    items.push(...(page?.value || []));
    next = page?.nextLink || null;
  }
  return items;
}

export const enc = encodeURIComponent;

/**
 * Reads a server-sent event stream with the bearer token; calls onEvent(parsedData) for each
 * event and onState('live' | 'reconnecting') as the connection changes. Reconnects with a
 * growing delay until the signal aborts.
 */
export async function streamEvents(path, { signal, onEvent, onState }) {
  let delay = 500;
  while (!signal.aborted) {
    try {
      const headers = { Accept: 'text/event-stream' };
      const secret = token.get();
      if (secret) headers.Authorization = `Bearer ${secret}`;
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
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
          if (!data) continue; // keep-alive comments
          try {
            onEvent(JSON.parse(data));
          } catch {
            onEvent({ type: 'Unparsed', message: data });
          }
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

export const ROLES = ['reader', 'operator', 'approver', 'admin'];
export function can(me, role) {
  return !!me && ROLES.indexOf(me.role) >= ROLES.indexOf(role);
}

// The user's side of the device flow, through the provider's own pages as a browser would go:
// open the verification URL, confirm the code, sign in, consent. Forms are read from the HTML
// and posted with the session's cookies; redirects are followed by hand.
//
//   node user-step.mjs <verification_uri_complete> <user>
// Exits 0 when the provider says the device is signed in.

const [start, user] = process.argv.slice(2);
if (!start || !user) {
  console.error('usage: node user-step.mjs <verification_uri_complete> <user>');
  process.exit(2);
}

const jar = new Map();
function remember(response) {
  for (const line of response.headers.getSetCookie()) {
    const [pair] = line.split(';');
    const at = pair.indexOf('=');
    const name = pair.slice(0, at).trim();
    const value = pair.slice(at + 1).trim();
    if (/expires=Thu, 01 Jan 1970/i.test(line) || value === '') jar.delete(name);
    else jar.set(name, value);
  }
}
const cookies = () => [...jar].map(([k, v]) => `${k}=${v}`).join('; ');

async function go(url, init = {}) {
  let response = await fetch(url, { ...init, redirect: 'manual', headers: { ...(init.headers || {}), cookie: cookies() } });
  remember(response);
  while ([301, 302, 303, 307, 308].includes(response.status)) {
    url = new URL(response.headers.get('location'), url).href;
    response = await fetch(url, { redirect: 'manual', headers: { cookie: cookies() } });
    remember(response);
  }
  return { url, status: response.status, html: await response.text() };
}

function form(html) {
  const open = html.match(/<form[^>]*action="([^"]*)"[^>]*>/i);
  if (!open) return null;
  const body = html.slice(open.index, html.indexOf('</form>', open.index));
  const fields = new URLSearchParams();
  for (const input of body.matchAll(/<input([^>]*)>/gi)) {
    const name = input[1].match(/name="([^"]*)"/)?.[1];
    const value = input[1].match(/value="([^"]*)"/)?.[1] ?? '';
    if (name) fields.set(name, value.replace(/&amp;/g, '&').replace(/&quot;/g, '"'));
  }
  return { action: open[1].replace(/&amp;/g, '&'), fields };
}

let page = await go(start);
for (let step = 0; step < 8; step += 1) {
  if (/success|signed in|can be closed|sign-in success/i.test(page.html) && !/<form/i.test(page.html)) {
    console.log(`user-step: ${user} signed in the device`);
    process.exit(0);
  }
  const found = form(page.html);
  if (!found) break;
  if (found.fields.has('login')) {
    found.fields.set('login', user);
    found.fields.set('password', 'any');
  }
  page = await go(new URL(found.action, page.url).href, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: found.fields.toString(),
  });
}
console.error(`user-step: stuck at ${page.url} (${page.status}):\n${page.html.slice(0, 2000)}`);
process.exit(1);

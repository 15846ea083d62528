// A real OpenID provider for Flotilla's tests: oidc-provider (pinned in package-lock.json) on
// loopback, with
// - users in groups (any password; the login page is oidc-provider's own development one):
//   alice (release-managers, everyone), bob (developers, everyone), carol (platform);
// - clients: `flotilla-dashboard` (authorization code with PKCE, a secret, the redirect URIs of
//   REDIRECT_URIS), `flotilla-cli` (public: the device flow and refresh tokens),
//   `deploy-pipeline` (client credentials, a secret);
// - resource indicators, so that access tokens for the API (the resource AUDIENCE, or
//   urn:another-api for a token meant for someone else) are JWTs signed with the provider's
//   key, carrying the user's groups and names;
// - key rotation without a restart: `POST /admin/rotate` makes a new signing key, published
//   first in the JWKS (the old one stays published), and answers its `kid`.
//
// Environment: PORT (default 0: a free one), AUDIENCE (default urn:flotilla), REDIRECT_URIS
// (comma-separated), ACCESS_TTL (seconds, default 300). When ready it prints one JSON line:
// {"issuer": ..., "kid": ...}.

import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import Provider from 'oidc-provider';
import { generateKeyPair, exportJWK } from 'jose';

const AUDIENCE = process.env.AUDIENCE || 'urn:flotilla';
const OTHER_AUDIENCE = 'urn:another-api';
const ACCESS_TTL = Number(process.env.ACCESS_TTL || 300);
const REDIRECT_URIS = (process.env.REDIRECT_URIS || '').split(',').filter(Boolean);
export const SECRETS = { dashboard: 'dashboard-secret-for-tests', pipeline: 'pipeline-secret-for-tests' };

const USERS = {
  alice: { name: 'Alice Approver', groups: ['release-managers', 'everyone'] },
  bob: { name: 'Bob Builder', groups: ['developers', 'everyone'] },
  carol: { name: 'Carol Platform', groups: ['platform'] },
};

async function newKey() {
  const { privateKey } = await generateKeyPair('RS256', { extractable: true });
  const jwk = await exportJWK(privateKey);
  return { ...jwk, kid: randomUUID(), alg: 'RS256', use: 'sig' };
}

function userClaims(sub) {
  const user = USERS[sub] || { name: sub, groups: [] };
  return { name: user.name, preferred_username: sub, groups: user.groups };
}

function configuration(keys) {
  return {
    clients: [
      {
        client_id: 'flotilla-dashboard',
        client_secret: SECRETS.dashboard,
        grant_types: ['authorization_code', 'refresh_token'],
        response_types: ['code'],
        redirect_uris: REDIRECT_URIS.length ? REDIRECT_URIS : ['http://127.0.0.1/unused'],
        post_logout_redirect_uris: REDIRECT_URIS.map((u) => new URL('/', u).href),
      },
      {
        client_id: 'flotilla-cli',
        token_endpoint_auth_method: 'none',
        grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'refresh_token'],
        response_types: [],
        redirect_uris: [],
      },
      {
        client_id: 'deploy-pipeline',
        client_secret: SECRETS.pipeline,
        grant_types: ['client_credentials'],
        response_types: [],
        redirect_uris: [],
      },
    ],
    jwks: { keys },
    cookies: { keys: ['flotilla-oidc-test-cookie-key'] },
    scopes: ['openid', 'offline_access', 'profile', 'groups', 'flotilla'],
    claims: { openid: ['sub'], profile: ['name', 'preferred_username'], groups: ['groups'] },
    // The ID token carries the profile and groups (the dashboard reads them there).
    conformIdTokenClaims: false,
    pkce: { required: () => true },
    ttl: { AccessToken: ACCESS_TTL, ClientCredentials: ACCESS_TTL, IdToken: 600, DeviceCode: 600, RefreshToken: 86400 },
    features: {
      devInteractions: { enabled: true },
      deviceFlow: { enabled: true },
      clientCredentials: { enabled: true },
      revocation: { enabled: true },
      rpInitiatedLogout: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async () => AUDIENCE,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (_ctx, resource) => {
          // A second API, so that tests can get a real token for another audience.
          if (resource !== AUDIENCE && resource !== OTHER_AUDIENCE) throw new Provider.errors.InvalidTarget();
          return {
            scope: 'flotilla',
            audience: resource,
            accessTokenTTL: ACCESS_TTL,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    // Offline access (refresh tokens) for the device flow and the dashboard when asked.
    issueRefreshToken: async (_ctx, client, code) => client.grantTypeAllowed('refresh_token') && code.scopes.has('offline_access'),
    findAccount: async (_ctx, sub) => ({
      accountId: sub,
      claims: async () => ({ sub, ...userClaims(sub) }),
    }),
    extraTokenClaims: async (_ctx, token) => (token.accountId ? userClaims(token.accountId) : undefined),
    loadExistingGrant: async (ctx) => {
      // Consent once per user and client (the test users consent on the provider's page).
      const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
      return grantId ? ctx.oidc.provider.Grant.find(grantId) : undefined;
    },
  };
}

const keys = [await newKey()];
let provider;
let issuer;

function build() {
  provider = new Provider(issuer, configuration(keys.map((k) => ({ ...k }))));
  provider.proxy = false;
  provider.on('server_error', (_ctx, error) => console.error('provider error:', error));
}

const server = createServer((req, res) => {
  if (req.method === 'POST' && req.url === '/admin/rotate') {
    newKey().then((key) => {
      keys.unshift(key);
      build();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ kid: key.kid }));
    });
    return;
  }
  provider.callback()(req, res);
});

server.listen(Number(process.env.PORT || 0), '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  build();
  console.log(JSON.stringify({ issuer, kid: keys[0].kid }));
});

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));

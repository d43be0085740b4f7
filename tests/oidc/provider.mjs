// A real OpenID Provider for the sign-in tests: npm's oidc-provider (certified), configured
// with a few people and clients. Started by tests/oidc/support.py; installed by
// .ci/oidc-provider.sh. Its built-in ("dev") login form accepts any password: the people
// below differ only in their claims.
//
//   node provider.mjs   with OIDC_PORT, OIDC_ISSUER, OIDC_REDIRECT_URIS (comma separated),
//                       OIDC_LOGOUT_URIS, OIDC_CLIENT_SECRET, NODE_PATH → the cache's node_modules;
//                       OIDC_PAIRWISE=1: docbroker's id_tokens carry a pairwise `sub` (as Entra
//                       ID's do: one per application), the person's id stays in `oid`
// Prints "listening" on stdout once discovery is served.
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.OIDC_MODULES, 'x.js'));
const Provider = require('oidc-provider').default ?? require('oidc-provider');

const env = (name) => {
  const value = process.env[name];
  if (!value) { console.error(`provider.mjs: ${name} is not set`); process.exit(2); }
  return value;
};

// Who may sign in, and what the provider says about them. Anyone else may log in too, with
// no groups at all (someone of the organisation who approves nothing).
const PEOPLE = {
  'ann': { groups: ['docbroker-approvers', 'acme-approvers'], org: { roles: ['reviewer'] } },
  'bob': { groups: ['docbroker-approvers', 'globex-approvers'], org: { roles: ['reviewer'] } },
  'alice': { groups: ['docbroker-approvers', 'acme-approvers', 'strict-approvers'] }, // also a requester
  'walt': { groups: ['acme-approvers'] }, // in acme's group but not an approver
  'lena': { groups: ['docbroker-approvers', 'acme-approvers', 'legal'] }, // acme's legal group
};
const PAIRWISE = process.env.OIDC_PAIRWISE === '1';

// Services of the tenants: client credentials give them JWT access tokens for the broker
// (the resource), with the tenant in a claim of their own.
const RESOURCE = 'urn:docbroker';
const SERVICES = { 'acme-service': 'acme', 'globex-service': 'globex', 'stray-service': undefined };

const TEAMS = { ann: 'acme', bob: 'globex', lena: 'acme' }; // people's teams, in their access tokens

const redirects = env('OIDC_REDIRECT_URIS').split(',');
const logouts = env('OIDC_LOGOUT_URIS').split(',');
const secret = env('OIDC_CLIENT_SECRET');
const provider = new Provider(env('OIDC_ISSUER'), {
  clients: [
    {
      client_id: 'docbroker', client_secret: secret, redirect_uris: redirects,
      post_logout_redirect_uris: logouts, grant_types: ['authorization_code'], response_types: ['code'],
      ...(PAIRWISE ? { subject_type: 'pairwise' } : {}),
    },
    // Another application of the same organisation: its id_tokens are not for docbroker.
    {
      client_id: 'other-app', client_secret: secret, redirect_uris: redirects,
      grant_types: ['authorization_code'], response_types: ['code'],
    },
    // An MCP client a person signs in with (public: PKCE alone), for a token to the broker.
    {
      client_id: 'mcp-client', token_endpoint_auth_method: 'none', redirect_uris: redirects,
      grant_types: ['authorization_code'], response_types: ['code'],
    },
    ...Object.keys(SERVICES).map((id) => ({
      client_id: id, client_secret: secret, grant_types: ['client_credentials'], response_types: [],
      redirect_uris: [], scope: 'docs:read docs:write',
    })),
  ],
  claims: { openid: ['sub', 'oid'], groups: ['groups', 'org'] },
  scopes: ['openid', 'offline_access', 'docs:read', 'docs:write', 'reports:approve'],
  subjectTypes: ['public', 'pairwise'],
  async pairwiseIdentifier(ctx, accountId, client) { return `pw-${client.clientId}-${accountId}`; },
  // The groups ride in the id_token, as Keycloak's, Okta's and Entra ID's group claims do.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // only the services ask for the broker as a resource; people's sign-ins stay plain OIDC
      defaultResource: (ctx, client) => (client.grantTypeAllowed('client_credentials') ? RESOURCE : undefined),
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => ({
        scope: 'docs:read docs:write reports:approve', audience: resource, accessTokenTTL: 600,
        accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  // The services' teams, nested as an organisation's directory might put them; a stray
  // service is in a team no tenant maps.
  async extraTokenClaims(ctx, token) {
    const tenant = token.accountId ? TEAMS[token.accountId] : SERVICES[token.clientId];
    // `oid` names the person (or the service) as Entra ID's object id does: alike in every app.
    return { oid: token.accountId ?? token.clientId, org: { teams: [tenant ? `${tenant}-team` : 'contractors'] } };
  },
  cookies: { keys: [secret] },
  ttl: { AccessToken: 600, ClientCredentials: 600, AuthorizationCode: 60, IdToken: 600, Grant: 600, Session: 3600, Interaction: 600 },
  async findAccount(ctx, id) {
    return { accountId: id, async claims() { return { sub: id, oid: id, ...(PEOPLE[id] ?? { groups: [] }) }; } };
  },
  // First-party: the organisation has consented for its people; no consent screen.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid groups docs:read docs:write reports:approve');
    grant.addResourceScope(RESOURCE, 'docs:read docs:write reports:approve');
    await grant.save();
    return grant;
  },
});
// Its own failures go to its log (the tests print it when the provider misbehaves).
provider.on('server_error', (ctx, error) => { console.error('server_error', error); });
provider.listen(Number(env('OIDC_PORT')), '127.0.0.1', () => { console.log('listening'); });

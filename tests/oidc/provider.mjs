// A real OpenID provider (the certified `oidc-provider` package) on loopback, for the console's sign-in tests.
// Usage: node provider.mjs <port> <console base URL>. Any password signs an account in (its login page is the
// package's development login page, where the login is the account's subject); the accounts and their groups are below. Prints "ready" when listening.
import Provider from 'oidc-provider';

const [port, consoleUrl] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

const ACCOUNTS = {
  'ada-sub-001': { email: 'ada@example.com', groups: ['refund-admins'] },
  'bob-sub-002': { email: 'bob@example.com', groups: ['staff', 'refund-approvers'] },
  'vic-sub-003': { email: 'vic@example.com', groups: ['refund-viewers'] },
  'nina-sub-004': { email: 'nina@example.com', groups: ['marketing'] },
};

const configuration = {
  clients: [{
    client_id: 'refund-console',
    client_secret: 'refund-console-test-secret',
    redirect_uris: [`${consoleUrl}/console/auth/callback`],
    post_logout_redirect_uris: [`${consoleUrl}/console/login`],
    response_types: ['code'],
    grant_types: ['authorization_code'],
  }],
  pkce: { required: () => true },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
  conformIdTokenClaims: false, // the scopes' claims go into the ID token, as Okta/Entra put groups there
  features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  ttl: { AuthorizationCode: 60, Session: 3600, Interaction: 600, Grant: 3600, AccessToken: 600, IdToken: 600 },
  cookies: { keys: ['refund-console-test-provider-cookie-key'] },
  async findAccount(ctx, id) {
    if (!ACCOUNTS[id]) return undefined; // the login typed is the account's subject
    const sub = id;
    const { email, groups } = ACCOUNTS[sub];
    return { accountId: sub, claims: async () => ({ sub, email, email_verified: true, groups }) };
  },
  // A first-party client: no consent screen (the grant covers what the console asks for).
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email groups');
    await grant.save();
    return grant;
  },
};

const provider = new Provider(issuer, configuration);
provider.on('end_session.success', () => console.log('end_session'));
provider.on('server_error', (ctx, err) => console.error('server_error', err));
provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));

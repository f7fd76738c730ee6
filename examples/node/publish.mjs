// Send a message to a robot-lab robot from Node.js and wait for its reply.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node examples/node/publish.mjs billing "My invoice is wrong"
//   node examples/node/publish.mjs billing "My invoice is wrong" --dry-run   # print the envelope only
//
// The envelope follows `robot-lab schema robot-message`. It goes on the robot's inbox stream
// as the field `envelope` (XADD <prefix>:bus:<robot> * envelope <json>); the reply is appended
// to the stream <prefix>:bus:<reply_to>, read here with XREAD BLOCK.
//
// Signed envelopes (docs/security.md): set ROBOT_LAB_FROM to a sender name and ROBOT_LAB_KEY
// (+ ROBOT_LAB_KEY_ID, default k1) to that sender's key as configured on the workers, e.g.
//   ROBOT_LAB_FROM=frontdesk ROBOT_LAB_KEY_ID=k1 ROBOT_LAB_KEY=$KEY node examples/node/publish.mjs billing "hi"
//
// No npm package needed: a few lines below speak Redis's protocol (RESP) over node:net. With
// the `redis` package the two calls are
//   await client.xAdd(`${prefix}:bus:${to}`, '*', { envelope: JSON.stringify(envelope) });
//   await client.xRead({ key: `${prefix}:bus:${me}`, id: '0-0' }, { BLOCK: 30000 });

import net from 'node:net';
import { createHmac, randomUUID } from 'node:crypto';

const args = process.argv.slice(2).filter((a) => a !== '--dry-run');
const dryRun = process.argv.includes('--dry-run');
const [to = 'billing', text = 'My invoice is wrong'] = args;
const prefix = process.env.ROBOT_LAB_KEY_PREFIX ?? 'robot_lab';
// our name and reply inbox (a robot replies only to the sender's own inbox)
const me = process.env.ROBOT_LAB_FROM ?? `node-${randomUUID().slice(0, 8)}`;

const envelope = {
  v: 1,
  id: randomUUID(),
  to,
  from: me,
  reply_to: me,
  conversation_id: 'ticket-42',
  created_at: new Date().toISOString(),
  deadline: new Date(Date.now() + 60_000).toISOString(), // not handled after a minute
  content: text,
};

// The canonical form robot-lab signs (RFC 8785 JCS): members sorted, no whitespace. JSON.stringify
// already writes strings and numbers the JCS way.
const canonical = (v) => (v === null || typeof v !== 'object' ? JSON.stringify(v)
  : Array.isArray(v) ? `[${v.map(canonical).join(',')}]`
  : `{${Object.keys(v).filter((k) => v[k] !== undefined).sort()
    .map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`);

if (process.env.ROBOT_LAB_KEY) {
  envelope.headers = { key_id: process.env.ROBOT_LAB_KEY_ID ?? 'k1' }; // signed too
  envelope.signature = createHmac('sha256', process.env.ROBOT_LAB_KEY).update(canonical(envelope), 'utf8')
    .digest('hex');
}

if (dryRun) {
  console.log(JSON.stringify(envelope));
  process.exit(0);
}

// --- a minimal RESP client ------------------------------------------------------------
function parse(buf, pos) {
  const eol = buf.indexOf('\r\n', pos);
  if (eol < 0) return null;
  const type = String.fromCharCode(buf[pos]);
  const line = buf.toString('utf8', pos + 1, eol);
  let next = eol + 2;
  if (type === '+') return { value: line, end: next };
  if (type === '-') return { value: new Error(line), end: next };
  if (type === ':') return { value: Number(line), end: next };
  const n = Number(line);
  if (n < 0) return { value: null, end: next };
  if (type === '$') {
    if (buf.length < next + n + 2) return null;
    return { value: buf.toString('utf8', next, next + n), end: next + n + 2 };
  }
  const items = []; // '*': an array
  for (let i = 0; i < n; i += 1) {
    const item = parse(buf, next);
    if (!item) return null;
    items.push(item.value);
    next = item.end;
  }
  return { value: items, end: next };
}

function connect(url) {
  const socket = net.createConnection({ host: url.hostname || '127.0.0.1', port: Number(url.port || 6379) });
  let buffer = Buffer.alloc(0);
  const waiting = [];
  socket.on('data', (data) => {
    buffer = Buffer.concat([buffer, data]);
    while (waiting.length) {
      const reply = parse(buffer, 0);
      if (!reply) return;
      buffer = buffer.subarray(reply.end);
      const { resolve, reject } = waiting.shift();
      if (reply.value instanceof Error) reject(reply.value);
      else resolve(reply.value);
    }
  });
  socket.on('error', (err) => { while (waiting.length) waiting.shift().reject(err); });
  return {
    command(...words) {
      const parts = [`*${words.length}\r\n`];
      for (const word of words) {
        const bytes = Buffer.from(String(word));
        parts.push(`$${bytes.length}\r\n`, bytes, '\r\n');
      }
      socket.write(Buffer.concat(parts.map((p) => (Buffer.isBuffer(p) ? p : Buffer.from(p)))));
      return new Promise((resolve, reject) => waiting.push({ resolve, reject }));
    },
    close: () => socket.end(),
  };
}

// --- publish and wait -----------------------------------------------------------------
const url = new URL(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0');
const redis = connect(url);
try {
  if (url.password) {
    const user = decodeURIComponent(url.username);
    const password = decodeURIComponent(url.password);
    await (user ? redis.command('AUTH', user, password) : redis.command('AUTH', password));
  }
  const db = url.pathname.replace('/', '');
  if (db && db !== '0') await redis.command('SELECT', db);

  const entry = await redis.command('XADD', `${prefix}:bus:${to}`, '*', 'envelope', JSON.stringify(envelope));
  console.error(`sent ${envelope.id} to ${to} (entry ${entry}); waiting for the reply on ${prefix}:bus:${me}`);

  let cursor = '0-0';
  for (;;) {
    const answer = await redis.command('XREAD', 'BLOCK', '30000', 'STREAMS', `${prefix}:bus:${me}`, cursor);
    if (answer === null) throw new Error(`no reply from ${to} within 30 s: is a worker serving it?`);
    for (const [, entries] of answer) {
      for (const [id, fields] of entries) {
        cursor = id;
        const reply = JSON.parse(fields[fields.indexOf('envelope') + 1]);
        if (reply.in_reply_to !== envelope.id) continue;
        console.log(JSON.stringify(reply));
        process.exitCode = reply.kind === 'error' ? 1 : 0;
        redis.close();
        process.exit();
      }
    }
  }
} catch (err) {
  console.error(`error: ${err.message}`);
  redis.close();
  process.exit(1);
}

// tests/e2e/lib/raw.mjs — raw TCP HTTP/1.1 exchanges (node:net) for the bad-input suite: exact bytes out, parsed responses back.
import net from 'node:net';

export function hostPort(url) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port) };
}

/* Parses as many complete HTTP/1.1 responses as buf holds. A response without
 * Content-Length or chunked framing runs to the connection's close (complete
 * only when closed is true). Returns {responses, rest, partialStatus}. */
export function parseResponses(buf, closed) {
  const responses = [];
  let off = 0;
  let partialStatus = null;
  for (;;) {
    const headEnd = buf.indexOf('\r\n\r\n', off);
    if (headEnd < 0) {
      const line = buf.subarray(off, Math.min(buf.length, off + 200)).toString('latin1').split('\r\n')[0];
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(line);
      if (m) partialStatus = Number(m[1]);
      break;
    }
    const head = buf.subarray(off, headEnd).toString('latin1');
    const [statusLine, ...lines] = head.split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(statusLine);
    if (!m) throw new Error(`not an HTTP response: ${JSON.stringify(statusLine.slice(0, 200))}`);
    const headers = {};
    for (const l of lines) {
      const i = l.indexOf(':');
      if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    const status = Number(m[1]);
    let bodyStart = headEnd + 4;
    let body;
    let end;
    if (status === 204 || status === 304 || (status >= 100 && status < 200)) {
      body = Buffer.alloc(0);
      end = bodyStart;
    } else if (/chunked/i.test(headers['transfer-encoding'] || '')) {
      const parts = [];
      let p = bodyStart;
      let done = false;
      for (;;) {
        const le = buf.indexOf('\r\n', p);
        if (le < 0) break;
        const size = parseInt(buf.subarray(p, le).toString('latin1'), 16);
        if (Number.isNaN(size)) throw new Error('bad chunk size');
        if (size === 0) {
          const te = buf.indexOf('\r\n\r\n', le);
          const simple = buf.subarray(le, le + 4).toString('latin1') === '\r\n\r\n';
          if (simple) { p = le + 4; done = true; } else if (te >= 0) { p = te + 4; done = true; }
          break;
        }
        if (buf.length < le + 2 + size + 2) break;
        parts.push(buf.subarray(le + 2, le + 2 + size));
        p = le + 2 + size + 2;
      }
      if (!done) {
        partialStatus = status;
        if (closed) responses.push({ status, headers, body: Buffer.concat(parts), truncated: true });
        break;
      }
      body = Buffer.concat(parts);
      end = p;
    } else if (headers['content-length'] !== undefined) {
      const len = Number(headers['content-length']);
      if (buf.length < bodyStart + len) {
        partialStatus = status;
        if (closed) responses.push({ status, headers, body: buf.subarray(bodyStart), truncated: true });
        break;
      }
      body = buf.subarray(bodyStart, bodyStart + len);
      end = bodyStart + len;
    } else {
      if (!closed) { partialStatus = status; break; }
      body = buf.subarray(bodyStart);
      end = buf.length;
    }
    responses.push({ status, headers, body });
    off = end;
    if (off >= buf.length) break;
  }
  return { responses, rest: buf.subarray(off), partialStatus };
}

/* Connects, writes each piece of `send` (Buffers/strings; a number is a pause in ms),
 * optionally half-closes, and collects until the server closes, `want` responses are
 * complete, or timeoutMs passes. Resolves {responses, closed, timedOut, error, bytes,
 * firstStatus, writeError}. */
export function exchange(url, send, { timeoutMs = 10000, halfClose = false, want = 1, onSocket } = {}) {
  const { host, port } = hostPort(url);
  return new Promise((resolve) => {
    const sock = net.connect({ host, port });
    let bytes = Buffer.alloc(0);
    let closed = false;
    let error = null;
    let writeError = null;
    let finished = false;
    const finish = (timedOut) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      let parsed;
      try {
        parsed = parseResponses(bytes, closed);
      } catch (e) {
        parsed = { responses: [], partialStatus: null, parseError: String(e) };
      }
      const firstStatus = parsed.responses[0]?.status ?? parsed.partialStatus ?? null;
      sock.destroy();
      resolve({ responses: parsed.responses, parseError: parsed.parseError, closed, timedOut, error, writeError, bytes, firstStatus });
    };
    const timer = setTimeout(() => finish(true), timeoutMs);
    sock.on('data', (d) => {
      bytes = Buffer.concat([bytes, d]);
      try {
        if (parseResponses(bytes, false).responses.length >= want) finish(false);
      } catch {
        /* garbage so far; wait for close */
      }
    });
    sock.on('error', (e) => {
      error = e.code || String(e);
    });
    sock.on('close', () => {
      closed = true;
      finish(false);
    });
    if (onSocket) onSocket(sock);
    sock.on('connect', async () => {
      for (const piece of send) {
        if (finished || closed) break;
        if (typeof piece === 'number') {
          await new Promise((r) => setTimeout(r, piece));
          continue;
        }
        await new Promise((r) => {
          sock.write(piece, (e) => {
            if (e) writeError = e.code || String(e);
            r();
          });
        });
      }
      if (halfClose && !finished && !closed) sock.end();
    });
  });
}

/* A request's bytes: method, target, headers (object or list of raw lines), body (Buffer/string). */
export function request(method, target, { headers = {}, body, raw = [] } = {}) {
  const lines = [`${method} ${target} HTTP/1.1`, 'Host: 127.0.0.1'];
  let hasLength = false;
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === 'content-length' || k.toLowerCase() === 'transfer-encoding') hasLength = true;
    lines.push(`${k}: ${v}`);
  }
  const b = body === undefined ? null : Buffer.isBuffer(body) ? body : Buffer.from(body);
  if (b && !hasLength) lines.push(`Content-Length: ${b.length}`);
  const head = Buffer.concat([Buffer.from(lines.join('\r\n') + '\r\n', 'latin1'), ...raw.map((r) => Buffer.concat([Buffer.isBuffer(r) ? r : Buffer.from(r, 'latin1'), Buffer.from('\r\n')])), Buffer.from('\r\n')]);
  return b ? Buffer.concat([head, b]) : head;
}

export function jsonBody(res) {
  try {
    return JSON.parse(res.body.toString('utf8'));
  } catch {
    return null;
  }
}

/* True when body is an OpenAI error object {"error":{"message":string,"type":string,...}}. */
export function isErrorObject(obj) {
  return !!obj && typeof obj.error === 'object' && obj.error !== null && typeof obj.error.message === 'string' && typeof obj.error.type === 'string' && 'param' in obj.error && 'code' in obj.error;
}

/* A one-line description of an exchange's outcome, for failure messages. */
export function describe(res) {
  const r0 = res.responses[0];
  const body = r0 ? r0.body.toString('utf8').slice(0, 300) : '';
  return `responses=${res.responses.length} status=${res.firstStatus} closed=${res.closed} timedOut=${res.timedOut} error=${res.error} writeError=${res.writeError} body=${JSON.stringify(body)}`;
}

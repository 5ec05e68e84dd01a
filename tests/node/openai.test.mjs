// tests/node/openai.test.mjs — Dolphin through the official `openai` Node
// package, as applications use it: completions and chat completions,
// streamed and not, n > 1, stop, logprobs, seeds, and the SDK's error
// classes for 400, 401, 404 and 429. Run with `node --test tests/node/`.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import OpenAI, {
  AuthenticationError, BadRequestError, NotFoundError, RateLimitError,
} from 'openai';

import { missing, startServer } from './dolphind.mjs';

const MODEL = 'stories260K';
const API_KEY = 'node-test-key-0123456789';
const skip = missing(MODEL);

describe('openai SDK against dolphind', { skip: skip ?? false }, () => {
  let srv;      // stories260K, no API keys
  let small;    // stories260K, an API key, one sequence at a time, a queue of one
  let client;

  before(async () => {
    srv = await startServer(MODEL);
    small = await startServer(MODEL, ['--api-key', API_KEY, '--max-batch-size', '1',
      '--max-queue', '1', '--batch-window-ms', '0']);
    client = new OpenAI({ baseURL: srv.baseURL, apiKey: 'unused', maxRetries: 0 });
  });

  after(async () => {
    await srv?.stop();
    await small?.stop();
  });

  test('models: list and retrieve', async () => {
    const list = await client.models.list();
    assert.deepEqual(list.data.map((m) => m.id), [MODEL]);
    const m = await client.models.retrieve(MODEL);
    assert.equal(m.id, MODEL);
    assert.equal(m.object, 'model');
  });

  test('completions: whole and streamed agree', async () => {
    const params = { model: MODEL, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
    const whole = await client.completions.create(params);
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.choices.length, 1);
    assert.ok(whole.choices[0].text.length > 0);
    assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
    assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

    const stream = await client.completions.create({
      ...params, stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let usage = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) text += c.text;
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, whole.choices[0].text);
    assert.deepEqual(usage, whole.usage);
  });

  test('completions: n = 3 sampled, indexes and seed', async () => {
    const params = {
      model: MODEL, prompt: 'Once upon a time', max_tokens: 16, temperature: 1, n: 3, seed: 7,
    };
    const a = await client.completions.create(params);
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    assert.ok(new Set(a.choices.map((c) => c.text)).size > 1);
    const b = await client.completions.create(params);
    assert.deepEqual(b.choices.map((c) => c.text), a.choices.map((c) => c.text));
    const texts = ['', '', ''];
    for await (const chunk of await client.completions.create({ ...params, stream: true })) {
      for (const c of chunk.choices) texts[c.index] += c.text;
    }
    assert.deepEqual(texts, a.choices.map((c) => c.text));
  });

  test('completions: several prompts', async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: ['The cat', 'Lily and Tom'], n: 2, max_tokens: 8, temperature: 0,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.equal(r.choices[0].text, r.choices[1].text);
    assert.equal(r.choices[2].text, r.choices[3].text);
  });

  test('completions: stop strings cut exactly, also streamed', async () => {
    const base = { model: MODEL, prompt: 'Once upon a time', max_tokens: 48, temperature: 0 };
    const full = (await client.completions.create(base)).choices[0].text;
    const stop = full.slice(10, 14);
    const cut = full.indexOf(stop);
    const r = await client.completions.create({ ...base, stop: [stop, 'zzz'] });
    assert.equal(r.choices[0].text, full.slice(0, cut));
    assert.equal(r.choices[0].finish_reason, 'stop');
    let text = '';
    for await (const chunk of await client.completions.create({ ...base, stop, stream: true })) {
      for (const c of chunk.choices) text += c.text;
    }
    assert.equal(text, full.slice(0, cut));
  });

  test('completions: logprobs and echo', async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: 'The cat', max_tokens: 5, temperature: 0, logprobs: 2,
      echo: true, ignore_eos: true,
    });
    const lp = r.choices[0].logprobs;
    const n = r.usage.prompt_tokens + 5;
    for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) {
      assert.equal(lp[key].length, n, key);
    }
    assert.equal(lp.token_logprobs[0], null);
    assert.ok(lp.token_logprobs.slice(1).every((v) => v <= 0));
    assert.ok(lp.top_logprobs.slice(1).every((t) => Object.keys(t).length === 2));
    assert.ok(r.choices[0].text.startsWith('The cat'));
  });

  test('chat: system prompt, whole and streamed agree', async () => {
    const params = {
      model: MODEL,
      messages: [{ role: 'system', content: 'Tell a story.' },
        { role: 'user', content: 'Once upon a time' }],
      max_tokens: 24,
      temperature: 0,
    };
    const whole = await client.chat.completions.create(params);
    assert.equal(whole.object, 'chat.completion');
    assert.ok(whole.id.startsWith('chatcmpl-'));
    assert.equal(whole.choices[0].message.role, 'assistant');
    assert.ok(whole.choices[0].message.content.length > 0);

    const stream = await client.chat.completions.create({
      ...params, stream: true, stream_options: { include_usage: true },
    });
    let content = '';
    let first = null;
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      for (const c of chunk.choices) {
        if (first === null) first = c.delta;
        content += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(first.role, 'assistant');
    assert.equal(content, whole.choices[0].message.content);
    assert.equal(finish, whole.choices[0].finish_reason);
    // the same counts; the streamed request came second, so the prompt's
    // whole 16-token blocks (all but its last token) came from the prefix cache
    const { prompt_tokens_details: details, ...counts } = usage;
    const { prompt_tokens_details: _, ...wholeCounts } = whole.usage;
    assert.deepEqual(counts, wholeCounts);
    assert.equal(details.cached_tokens, Math.floor((usage.prompt_tokens - 1) / 16) * 16);
  });

  test('chat: n = 2, stop, logprobs', async () => {
    const messages = [{ role: 'user', content: 'Once upon a time' }];
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 12, temperature: 1, n: 2, seed: 3,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    const full = (await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 32, temperature: 0,
    })).choices[0].message.content;
    const stop = full.slice(6, 9);
    const s = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 32, temperature: 0, stop,
    });
    assert.equal(s.choices[0].message.content, full.slice(0, full.indexOf(stop)));
    assert.equal(s.choices[0].finish_reason, 'stop');
    const l = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
      ignore_eos: true,
    });
    const content = l.choices[0].logprobs.content;
    assert.equal(content.length, 4);
    assert.equal(content.map((t) => t.token).join(''), l.choices[0].message.content);
    for (const t of content) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 2);
      assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
    }
  });

  test('errors: 400 is BadRequestError', async () => {
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: 'x', temperature: 5 }),
      (e) => e instanceof BadRequestError && e.status === 400 && e.param === 'temperature',
    );
    await assert.rejects(
      client.chat.completions.create({
        model: MODEL, messages: [{ role: 'assistant', content: 'x' }],
      }),
      (e) => e instanceof BadRequestError && e.param === 'messages',
    );
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: 'x', suffix: 'y' }),
      (e) => e instanceof BadRequestError && e.param === 'suffix',
    );
    // also for a stream: validated before any event
    await assert.rejects(
      client.chat.completions.create({
        model: MODEL, messages: [{ role: 'user', content: 'x' }], stream: true, top_logprobs: 9,
        logprobs: true,
      }),
      (e) => e instanceof BadRequestError && e.param === 'top_logprobs',
    );
  });

  test('errors: 404 is NotFoundError', async () => {
    await assert.rejects(
      client.completions.create({ model: 'gpt-4', prompt: 'x' }),
      (e) => e instanceof NotFoundError && e.status === 404 && e.code === 'model_not_found',
    );
    await assert.rejects(client.models.retrieve('gpt-4'), NotFoundError);
  });

  test('errors: 401 is AuthenticationError', async () => {
    const bad = new OpenAI({ baseURL: small.baseURL, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(
      bad.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof AuthenticationError && e.status === 401,
    );
    const good = new OpenAI({ baseURL: small.baseURL, apiKey: API_KEY, maxRetries: 0 });
    const r = await good.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2 });
    assert.equal(r.choices.length, 1);
  });

  test('errors: 429 is RateLimitError', async () => {
    const c = new OpenAI({ baseURL: small.baseURL, apiKey: API_KEY, maxRetries: 0 });
    // one runs, one waits, the rest find the queue full
    const results = await Promise.allSettled(Array.from({ length: 8 }, () => c.completions.create({
      model: MODEL, prompt: 'Once upon a time', max_tokens: 300, ignore_eos: true,
    })));
    const limited = results.filter((r) => r.status === 'rejected');
    assert.ok(limited.length >= 1, 'no request was refused');
    for (const r of limited) {
      assert.ok(r.reason instanceof RateLimitError, String(r.reason));
      assert.equal(r.reason.status, 429);
      assert.ok(r.reason.headers.get('retry-after'));
    }
    assert.ok(results.some((r) => r.status === 'fulfilled'));
  });
});

// Streams through fleet's router with the official SDKs and prints what each
// client saw as one JSON object: the text, the usage and the model name.
// Run by cmd/fleet/sdk_e2e_test.go with FLEET_BASE, FLEET_KEY, FLEET_MODEL.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const base = process.env.FLEET_BASE;
const apiKey = process.env.FLEET_KEY;
const model = process.env.FLEET_MODEL;
const maxTokens = 24;
const out = {};

async function step(name, fn) {
  try {
    out[name] = await fn();
  } catch (err) {
    out[name] = { error: `${err.constructor.name}: ${err.message}`, status: err.status ?? null };
  }
}

// Anthropic: the SDK sends the key as x-api-key.
const anthropic = new Anthropic({ baseURL: base, apiKey, maxRetries: 0 });
await step("anthropic_stream", async () => {
  const s = anthropic.messages.stream({
    model, max_tokens: maxTokens,
    system: "You are terse.",
    messages: [{ role: "user", content: "Describe a homelab fleet." }],
  });
  let text = "";
  const events = [];
  s.on("text", (t) => { text += t; });
  s.on("streamEvent", (e) => { if (events.at(-1) !== e.type) events.push(e.type); });
  const msg = await s.finalMessage();
  return { text, events, model: msg.model, stop_reason: msg.stop_reason, usage: msg.usage };
});
await step("anthropic_error", async () => {
  try {
    await anthropic.messages.create({ model: "no-such-model", max_tokens: 4, messages: [{ role: "user", content: "hi" }] });
    return { error: "no error" };
  } catch (err) {
    return { status: err.status, type: err.error?.type, error_type: err.error?.error?.type, message: err.error?.error?.message };
  }
});

// OpenAI: the SDK sends Authorization: Bearer.
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });
await step("openai_chat_stream", async () => {
  const stream = await openai.chat.completions.create({
    model, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true },
    messages: [{ role: "user", content: "Describe a homelab fleet." }],
  });
  let text = "", usage = null, seen = null;
  for await (const chunk of stream) {
    seen = chunk.model;
    text += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, model: seen, usage };
});
// n > 1: only the vLLM worker returns several choices; the router sends it there.
await step("openai_chat_n", async () => {
  const res = await openai.chat.completions.create({
    model, max_tokens: 8, n: 2, messages: [{ role: "user", content: "Name a fleet." }],
  });
  return { choices: res.choices.length, model: res.model, usage: res.usage };
});
await step("openai_responses_stream", async () => {
  const stream = await openai.responses.create({
    model, max_output_tokens: maxTokens, stream: true,
    instructions: "You are terse.", input: "Describe a homelab fleet.",
  });
  let text = "", final = null;
  const events = [];
  for await (const ev of stream) {
    if (events.at(-1) !== ev.type) events.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
  }
  return { text, events, model: final?.model, usage: final?.usage, output_text: final?.output?.[0]?.content?.[0]?.text };
});

console.log(JSON.stringify(out));

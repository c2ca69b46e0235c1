// Streams each of fleet's repair cases through the router with the official
// Anthropic SDK's messages.stream and prints, per case, the message the SDK
// put together (or its error) as one JSON object.
// Run by cmd/fleet/sdk_repair_e2e_test.go with FLEET_BASE, FLEET_CASES.
import Anthropic from "@anthropic-ai/sdk";

const anthropic = new Anthropic({ baseURL: process.env.FLEET_BASE, apiKey: "none", maxRetries: 0 });
const out = {};
for (const name of process.env.FLEET_CASES.split(",")) {
  try {
    const s = anthropic.messages.stream({
      model: "qwen3", max_tokens: 16,
      messages: [{ role: "user", content: `case:${name}` }],
    });
    let text = "";
    s.on("text", (t) => { text += t; });
    const msg = await s.finalMessage();
    out[name] = {
      text, type: msg.type ?? null, role: msg.role ?? null, model: msg.model ?? null,
      content: msg.content.map((b) => ({ type: b.type, input: b.input ?? null })),
    };
  } catch (err) {
    out[name] = { error: `${err.constructor.name}: ${err.message}` };
  }
}
console.log(JSON.stringify(out));

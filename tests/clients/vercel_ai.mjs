// The Vercel AI SDK against a lanes sidecar: one tool loop per wire API, printed as JSON lines.
// Usage: node vercel_ai.mjs http://127.0.0.1:PORT   (run by test_vercel_ai.py)
import { generateText, streamText, tool, stepCountIs } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { z } from "zod";

const base = process.argv[2];
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });
const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: "unused" });
const calls = [];
const tools = {
  get_weather: tool({
    description: "The weather in a city.",
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      calls.push(city);
      return "sunny, 21 degrees";
    },
  }),
};
const models = {
  responses: openai("auto"),
  chat: openai.chat("auto"),
  messages: anthropic("claude-sonnet-4-6"),
};
for (const [wire, model] of Object.entries(models)) {
  for (const mode of ["generate", "stream"]) {
    calls.length = 0;
    const options = { model, tools, stopWhen: stepCountIs(4), prompt: "Weather in Paris?", maxRetries: 0 };
    try {
      let text, steps;
      if (mode === "generate") {
        ({ text, steps } = await generateText(options));
      } else {
        const result = streamText(options);
        text = await result.text;
        steps = await result.steps;
      }
      console.log(JSON.stringify({ wire, mode, ok: true, text, steps: steps.length, calls: [...calls] }));
    } catch (error) {
      console.log(JSON.stringify({ wire, mode, ok: false, error: String(error).slice(0, 500) }));
    }
  }
}

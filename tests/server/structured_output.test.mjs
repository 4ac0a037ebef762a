// Structured output through `specula serve` with the official OpenAI SDK: response_format
// json_schema and json_object, and SGLang's / vLLM's regex, ebnf and guided_json fields. Sampled
// documents validate with ajv (the real validator of tests/grammar/js); greedy outputs equal
// `specula generate` with the same constraint, with and without EAGLE-3 speculation.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import Ajv2020 from "../grammar/js/node_modules/ajv/dist/2020.js";
import addFormats from "../grammar/js/node_modules/ajv-formats/dist/index.js";
import { startServer, offline, post } from "./harness.mjs";

const MODEL = "specula-byte-6m";
const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 16 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 3 },
    email: { type: ["string", "null"], format: "email" },
  },
  required: ["name", "age"],
  additionalProperties: false,
};
const ajv = new Ajv2020({ strict: false, allErrors: true });
(addFormats.default ?? addFormats)(ajv);
const validate = ajv.compile(SCHEMA);

let server, client;
before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused" });
});
after(async () => {
  assert.equal((await server.stop()).code, 0);
});

test("chat with response_format json_schema: sampled choices are valid documents of the schema", async () => {
  const r = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "Describe a person." }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema: SCHEMA, strict: true } },
    temperature: 1,
    n: 6,
    seed: 7,
    max_tokens: 400,
  });
  let finished = 0;
  for (const c of r.choices) {
    if (c.finish_reason !== "stop") continue;
    finished++;
    const doc = JSON.parse(c.message.content);
    assert.ok(validate(doc), `${c.message.content}: ${ajv.errorsText(validate.errors)}`);
    // Properties come in the schema's order.
    const keys = Object.keys(doc);
    assert.deepEqual(keys, Object.keys(SCHEMA.properties).filter((k) => keys.includes(k)));
  }
  assert.ok(finished >= 3, `${finished} of 6 choices finished`);
});

test("greedy outputs equal specula generate with the same constraint; regex, ebnf and json_object too", async () => {
  const prompt = "The quick brown fox";
  const cases = [
    [{ response_format: { type: "json_schema", json_schema: { name: "p", schema: SCHEMA } } }, ["--json-schema", JSON.stringify(SCHEMA)]],
    [{ regex: "(the|a) [a-z]{2,8}( [a-z]{1,8}){1,5}\\." }, ["--regex", "(the|a) [a-z]{2,8}( [a-z]{1,8}){1,5}\\."]],
    [{ ebnf: 'root ::= "[" item ("," item){0,3} "]"\nitem ::= [0-9]{1,3}\n' }, ["--grammar", 'root ::= "[" item ("," item){0,3} "]"\nitem ::= [0-9]{1,3}\n']],
    [{ guided_json: SCHEMA }, ["--json-schema", JSON.stringify(SCHEMA)]],
    [{ response_format: { type: "json_object" } }, ["--json-object"]],
  ];
  for (const [fields, flags] of cases) {
    const [reference] = await offline([prompt], 200, ["--temperature", "0", ...flags]);
    const r = await post(server.url, "/v1/completions", { model: MODEL, prompt, max_tokens: 200, temperature: 0, ...fields });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].text, reference.text, JSON.stringify(fields));
    assert.equal(r.json.choices[0].finish_reason, reference.finish_reason);
    // Streamed, the same text.
    const stream = await client.completions.create({ model: MODEL, prompt, max_tokens: 200, temperature: 0, stream: true, ...fields });
    let text = "";
    for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
    assert.equal(text, reference.text);
  }
  const obj = await client.chat.completions.create({
    model: MODEL, messages: [{ role: "user", content: "JSON please" }], response_format: { type: "json_object" }, temperature: 0, max_tokens: 300,
  });
  if (obj.choices[0].finish_reason === "stop") assert.equal(typeof JSON.parse(obj.choices[0].message.content), "object");
});

test("bad formats are 400s naming the problem, and the server keeps serving", async () => {
  const body = { model: MODEL, prompt: "a", max_tokens: 4 };
  const cases = [
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", properties: { a: { not: {} } } } } } }, "'not' is not supported"],
    [{ response_format: { type: "json_schema" } }, "json_schema' is missing"],
    [{ response_format: { type: "yaml" } }, "supported: text, json_object, json_schema"],
    [{ regex: "a(?=b)" }, "regex: position"],
    [{ ebnf: "root ::= item\n" }, "'item' is used but never defined"],
    [{ regex: "a", ebnf: 'root ::= "a"' }, "both constrain the output"],
    [{ guided_json: 5 }, "must be a JSON Schema"],
    [{ guided_choice: ["yes", "no"] }, "'guided_choice' is not supported"],
  ];
  for (const [fields, fragment] of cases) {
    const r = await post(server.url, "/v1/completions", { ...body, ...fields });
    assert.equal(r.status, 400, `${JSON.stringify(fields)}: ${r.text}`);
    assert.ok(r.json.error.message.includes(fragment), `'${r.json.error.message}' lacks '${fragment}'`);
  }
  const ok = await post(server.url, "/v1/completions", body);
  assert.equal(ok.status, 200);
});

test("with EAGLE-3 speculation, constrained greedy outputs are unchanged", async () => {
  const spec = await startServer(["--speculative-algorithm", "EAGLE3"]);
  try {
    for (const fields of [{ response_format: { type: "json_schema", json_schema: { name: "p", schema: SCHEMA } } }, { regex: "[a-z ]{10,60}\\." }]) {
      const body = { model: MODEL, prompt: "Once upon a time", max_tokens: 200, temperature: 0, ...fields };
      const a = await post(server.url, "/v1/completions", body);
      const b = await post(spec.url, "/v1/completions", body);
      assert.equal(b.status, 200, b.text);
      assert.equal(b.json.choices[0].text, a.json.choices[0].text);
    }
  } finally {
    assert.equal((await spec.stop()).code, 0);
  }
});

// Validates documents produced by the grammar-constrained JSON generator
// against the JSON Schemas they were generated from, using ajv as an
// independent reference implementation of draft 2020-12.
//
//   node validate.mjs <schemas.jsonl> <documents.jsonl>
//   node validate.mjs --check-schemas <schemas.jsonl>
//
// schemas.jsonl:   one {"name": ..., "schema": ...} per line.
// documents.jsonl: one {"schema": <0-based schema line>, "text": <document>} per line.
// Exit: 0 all valid, 1 failures (or schemas failing to compile with
// --check-schemas), 2 usage error or a schema ajv cannot compile.
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

function usage(msg) {
  if (msg) console.error(msg);
  console.error("usage: node validate.mjs <schemas.jsonl> <documents.jsonl>\n" +
                "       node validate.mjs --check-schemas <schemas.jsonl>");
  process.exit(2);
}

// Trim the trailing newline so line i is exactly the i-th record; a blank or
// malformed line anywhere else is an error rather than a silent index shift.
function readJsonl(path) {
  let text;
  try { text = readFileSync(path, "utf8"); } catch (e) { usage(`cannot read ${path}: ${e.message}`); }
  text = text.replace(/\s+$/, "");
  return text === "" ? [] : text.split("\n");
}

// A fresh Ajv per schema: schemas may carry $id values (or reuse them), and
// one shared instance would reject the second schema with a duplicate id.
function compile(schema) {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  return ajv.compile(schema);
}

function loadSchemas(path) {
  const out = [];  // {name, validate} or {name, error}
  readJsonl(path).forEach((line, i) => {
    let rec;
    try { rec = JSON.parse(line); } catch (e) { usage(`${path}:${i + 1}: bad JSON: ${e.message}`); }
    const name = rec.name ?? `#${i}`;
    try { out.push({ name, validate: compile(rec.schema) }); }
    catch (e) { out.push({ name, error: e.message }); }
  });
  return out;
}

const args = process.argv.slice(2);
if (args.length !== 2) usage();

if (args[0] === "--check-schemas") {
  const schemas = loadSchemas(args[1]);
  const bad = schemas.filter((s) => s.error);
  for (const s of bad) console.log(`SCHEMA ${s.name}: ${s.error}`);
  console.log(`compiled ${schemas.length} schemas, ${bad.length} failed`);
  process.exit(bad.length ? 1 : 0);
}

const schemas = loadSchemas(args[0]);
const bad = schemas.filter((s) => s.error);
if (bad.length) {
  // Without a reference validator the documents cannot be judged at all.
  for (const s of bad) console.error(`SCHEMA ${s.name}: ${s.error}`);
  process.exit(2);
}

let checked = 0, failures = 0;
const covered = new Set();  // schemas that had at least one document
const fail = (name, idx, reason) => { failures++; console.log(`FAIL ${name} ${idx}: ${reason}`); };

readJsonl(args[1]).forEach((line, idx) => {
  checked++;
  let rec;
  try { rec = JSON.parse(line); } catch (e) { return fail("?", idx, `bad documents.jsonl line: ${e.message}`); }
  const s = schemas[rec.schema];
  if (!Number.isInteger(rec.schema) || !s) return fail("?", idx, `no schema with index ${rec.schema}`);
  covered.add(rec.schema);
  if (typeof rec.text !== "string") return fail(s.name, idx, "\"text\" is not a string");
  let doc;
  // The generator must emit well-formed JSON, so a parse error is a failure too.
  try { doc = JSON.parse(rec.text); } catch (e) { return fail(s.name, idx, `invalid JSON: ${e.message}`); }
  if (!s.validate(doc)) {
    const why = s.validate.errors.map((e) => `${e.instancePath || "/"} ${e.message}`).join("; ");
    fail(s.name, idx, `${why} | text: ${rec.text.length > 200 ? rec.text.slice(0, 200) + "..." : rec.text}`);
  }
});

// M counts the schemas the documents actually covered, so a generator that
// silently skipped schemas shows up as fewer than the file holds.
console.log(`checked ${checked} documents of ${covered.size} schemas, ${failures} failures`);
process.exit(failures ? 1 : 0);

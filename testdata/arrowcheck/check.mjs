// Reads Arrow IPC files with the apache-arrow JavaScript package (not
// ucp's Go writer) and prints, per file, its schema and every row as JSON.
// Integers print as decimal strings (int64 needs BigInt), lists as arrays,
// nulls as null. Usage: node check.mjs [--columns=a,b] FILE...
// (--columns prints only those columns of the rows.)
import { readFileSync } from "node:fs";
import { tableFromIPC } from "apache-arrow";

function plain(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "bigint" || typeof v === "number") return String(v);
  if (typeof v === "string" || typeof v === "boolean") return v;
  if (typeof v.toArray === "function") return Array.from(v.toArray(), plain);
  if (ArrayBuffer.isView(v)) return Array.from(v, plain);
  throw new Error(`unexpected value ${v}`);
}

const out = {};
let only = null;
for (const path of process.argv.slice(2)) {
  if (path.startsWith("--columns=")) {
    only = path.slice("--columns=".length).split(",");
    continue;
  }
  const table = tableFromIPC(readFileSync(path));
  const fields = table.schema.fields.map((f) => ({ name: f.name, type: String(f.type), nullable: f.nullable }));
  const rows = [];
  for (let i = 0; i < table.numRows; i++) {
    const row = {};
    for (const f of table.schema.fields) {
      if (only === null || only.includes(f.name)) row[f.name] = plain(table.getChild(f.name).get(i));
    }
    rows.push(row);
  }
  out[path] = { numRows: table.numRows, batches: table.batches.length, fields, rows };
}
process.stdout.write(JSON.stringify(out));

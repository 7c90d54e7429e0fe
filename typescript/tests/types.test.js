// tsc --noEmit over the declarations, tests/types-check.ts and examples/ts-agent (tsconfig.json).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";

test("the declarations type-check (tsc --noEmit)", { skip: !existsSync("node_modules/typescript/bin/tsc") }, () => {
  const r = spawnSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});

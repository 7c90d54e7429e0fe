// The JSON rules the library keeps on both sides (docs/typescript.md): what a reply or a document may hold so that
// the worker (jansson) and PostgreSQL (jsonb) read it. Nothing here needs `pg`.

/** How deeply a request or a reply may nest arrays and objects (the worker's reader stops a little deeper). */
export const MAX_DEPTH = 1000;

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** The first lone surrogate of `s` as "U+D800 at position N", or null when `s` is well-formed Unicode text. */
export function loneSurrogate(s) {
  const m = LONE_SURROGATE.exec(s);
  if (!m) return null;
  return `U+${m[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")} at position ${m.index}`;
}

/** A short, printable rendering of any value for a message. */
export function show(value, max = 80) {
  let s;
  try {
    s = typeof value === "string" ? JSON.stringify(value) : typeof value === "bigint" ? `${value}n` : String(value);
  } catch {
    s = `<a ${typeof value}>`;
  }
  return s.length > max ? s.slice(0, max) + "..." : s;
}

/** Thrown by stringify() for a value that cannot become JSON the worker and PostgreSQL read. */
export class JsonError extends Error {
  constructor(message, kind = "json") {
    super(message);
    this.name = "JsonError";
    this.kind = kind; // "json" | "wide" | "nul" | "surrogate" | "deep"
  }
}

function where(key) {
  return key === "" ? "the top" : `key ${JSON.stringify(key)}`;
}

/**
 * Compact JSON text of `value`, refusing what JSON.stringify would silently change or what the readers refuse:
 * NaN and Infinity, functions and symbols, Maps and Sets, integers beyond 64 bits (a Number whose size is from 2^63
 * up to 1e21, which JSON.stringify writes as a plain integer, or a BigInt outside -2^63..2^63-1; a BigInt inside is
 * written exactly), strings (and keys) holding a NUL character or a lone surrogate, and nesting deeper than MAX_DEPTH.
 * `undefined` at the top is null. Throws JsonError saying why.
 */
export function stringify(value) {
  const nonce = `\u0000tw-bigint-${Math.random().toString(36).slice(2)}:`;
  let bigints = 0;
  const replacer = function (key, v) {
    if (typeof key === "string" && key !== "") checkText(key, `a key (${show(key)})`);
    switch (typeof v) {
      case "number":
        if (!Number.isFinite(v)) throw new JsonError(`${v} (at ${where(key)}) is not a JSON number`);
        // JSON.stringify writes these as plain integers, -2^63 itself as -9223372036854776000: beyond 64 bits
        if (Number.isInteger(v) && Math.abs(v) >= 2 ** 63 && Math.abs(v) < 1e21)
          throw new JsonError(wideMessage(String(v), key), "wide");
        return v;
      case "bigint":
        if (v < INT64_MIN || v > INT64_MAX) throw new JsonError(wideMessage(v.toString(), key), "wide");
        bigints++;
        return nonce + v.toString();
      case "string":
        checkText(v, `the string at ${where(key)}`);
        return v;
      case "function":
      case "symbol":
        throw new JsonError(`a ${typeof v} (at ${where(key)}) is not JSON`);
      default:
        if (v instanceof Map || v instanceof Set)
          throw new JsonError(`a ${v.constructor.name} (at ${where(key)}) is not JSON; give an object or an array`);
        return v;
    }
  };
  let text;
  try {
    text = JSON.stringify(value === undefined ? null : value, replacer);
  } catch (e) {
    if (e instanceof JsonError) throw e;
    if (e instanceof RangeError)
      throw new JsonError(`it is nested too deeply for JSON.stringify (${e.message})`, "deep");
    throw new JsonError(`${e && e.name}: ${e && e.message}`);
  }
  if (text === undefined) text = "null";
  if (bigints) {
    const quoted = JSON.stringify(nonce).slice(0, -1); // the opening quote and the escaped nonce
    text = text.split(quoted).map((part, i) => (i === 0 ? part : part.replace(/^(-?[0-9]+)"/, "$1"))).join("");
  }
  const depth = maxDepth(text);
  if (depth > MAX_DEPTH)
    throw new JsonError(`it is nested ${depth} levels deep, more than the ${MAX_DEPTH} the worker reads`, "deep");
  return text;
}

function wideMessage(digits, key) {
  const shown = digits.length <= 40 ? digits : `${digits.slice(0, 20)}...(${digits.length} digits)`;
  return `it holds the integer ${shown} (at ${where(key)}), beyond 64 bits: the worker reads integers from ` +
    `${INT64_MIN} to ${INT64_MAX}; send a larger one as a string`;
}

function checkText(s, what) {
  const nul = s.indexOf("\u0000");
  if (nul >= 0 && !s.startsWith("\u0000tw-bigint-"))
    throw new JsonError(`${what} contains a NUL character (U+0000) at position ${nul}, which neither the worker ` +
      "nor PostgreSQL's jsonb reads", "nul");
  const lone = loneSurrogate(s);
  if (lone) throw new JsonError(`${what} is not valid Unicode text: a lone surrogate (${lone})`, "surrogate");
}

/** The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count). */
export function maxDepth(text) {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92) i++; // a backslash: skip the escaped character
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 91 || c === 123) {
      if (++depth > max) max = depth;
    } else if (c === 93 || c === 125) depth--;
  }
  return max;
}

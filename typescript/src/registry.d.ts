/** code -> [scope, status, retried by default, only turnwatch gives it, meaning] (generated: src/registry.js). */
export declare const ERROR_CODES: Readonly<Record<string, readonly [string, string, boolean, boolean, string]>>;
export declare const NAME_MAX: number;
export declare const DOC_MAX: number;
export declare const TIMEOUT_MAX: number;
export declare const TURN_TIMEOUT_MAX: number;
